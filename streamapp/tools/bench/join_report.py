"""The report of ``streamapp bench join``: per system, backlog drain and live steps summarised,
the maximum sustained rate decided from the steps, a markdown table and one chart. Pure
functions of the measurements, so they test without a broker."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from streamapp.tools.bench.plot import bar_image, line_image, write_png
from streamapp.tools.bench.report import machine, percentile_summary

# A rate is sustained when at least this fraction of its frames came out joined ...
SUSTAINED_JOINED_FRACTION = 0.999
# ... and the lag grew by at most this fraction of the rate per second over the step's last
# two thirds (batching makes the lag jitter by a fraction of a second's input; that is not growth).
LAG_GROWTH_TOLERANCE = 0.05
# The load must have offered the rate: below this fraction of it the step says nothing.
OFFERED_FRACTION = 0.95
# Refined steps stop once the highest rate sustained and the lowest not are this close (pairs/s).
MIN_REFINE_GAP = 50.0
MIB = 1024**2


# --------------------------------------------------------------------------------------------
# backlog


def backlog_summary(raw: dict, joins: bool) -> dict:
    """``raw``: pairs, startup_s, startup_cpu_s, drain_s, cpu_s, broker_cpu_s (None: not measured), pairs_out,
    joined, counters, samples."""
    pairs, drain_s = raw["pairs"], raw["drain_s"]
    pending = [sample["pending_bytes"] for sample in raw["samples"] if sample["pending_bytes"] is not None]
    return {
        "pairs": pairs,
        "published_s": raw["published_s"],
        "startup_s": round(raw["startup_s"], 2),
        "startup_cpu_s": round(raw["startup_cpu_s"], 2),
        "drain_s": round(drain_s, 2),
        "complete": raw["pairs_out"] >= pairs,
        "pairs_out": raw["pairs_out"],
        "pairs_per_s": round(raw["pairs_out"] / drain_s, 1) if drain_s > 0 else None,
        "cpu_s": round(raw["cpu_s"], 2),
        "cpu_s_per_1k_pairs": round(1000 * raw["cpu_s"] / raw["pairs_out"], 3) if raw["pairs_out"] else None,
        "broker_cpu_s_per_1k_pairs": (round(1000 * raw["broker_cpu_s"] / raw["pairs_out"], 3)
                                      if raw.get("broker_cpu_s") is not None and raw["pairs_out"] else None),
        "joined": raw["joined"] if joins else None,
        "joined_fraction": round(raw["joined"] / pairs, 5) if joins else None,
        "frames_out_twice": raw["frames_out_twice"] if joins else None,
        "unmatched": raw["counters"].get("join_unmatched_frames_total"),
        "orphan_results": raw["counters"].get("join_orphan_results_total"),
        "peak_pending_bytes": max(pending) if pending else None,
        "peak_rss_bytes": max((sample["rss_bytes"] for sample in raw["samples"]), default=0),
        "samples": raw["samples"],
    }


# --------------------------------------------------------------------------------------------
# live steps


def lag_slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, lag in pairs): how fast the lag grows, pairs/s."""
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_lag = sum(lag for _, lag in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (lag - mean_lag) for t, lag in points) / spread


