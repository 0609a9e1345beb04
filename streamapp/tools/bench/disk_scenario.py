"""``streamapp bench disk``, the pure parts: the options and their checks, the phases of the run,
the size of each small file system, and the verdict over the sampled series.

Nothing here starts a process or touches a disk, so all of it is tested without a broker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from streamapp.errors import UsageError
from streamapp.samples import family_of, parse_sample
from streamapp.settings import Settings
from streamapp.topics import TopicError, disk_plan
from streamapp.unread import METRIC as DELETED_UNREAD

MIB = 1024**2
COMPONENTS = ("broker", "join", "sink")
# What each small disk is: a tmpfs, or an ext4 file system in a loop-mounted image file.
FILESYSTEMS = ("tmpfs", "ext4")
# Steady input before the stall and after the slow sink, at least this long in all.
MIN_STEADY_S = 60.0
# A component plateaued if the peak of its last quarter is at most PLATEAU_GROWTH above the peak
# of everything before, give or take PLATEAU_NOISE of its budget (small series jitter).
PLATEAU_GROWTH = 0.10
PLATEAU_NOISE = 0.01
STEADY, STALL, SLOW_SINK, DRAIN = "steady", "infer stalled", "sink slowed", "drain"


@dataclasses.dataclass(frozen=True)
class DiskBenchOptions:
    streams: int = 2
    fps: float = 15.0                       # per stream
    # 640x480 at 30 fps in all is more than the sink keeps up with on 2 cores shared with other
    # work (it managed 14 fps there); 320x240 leaves the slowed sink as the only slow phase.
    width: int = 320
    height: int = 240
    duration_s: float = 20 * 60.0
    stall_s: float = 5 * 60.0               # inference stopped (SIGSTOP)
    slow_s: float = 5 * 60.0                # the sink slowed (SIGSTOP/SIGCONT duty cycle)
    sink_stopped_share: float = 0.75        # of every period while slowed, the sink is stopped
    sink_period_s: float = 4.0
    partitions: int = 2
    max_frame_bytes: int = 1 * MIB
    broker_budget_bytes: int = 1536 * MIB   # STREAMAPP_BROKER_DISK_BUDGET
    join_budget_bytes: int = 128 * MIB      # STREAMAPP_DISK_BUDGET
    sink_budget_bytes: int = 128 * MIB      # per stream: STREAMAPP_SINK_DISK_BUDGET is streams x this
    reserve_bytes: int = 64 * MIB           # STREAMAPP_DISK_RESERVE
    join_ttl_s: float = 5.0
    detector: str = "color"
    out: Path = Path("docs/benchmarks/disk")
    work: Path = Path("out/bench-disk")     # mount points, worker logs
    drain_timeout_s: float = 600.0          # after the cameras stop, for the join and the sink to finish
    filesystem: str = "tmpfs"               # one of FILESYSTEMS

    def settings(self, base: Settings) -> Settings:
        """The pipeline's settings for this run; a bad combination raises SettingsError."""
        return base.replace(
            partitions=self.partitions, max_frame_bytes=self.max_frame_bytes,
            broker_disk_budget_bytes=self.broker_budget_bytes, disk_budget_bytes=self.join_budget_bytes,
            sink_disk_budget_bytes=self.streams * self.sink_budget_bytes, disk_reserve_bytes=self.reserve_bytes,
            join_ttl_s=self.join_ttl_s, detector=self.detector)


def check_options(options: DiskBenchOptions, base: Settings) -> Settings:
    """The run's settings, or UsageError (one line) for options that cannot make the scenario."""
    steady = options.duration_s - options.stall_s - options.slow_s
    if steady < MIN_STEADY_S:
        raise UsageError(
            f"--duration {options.duration_s:g}s leaves {steady:g}s of steady input beside --stall "
            f"{options.stall_s:g}s and --slow-sink {options.slow_s:g}s; it needs at least {MIN_STEADY_S:g}s",
            "lengthen --duration or shorten --stall / --slow-sink")
    if options.width * options.height * 3 > 64 * options.max_frame_bytes:
        raise UsageError(f"--size {options.width}x{options.height} is too large for --max-frame-bytes "
                         f"{options.max_frame_bytes}", "raise --max-frame-bytes")
    settings = options.settings(base)
    try:
        disk_plan(settings)
    except TopicError as exc:
        raise UsageError(_as_flags(str(exc))) from None
    return settings


