"""The soak's report: summary numbers, the targets they meet or not, the machine, and the charts."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from streamapp.settings import Settings
from streamapp.tools.bench.plot import line_chart

if TYPE_CHECKING:
    from streamapp.tools.bench.soak_state import Progress, SoakOptions

MIB = 1024**2


def build_report(options: SoakOptions, settings: Settings, progress: Progress, samples: list[dict]) -> dict:
    sent_s = progress.sending_done or progress.elapsed()
    input_rate = progress.pairs_sent / sent_s if sent_s else 0.0
    frame_bytes = progress.frame_bytes / max(1, progress.pairs_sent)
    rocksdb_bound = 2 * input_rate * settings.join_ttl_s * frame_bytes + 64 * MIB
    ours = [sample["ours"] for sample in samples]
    rss_growth = rss_growth_second_half(samples, progress.pairs_sent)
    changelog = [sample["broker_topic_bytes"]["changelog"] for sample in samples if sample["broker_topic_bytes"]]
    report = {
        "scenario": options.scenario,
        "options": {**dataclasses.asdict(options), "out": str(options.out), "size": list(options.size),
                    "pair_count": options.pair_count, "pair_rate": options.pair_rate},
        "machine": machine(),
        "memory_budget_bytes": settings.memory_budget_bytes,
        "join_ttl_s": settings.join_ttl_s,
        "pairs_sent": progress.pairs_sent,
        "results_sent": progress.results_sent,
        "mean_frame_record_bytes": round(frame_bytes),
        "sending_s": round(sent_s, 1),
        "input_pairs_per_s": round(input_rate, 1),
        "ours": {
            "out": progress.out["ours"],
            "matched": progress.matched["ours"],
            "pairs_per_s": round(progress.output_rate("ours"), 1),
            "pairs_per_cpu_s": pairs_per_cpu_second(samples, "ours", progress.matched["ours"]),
            "latency_s": percentile_summary(progress.latencies["ours"]),
            "peak_rss_bytes": max((sample["rss_bytes"] for sample in ours), default=0),
            "rss_growth_50_to_100_percent": rss_growth,
            "peak_pending_bytes": max((sample["pending_bytes"] for sample in ours), default=0),
            "peak_rocksdb_disk_bytes": max((sample["rocksdb_disk_bytes"] for sample in ours), default=0),
            "plateau_rocksdb_disk_bytes": max((sample["rocksdb_disk_bytes"] for sample in last_quarter(ours)),
                                              default=0),
            "rocksdb_disk_bound_bytes": round(rocksdb_bound),
            "peak_changelog_bytes": max(changelog, default=None),
            "changelog_growth_last_quarter": growth_last_quarter(changelog),
            "dropped_records": ours[-1]["dropped_records"] if ours else 0,
        },
    }
    if samples and "naive" in samples[-1]:
        naive = [sample["naive"] for sample in samples]
        report["naive"] = {
            "out": progress.out["naive"],
            "pairs_per_s": round(progress.output_rate("naive"), 1),
            "pairs_per_cpu_s": pairs_per_cpu_second(samples, "naive", progress.matched["naive"]),
            "latency_s": percentile_summary(progress.latencies["naive"]),
            "peak_rss_bytes": max(sample["rss_bytes"] for sample in naive),
            "final_pending_bytes": naive[-1]["pending_bytes"],
            "peak_pending_bytes": max(sample["pending_bytes"] for sample in naive),
        }
    report["targets"] = targets(report)
    report["samples"] = samples
    return report


def write_json(path: Path, report: dict) -> None:
    """A report on one line, no indent: a committed run's per-second samples stay a fraction of the
    size (`python -m json.tool report.json` prints it readable)."""
    path.write_text(json.dumps(report, separators=(",", ":")) + "\n")


def percentile_summary(values: list[float]) -> dict[str, float | int]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 4)

    return {"count": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 4)}


def pairs_per_cpu_second(samples: list[dict], engine: str, matched: int) -> float | None:
    """Matched pairs per second of CPU the join process used: its throughput on one core,
    whatever else the machine was doing."""
    used = samples[-1][engine]["cpu_s"] - samples[0][engine]["cpu_s"] if samples else 0
    return round(matched / used, 1) if used > 0 else None


def rss_growth_second_half(samples: list[dict], pairs: int) -> float | None:
    """Relative growth of the join's RSS from 50 % to 100 % of the pairs sent."""
    half = next((s["ours"]["rss_bytes"] for s in samples if s["pairs_sent"] >= pairs / 2), None)
    full = next((s["ours"]["rss_bytes"] for s in samples if s["pairs_sent"] >= pairs), None)
    if not half or full is None:
        return None
    return round((full - half) / half, 4)


def last_quarter(values: list) -> list:
    """Where a long run has settled: its last quarter of samples."""
    return values[len(values) * 3 // 4:]


def growth_last_quarter(values: list[int]) -> float | None:
    """Peak of the last quarter over the peak of the second quarter: about 1 when it plateaued."""
    if len(values) < 8:
        return None
    quarter = len(values) // 4
    earlier = max(values[quarter:2 * quarter])
    return round(max(last_quarter(values)) / earlier, 3) if earlier else None


def targets(report: dict) -> dict[str, bool | None]:
    ours = report["ours"]
    growth = ours["rss_growth_50_to_100_percent"]
    changelog = ours["changelog_growth_last_quarter"]
    return {
        "rss_below_budget_at_every_sample": ours["peak_rss_bytes"] < report["memory_budget_bytes"],
        "rss_growth_50_to_100_percent_below_2_percent": None if growth is None else growth < 0.02,
        "rocksdb_disk_plateau_within_bound": ours["plateau_rocksdb_disk_bytes"] <= ours["rocksdb_disk_bound_bytes"],
        "changelog_bytes_bounded": None if changelog is None else changelog <= 1.25,
        "throughput_at_least_1000_pairs_per_s_on_one_core": (ours["pairs_per_cpu_s"] or 0) >= 1000,
    }


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": memory, "python": platform.python_version(),
            "system": platform.platform()}


def draw_charts(out: Path, report: dict, samples: list[dict]) -> None:
    engines = [engine for engine in ("ours", "naive") if samples and engine in samples[-1]]
    label = {"ours": "join (RocksDB window)", "naive": "naive dict join"}

    def series(engine: str, field: str) -> list[tuple[float, float]]:
        return [(sample["t"], sample[engine][field]) for sample in samples]

    title = f"{report['scenario']}: {report['pairs_sent']} pairs"
    line_chart(out / "rss.png", f"{title} - RSS",
               {f"{label[engine]} RSS": series(engine, "rss_bytes") for engine in engines},
               limits={"memory budget": report["memory_budget_bytes"]})
    disk = {"RocksDB on disk": series("ours", "rocksdb_disk_bytes")}
    topics = [(sample["t"], sample["broker_topic_bytes"]) for sample in samples if sample["broker_topic_bytes"]]
    for role in ("changelog", "frames", "detections"):
        if topics:
            disk[f"topic {role}"] = [(t, values[role]) for t, values in topics]
    line_chart(out / "disk.png", f"{title} - disk", disk,
               limits={"RocksDB bound": report["ours"]["rocksdb_disk_bound_bytes"]})
    line_chart(out / "pending.png", f"{title} - pending join state",
               {f"{label[engine]} pending": series(engine, "pending_bytes") for engine in engines})