def step_summary(raw: dict, joins: bool) -> dict:
    """``raw``: rate, pairs, publish_s, lag (points during publishing), pairs_out, joined,
    latencies_s (steady part of the step), drained."""
    rate, pairs = raw["rate"], raw["pairs"]
    lag = raw["lag"]
    offered = pairs / raw["publish_s"] if raw["publish_s"] > 0 else math.inf
    step = {
        "rate": rate,
        "pairs": pairs,
        "offered_rate": round(offered, 1),
        "lag_growth_pairs_per_s": round(lag_slope(lag[len(lag) // 3:]), 2),
        "peak_lag_pairs": max((value for _, value in lag), default=0),
        "drained": raw["drained"],
        "out_fraction": round(raw["pairs_out"] / pairs, 5),
        "joined_fraction": round(raw["joined"] / pairs, 5) if joins else None,
        "latency_s": percentile_summary(raw["latencies_s"]),
        "cores": {role: round(seconds / raw["publish_s"], 2) for role, seconds in raw["cpu_s"].items()}
        if raw["publish_s"] > 0 else None,
    }
    step["offered"] = offered >= OFFERED_FRACTION * rate
    step["sustained"] = is_sustained(step)
    return step


def is_sustained(step: dict) -> bool:
    """The rate was offered, (nearly) every frame came out joined (copied, for the copy), and
    the lag did not grow."""
    complete = step["joined_fraction"] if step["joined_fraction"] is not None else step["out_fraction"]
    return (step["offered"] and complete >= SUSTAINED_JOINED_FRACTION
            and step["lag_growth_pairs_per_s"] <= LAG_GROWTH_TOLERANCE * step["rate"])


def tries_by_rate(steps: list[dict]) -> dict[float, list[dict]]:
    """Every try of each rate, rates in the order first tried, tries in the order run."""
    tries: dict[float, list[dict]] = {}
    for step in steps:
        tries.setdefault(step["rate"], []).append(step)
    return tries


def rate_outcomes(steps: list[dict]) -> list[dict]:
    """One step per rate tried, lowest rate first: its first sustained try, else its last."""
    return [next((step for step in tries if step["sustained"]), tries[-1])
            for _, tries in sorted(tries_by_rate(steps).items())]


def max_sustained(steps: list[dict]) -> dict:
    """The highest rate of the run of sustained rates from the lowest up (a rate is sustained when
    one of its tries is), and what ended it: ``system`` (a rate not sustained), ``load`` (the load
    could not offer a rate) or ``rates`` (every rate tried was sustained)."""
    best = None
    for step in rate_outcomes(steps):
        if not step["offered"]:
            return {"rate": best, "limited_by": "load"}
        if not step["sustained"]:
            return {"rate": best, "limited_by": "system"}
        best = step["rate"]
    return {"rate": best, "limited_by": "rates"}


def max_latency_held(steps: list[dict]) -> float | None:
    """The maximum sustained rate by latency instead of lag, from the same steps (the ladder stops
    where the lag rule says, so it is at most the highest rate tried): a step holds when it is
    offered and complete and its p99 is at most the lowest rate's best p99 plus what the lag rule
    lets a step fall behind, ``LAG_GROWTH_TOLERANCE`` × its length. Output that leaves in bursts
    seconds long swings a step's lag slope both ways; it does not raise its p99 unless it falls behind."""
    if not steps:
        return None
    lowest = min(step["rate"] for step in steps)
    base = min((step["latency_s"]["p99"] for step in steps
                if step["rate"] == lowest and step["latency_s"].get("count")), default=None)
    if base is None:
        return None

    def holds(step: dict) -> bool:
        allowed = base + LAG_GROWTH_TOLERANCE * step["pairs"] / step["rate"]
        return (is_sustained({**step, "lag_growth_pairs_per_s": 0.0}) and bool(step["latency_s"].get("count"))
                and step["latency_s"]["p99"] <= allowed)

    return max_sustained([{**step, "sustained": holds(step)} for step in steps])["rate"]


def refine_rate(steps: list[dict], min_gap: float = MIN_REFINE_GAP) -> float | None:
    """Once the ladder stopped at a step not sustained, the rate halfway between the highest rate
    sustained and the lowest not (whole pairs/s); None when the system sustained no rate, the load
    or the ladder ended the run, or the two are at most ``min_gap`` apart. Each refined step
    halves the gap, so sustained steps stay below those not sustained, as max_sustained reads them."""
    best = max_sustained(steps)
    if best["limited_by"] != "system" or best["rate"] is None:
        return None
    lowest_failed = min(step["rate"] for step in steps if step["rate"] > best["rate"])
    if lowest_failed - best["rate"] <= min_gap:
        return None
    return float(round((best["rate"] + lowest_failed) / 2))


# --------------------------------------------------------------------------------------------
# the whole report


def describe_machine() -> dict:
    return {**machine(), "nproc": len(os.sched_getaffinity(0)),
            "load_average": [round(value, 2) for value in os.getloadavg()]}


def build_report(options: dict, versions: dict, systems: dict[str, dict], machine_at_start: dict,
                 tls: dict | None = None, drains: dict | None = None) -> dict:
    return {"options": options, "versions": versions,
            "machine": {**machine_at_start, "load_average_at_end": describe_machine()["load_average"]},
            "systems": systems, **({"tls": tls} if tls else {}), **({"drains": drains} if drains else {}),
            "ratios": ratios(systems, tls, drains)}


def balanced_ratio(drains: list[dict], ours: str, theirs: str, key: str,
                   per_pass: int) -> tuple[list[float], float | None]:
    """``ours`` against ``theirs`` on ``key`` in each pass of ``per_pass`` drains (passes alternate
    the order: A B C, C B A, ...), and the geometric mean of those ratios, None unless every pass
    gave one. A drift over the run (later drains faster) raises one pass's ratio about as much as
    it lowers the next's, so their geometric mean cancels it."""
    found = []
    for start in range(0, len(drains), per_pass):
        by_system = {drain["system"]: drain.get(key) for drain in drains[start:start + per_pass]}
        if (mine := by_system.get(ours)) and (other := by_system.get(theirs)):
            found.append(mine / other)
    every_pass = bool(found) and len(found) == math.ceil(len(drains) / per_pass)
    mean = round(math.prod(found) ** (1 / len(found)), 3) if every_pass else None
    return [round(ratio, 3) for ratio in found], mean


def kept_drains(drains: list[dict], keys) -> list[dict]:
    """Each drain's system and ``keys``, without its samples."""
    return [{"system": drain["system"], **{key: drain.get(key) for key in keys}} for drain in drains]


# What the worker's drains over SASL_SSL and PLAINTEXT are compared by: the ratio's name, the backlog summary's key.
TLS_MEASURES = {"backlog": "pairs_per_s", "cpu_per_pair": "cpu_s_per_1k_pairs",
                "broker_cpu_per_pair": "broker_cpu_s_per_1k_pairs"}


def balanced_tls(drains: list[dict]) -> dict:
    """The cost of TLS from the worker's backlog drains in the order A B B A, repeated (A over
    PLAINTEXT, B over SASL_SSL; each drain a backlog summary with its ``system``): per measure the
    ratio B/A of each pair of neighbours, and their geometric mean (see :func:`balanced_ratio`)."""
    kept = kept_drains(drains, TLS_MEASURES.values())
    result: dict = {"drains": kept}
    for name, key in TLS_MEASURES.items():
        result[f"{name}_ratios"], result[f"{name}_vs_plaintext"] = balanced_ratio(
            kept, "streamapp-tls", "streamapp", key, 2)
    return result


# What every system's order-balanced drains are compared by: the ratio's name, the backlog summary's key.
DRAIN_MEASURES = {"backlog": "pairs_per_s", "cpu_per_pair": "cpu_s_per_1k_pairs"}
# The plain copies on each client: against Kafka Streams, the most a join on that client could drain
# faster than Kafka Streams here.
COPIES = ("copy", "copy-librdkafka")


def balanced_drains(drains: list[dict], systems: list[str]) -> dict:
    """Rounds of every one of ``systems``' backlog drains, in passes of the systems in order, then
    reversed (A B C D D C B A ...): each system's median drain rate, and this project's join against
    each other system per pass and as the geometric mean of those (see :func:`balanced_ratio`)."""
    kept = kept_drains(drains, [*DRAIN_MEASURES.values(), "complete", "joined_fraction"])
    result: dict = {"systems": systems, "drains": kept,
                    "median_pairs_per_s": {name: median_rate(kept, name) for name in systems}}
    others = [name for name in systems if name != "streamapp"] if "streamapp" in systems else []
    for theirs in others:
        for name, key in DRAIN_MEASURES.items():
            result[f"{name}_vs_{theirs}_per_pass"], result[f"{name}_vs_{theirs}"] = balanced_ratio(
                kept, "streamapp", theirs, key, len(systems))
    limits = [name for name in COPIES if name in systems] if "kstreams" in systems else []
    for limit in limits:
        result[f"{limit}_backlog_vs_kstreams_per_pass"], result[f"{limit}_backlog_vs_kstreams"] = balanced_ratio(
            kept, limit, "kstreams", "pairs_per_s", len(systems))
    return result


def median_rate(drains: list[dict], system: str) -> float | None:
    rates = [drain["pairs_per_s"] for drain in drains if drain["system"] == system and drain["pairs_per_s"]]
    return statistics.median(rates) if rates else None


def ratios(systems: dict[str, dict], tls: dict | None = None, drains: dict | None = None) -> dict:
    """This project's join against Kafka Streams, Quix Streams and the plain copy, from each
    system's first drain and, when they ran, from the order-balanced rounds of drains ``drains``;
    over SASL_SSL against PLAINTEXT from the order-balanced drains ``tls`` when they ran."""
    def backlog(name: str) -> float | None:
        return (systems.get(name, {}).get("backlog") or {}).get("pairs_per_s")

    def live(name: str) -> float | None:
        return ((systems.get(name, {}).get("live") or {}).get("max_sustained") or {}).get("rate")

    def latency_held(name: str) -> float | None:
        return (systems.get(name, {}).get("live") or {}).get("max_latency_held")

    def ratio(ours: float | None, theirs: float | None) -> float | None:
        return round(ours / theirs, 3) if ours and theirs else None

    def cpu_per_pair(name: str, whose: str = "cpu_s_per_1k_pairs") -> float | None:
        return (systems.get(name, {}).get("backlog") or {}).get(whose)

    def peak_rss(name: str) -> float | None:
        return (systems.get(name, {}).get("backlog") or {}).get("peak_rss_bytes")

    return {"backlog_vs_kstreams": ratio(backlog("streamapp"), backlog("kstreams")),
            "backlog_vs_copy": ratio(backlog("streamapp"), backlog("copy")),
            "live_max_vs_kstreams": ratio(live("streamapp"), live("kstreams")),
            "backlog_vs_quix": ratio(backlog("streamapp"), backlog("quix")),
            "cpu_per_pair_vs_quix": ratio(cpu_per_pair("streamapp"), cpu_per_pair("quix")),
            "live_max_vs_quix": ratio(live("streamapp"), live("quix")),
            "live_latency_held_vs_quix": ratio(latency_held("streamapp"), latency_held("quix")),
            "live_latency_held_vs_kstreams": ratio(latency_held("streamapp"), latency_held("kstreams")),
            "peak_rss_vs_quix": ratio(peak_rss("streamapp"), peak_rss("quix")),
            # From the order-balanced rounds of every system's drain (None unless they ran).
            **{f"balanced_{name}_vs_{theirs}": (drains or {}).get(f"{name}_vs_{theirs}")
               for theirs in ("kstreams", "quix", *COPIES) for name in DRAIN_MEASURES},
            **{f"balanced_{limit}_backlog_vs_kstreams": (drains or {}).get(f"{limit}_backlog_vs_kstreams")
               for limit in COPIES},
            # Over SASL_SSL against PLAINTEXT (None unless both ran).
            **{f"tls_{name}_vs_plaintext": (tls or {}).get(f"{name}_vs_plaintext") for name in TLS_MEASURES},
            # Exactly-once against at-least-once (None unless both ran).
            "eos_backlog_vs_at_least_once": ratio(backlog("streamapp-eos"), backlog("streamapp")),
            "eos_cpu_per_pair_vs_at_least_once": ratio(cpu_per_pair("streamapp-eos"), cpu_per_pair("streamapp")),
            "eos_live_max_vs_at_least_once": ratio(live("streamapp-eos"), live("streamapp")),
            "eos_backlog_vs_kstreams_eos": ratio(backlog("streamapp-eos"), backlog("kstreams-eos"))}


def markdown(report: dict) -> str:
    options, machine_info, versions = report["options"], report["machine"], report["versions"]
    load = " / ".join(f"{value:.2f}" for value in machine_info["load_average"])
    load_end = " / ".join(f"{value:.2f}" for value in machine_info["load_average_at_end"])
    lines = [
        "# Join benchmark: plain copy, Kafka Streams, Quix Streams, streamapp",
        "",
        f"`{options['command']}`",
        "",
        f"Machine: {machine_info['cpu']}, nproc {machine_info['nproc']}, "
        f"{machine_info['memory_bytes'] / 1024**3:.1f} GiB memory, load average {load} at the start "
        f"and {load_end} at the end (1 / 5 / 15 min). {machine_info['system']}.",
        "",
        f"One local Apache Kafka {versions['kafka_broker']} broker (KRaft, one node) on 127.0.0.1, "
        f"{options['partitions']} partitions per topic. Kafka Streams {versions['kafka_streams']} on "
        f"{versions['java']} (one stream thread, {versions['kstreams_jvm']}); Quix Streams "
        f"{versions.get('quixstreams') or '–'} on confluent-kafka {versions.get('confluent_kafka') or '–'}; "
        f"faust-streaming {versions['faust']}, aiokafka {versions['aiokafka']}, Python {versions['python']}.",
        "",
        f"Input: frame/result pairs from {options['streams']} camera(s) sharing the rate, "
        f"{options['width']}×{options['height']} JPEG frames "
        f"(~{options['frame_record_bytes'] / 1000:.0f} KB records), each result published "
        f"{options['result_lag']} frames after its frame with its frame's timestamp; join window/TTL "
        f"{options['ttl_s']:g} s. Backlog: {options['pairs']:,} pairs preloaded, event time spaced as if "
        f"recorded live at {options['backlog_rate']:g} pairs/s. Live: {options['live_seconds']:g} s at each "
        f"of {', '.join(f'{rate:g}' for rate in options['rates'])} pairs/s after a {options['warmup_s']:g} s "
        f"warm-up at the first, stopping at a system's first rate not sustained; then up to "
        f"{options['refine_steps']} refined steps, each halfway between the highest rate sustained and the "
        f"lowest not. {_retries_note(options['retries'])}",
        "",
        "## Backlog drain",
        "",
        "| system | pairs/s | CPU s / 1,000 pairs | joined | unmatched | frames out twice | peak pending "
        "| peak RSS | start s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for system in report["systems"].values():
        lines.append(_backlog_row(system))
    lines += ["", "Pending: " + "; ".join(f"{system['label']}: {system['pending_measure']}"
                                          for system in report["systems"].values() if system.get("pending_measure")),
              "", "## Live, paced", "",
              _live_header(options["rates"]), "|---|---|" + "---|" * (len(options["rates"]) + 1)]
    for system in report["systems"].values():
        lines.append(_live_row(system, options["rates"]))
    lines += ["", "Each rate cell: p50 / p99 latency in ms (result published → output read), joined %, "
              "lag growth in pairs/s (lag: pairs published and not yet out); ✗ marks a step not sustained "
              "(< 99.9 % joined, or lag growing "
              f"more than {LAG_GROWTH_TOLERANCE:.0%} of the rate per second). Latencies skip the first "
              "tenth of each step.", "", _latency_held_note(report), "", _cores_note(report), "", "## Ratios", ""]
    for key, value in report["ratios"].items():
        lines.append(f"- {key.replace('_', ' ')}: {value if value is not None else 'n/a'}")
    if report.get("tls"):
        lines += ["", *_tls_section(report["tls"], report["systems"])]
    if report.get("drains"):
        lines += ["", *_drains_section(report["drains"], report["systems"])]
    errors = [f"- {system['label']}: {system['error']}" for system in report["systems"].values()
              if system.get("error")]
    if errors:
        lines += ["", "## Did not run", "", *errors]
    return "\n".join(lines) + "\n"


def _tls_section(tls: dict, systems: dict[str, dict]) -> list[str]:
    title = "## Over SASL_SSL, order balanced"
    if tls.get("error"):
        return [title, "", f"Did not run: {tls['error']}"]
    lines = [title, "",
             "The worker's backlog drains after an uncounted one over each listener, in the order A B B A "
             "(A PLAINTEXT, B SASL_SSL); each neighbouring pair gives a ratio, the tls ratios above are "
             "their geometric mean (the single drains in the first table are not).", "",
             *_drains_table(tls["drains"], _labels(systems), {
                 "pairs/s": "pairs_per_s", "CPU s / 1,000 pairs": "cpu_s_per_1k_pairs",
                 "broker CPU s / 1,000 pairs": "broker_cpu_s_per_1k_pairs"})]
    lines += ["", "Ratios per pair: " + "; ".join(
        f"{name.replace('_', ' ')} {', '.join(f'{ratio:.3f}' for ratio in tls[f'{name}_ratios'])}"
        for name in TLS_MEASURES) + "."]
    return lines


def _drains_section(drains: dict, systems: dict[str, dict]) -> list[str]:
    title = "## Backlog drains, order balanced"
    if drains.get("error"):
        return [title, "", f"Did not run: {drains['error']}"]
    labels = _labels(systems)
    passes = len(drains["drains"]) // max(1, len(drains["systems"]))
    lines = [title, "",
             f"After every system's run, {passes} passes of their backlog drains, each pass in the order of "
             "the one before reversed; this worker's ratio to each system in each pass, and the balanced "
             "ratios above, their geometric mean (a drift over the run cancels in it).", "",
             *_drains_table(drains["drains"], labels, {
                 "pairs/s": "pairs_per_s", "CPU s / 1,000 pairs": "cpu_s_per_1k_pairs", "joined": "joined_fraction"}),
             "", "Median pairs/s: " + "; ".join(f"{labels.get(name, name)} {rate:,.0f}" for name, rate
                                               in drains["median_pairs_per_s"].items() if rate) + "."]
    per_pass = [f"against {labels.get(theirs, theirs)} {', '.join(f'{ratio:.3f}' for ratio in ratios_found)}"
                for theirs in drains["systems"] if (ratios_found := drains.get(f"backlog_vs_{theirs}_per_pass"))]
    if per_pass:
        lines += ["", "Backlog ratio per pass: " + "; ".join(per_pass) + "."]
    limits = [f"{labels.get(limit, limit)} {ratio:.2f}×" for limit in COPIES
              if (ratio := drains.get(f"{limit}_backlog_vs_kstreams"))]
    if limits:
        lines += ["", "The plain copies against Kafka Streams, balanced: " + "; ".join(limits) + " (a join on "
                  "that client drains at most this much faster than Kafka Streams here)."]
    return lines


def _labels(systems: dict[str, dict]) -> dict[str, str]:
    return {name: system["label"] for name, system in systems.items()}


def _drains_table(drains: list[dict], labels: dict[str, str], columns: dict[str, str]) -> list[str]:
    def cell(value: float | None) -> str:
        return "–" if value is None else f"{value:,.3f}" if value < 10 else f"{value:,.0f}"

    return ["| drain | system | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns),
            *(f"| {number} | {labels.get(drain['system'], drain['system'])} | "
              + " | ".join(cell(drain.get(key)) for key in columns.values()) + " |"
              for number, drain in enumerate(drains, start=1))]


def _retries_note(retries: int) -> str:
    if not retries:
        return "Each rate is tried once."
    times = "once more" if retries == 1 else f"up to {retries} more times"
    return (f"A step not sustained is tried {times} once the system has caught up (a host stall fails a step "
            "for any system); a rate counts as sustained when one of its tries is.")


def _latency_held_note(report: dict) -> str:
    held = [f"{system['label']} {rate:,.0f}" for system in report["systems"].values()
            if (rate := (system.get("live") or {}).get("max_latency_held"))]
    if not held:
        return ""
    return ("Maximum by latency instead of lag, from the same steps (p99 at most the lowest rate's plus "
            f"{LAG_GROWTH_TOLERANCE:.0%} of the step's length; output that leaves in bursts swings the lag "
            "slope, not the p99): " + "; ".join(held) + " pairs/s.")


def _cores_note(report: dict) -> str:
    """How many cores each system and the load (publisher and output reader) used at their top step."""
    parts = []
    for system in report["systems"].values():
        steps = [step for step in (system.get("live") or {}).get("steps", []) if step.get("cores")]
        if steps:
            top = max(steps, key=lambda step: step["rate"])
            parts.append(f"{system['label']} at {top['rate']:g}/s: {top['cores']['system']:.2f} cores, "
                         f"the load {top['cores']['load']:.2f}")
    if not parts:
        return ""
    return ("Cores used during each system's highest step (the load: publisher and output reader in one process): "
            + "; ".join(parts) + ".")


def _backlog_row(system: dict) -> str:
    backlog = system.get("backlog")
    if not backlog:
        return f"| {system['label']} | – | – | – | – | – | – | – | – |"
    joined = "–" if backlog["joined_fraction"] is None else f"{100 * backlog['joined_fraction']:.2f} %"
    unmatched = "–" if backlog["unmatched"] is None else f"{backlog['unmatched']:,}"
    twice = "–" if backlog["frames_out_twice"] is None else f"{backlog['frames_out_twice']:,}"
    pending = "–" if backlog["peak_pending_bytes"] is None else f"{backlog['peak_pending_bytes'] / MIB:.0f} MiB"
    rate = f"{backlog['pairs_per_s']:,.0f}" if backlog["pairs_per_s"] else "–"
    if not backlog["complete"]:
        rate += f" ({backlog['pairs_out']:,} out)"
    cpu = f"{backlog['cpu_s_per_1k_pairs']:.2f}" if backlog["cpu_s_per_1k_pairs"] is not None else "–"
    return (f"| {system['label']} | {rate} | {cpu} | {joined} | {unmatched} | {twice} | {pending} | "
            f"{backlog['peak_rss_bytes'] / MIB:.0f} MiB | {backlog['startup_s']:.1f} |")


def _live_header(rates: list[float]) -> str:
    return "| system | max sustained pairs/s | " + " | ".join(f"{rate:g}/s" for rate in rates) + " | refined |"


def _live_row(system: dict, rates: list[float]) -> str:
    live = system.get("live")
    if not live:
        return f"| {system['label']} | – | " + " | ".join("–" for _ in rates) + " | – |"
    best = live["max_sustained"]
    best_text = f"{best['rate']:g}" if best["rate"] is not None else "none"
    if best["limited_by"] == "rates":
        best_text = f"≥ {best_text}"
    elif best["limited_by"] == "load":
        best_text += " (load limit)"
    tries = tries_by_rate(live["steps"])
    cells = [_tries_cell(tries.get(rate, [])) for rate in rates]
    refined = "; ".join(f"{rate:g}/s: {_tries_cell(steps)}" for rate, steps in tries.items() if rate not in rates)
    return f"| {system['label']} | {best_text} | " + " | ".join(cells) + f" | {refined or '–'} |"


def _tries_cell(steps: list[dict]) -> str:
    """Every try of one rate, in order."""
    return " → ".join(_step_cell(step) for step in steps) or "–"


def _step_cell(step: dict) -> str:
    latency = step["latency_s"]
    timing = (f"{1000 * latency['p50']:.0f} / {1000 * latency['p99']:.0f} ms" if latency["count"]
              else "no output")
    complete = step["joined_fraction"] if step["joined_fraction"] is not None else step["out_fraction"]
    mark = "" if step["sustained"] else " ✗"
    return f"{timing}, {100 * complete:.1f} %, {step['lag_growth_pairs_per_s']:+.0f}/s{mark}"


def draw_chart(path: Path, report: dict) -> None:
    """Throughput per system and phase (bars) above p99 latency against rate (lines), one colour
    per system in both."""
    systems = report["systems"]
    throughput: dict[str, dict[str, float]] = {"backlog drain": {}, "max sustained live": {}}
    latency: dict[str, list[tuple[float, float]]] = {}
    for system in systems.values():
        label = system["label"]
        if system.get("backlog") and system["backlog"]["pairs_per_s"]:
            throughput["backlog drain"][label] = system["backlog"]["pairs_per_s"]
        live = system.get("live")
        if not live:
            continue
        if live["max_sustained"]["rate"]:
            throughput["max sustained live"][label] = live["max_sustained"]["rate"]
        latency[label] = [(step["rate"], 1000 * step["latency_s"]["p99"])
                          for step in rate_outcomes(live["steps"]) if step["latency_s"]["count"]]
    write_png(path,
              bar_image("pairs per second", throughput, "pairs/s"),
              line_image("p99 latency against paced rate (result published -> output read)", latency,
                         unit="ms", scale=1.0, x_unit="/s", markers=True))