def _as_flags(message: str) -> str:
    for variable, flag in (("STREAMAPP_BROKER_DISK_BUDGET", "--broker-budget"),
                           ("STREAMAPP_PARTITIONS", "--partitions"),
                           ("STREAMAPP_MAX_FRAME_BYTES", "--max-frame-bytes")):
        message = message.replace(variable, flag)
    return message


# --- phases -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    start_s: float
    end_s: float


def phases(options: DiskBenchOptions) -> list[Phase]:
    """Steady input, inference stalled, the sink slowed, steady again: the two faults in the
    middle of the run, one after the other."""
    stall_at = (options.duration_s - options.stall_s - options.slow_s) / 2
    slow_at = stall_at + options.stall_s
    recovered = slow_at + options.slow_s
    return [Phase(STEADY, 0.0, stall_at), Phase(STALL, stall_at, slow_at),
            Phase(SLOW_SINK, slow_at, recovered), Phase(STEADY, recovered, options.duration_s)]


def phase_at(plan: Sequence[Phase], t: float) -> str:
    return next((phase.name for phase in plan if phase.start_s <= t < phase.end_s), DRAIN)


# --- file systems -----------------------------------------------------------------------------


def budgets(options: DiskBenchOptions) -> dict[str, int]:
    """What each component may hold on its disk: the broker budget, the join's disk budget, and
    the sink's budget for every stream plus each stream's open video segment and the frame being
    written. A segment closes at an eighth of the budget in JPEG bytes, but its video re-encodes
    them larger (about 1.3x), so a quarter is kept for it."""
    sink = options.streams * (options.sink_budget_bytes + options.sink_budget_bytes // 4 + options.max_frame_bytes)
    return {"broker": options.broker_budget_bytes, "join": options.join_budget_bytes, "sink": sink}


def filesystem_bytes(options: DiskBenchOptions) -> dict[str, int]:
    """Each small file system: its component's budget plus the reserve (the join and the sink
    pause below it; for the broker it is room for what arrives between retention checks)."""
    return {component: size + options.reserve_bytes for component, size in budgets(options).items()}


# --- verdict ----------------------------------------------------------------------------------


def plateaued(values: Sequence[int], budget: int) -> bool | None:
    """The last quarter's peak is not above the earlier peak by more than PLATEAU_GROWTH (plus
    PLATEAU_NOISE of the budget): the series stopped growing. None: too few samples to say."""
    if len(values) < 8:
        return None
    quarter = len(values) * 3 // 4
    return max(values[quarter:]) <= max(values[:quarter]) * (1 + PLATEAU_GROWTH) + PLATEAU_NOISE * budget


def disk_verdict(samples: Sequence[dict], budget_of: dict[str, int]) -> dict[str, dict]:
    """Per component: peak used bytes, whether every sample stayed below its budget, and whether
    the series plateaued while the cameras played (once they stop nothing grows, so the drain's
    samples would make any series look flat)."""
    playing = [sample for sample in samples if sample.get("phase") != DRAIN]
    verdict = {}
    for component in COMPONENTS:
        used = [sample[component]["used_bytes"] for sample in samples]
        used_playing = [sample[component]["used_bytes"] for sample in playing]
        budget = budget_of[component]
        verdict[component] = {
            "budget_bytes": budget,
            "peak_used_bytes": max(used, default=0),
            "last_quarter_peak_bytes": max(used_playing[len(used_playing) * 3 // 4:], default=0),
            "below_budget": bool(used) and max(used) < budget,
            "plateaued": plateaued(used_playing, budget),
        }
    return verdict


def accounting(sent: int, matched: int, unmatched: int, shed: int, dead_lettered: int,
               deleted_unread: int = 0) -> dict[str, int | bool]:
    """Every frame sent left the join once, joined or unmatched, or was counted as shed,
    dead-lettered, or deleted by the broker's retention before the join read it."""
    missing = sent - matched - unmatched - shed - dead_lettered - deleted_unread
    return {"frames_sent": sent, "joined": matched, "unmatched": unmatched, "shed": shed,
            "dead_lettered": dead_lettered, "deleted_unread": deleted_unread, "missing": missing,
            "all_accounted": missing == 0}


def deleted_unread_of(stats: dict[str, float], topic: str) -> int:
    """Records of ``topic`` that a worker counted as deleted by retention before it read them."""
    return int(sum(value for sample, value in stats.items()
                   if family_of(sample) == DELETED_UNREAD and parse_sample(sample)[1].get("topic") == topic))


def passed(verdict: dict[str, dict], frames: dict, workers_died: Sequence[str]) -> bool:
    return (not workers_died and frames["all_accounted"]
            and all(part["below_budget"] and part["plateaued"] for part in verdict.values()))
