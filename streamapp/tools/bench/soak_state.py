"""What a soak run is asked (:class:`SoakOptions`) and what it has done so far (:class:`Progress`)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

SIZE_4K = (3840, 2160)
# A 4K JPEG is ~25x a 640x480 one: the 4k scenario sends a 50th of the pairs at a 25th of the rate.
PAIRS_SCALE_4K = 50
RATE_SCALE_4K = 25
STALL_AT = 0.4          # fraction of the pairs sent when inference stalls
MIB = 1024**2


@dataclasses.dataclass(frozen=True)
class SoakOptions:
    pairs: int = 100_000
    width: int = 640
    height: int = 480
    rate: float = 150.0               # pairs per second; 0 = as fast as the broker takes them
    scenario: str = "steady"
    stall_s: float = 60.0
    baseline: str | None = None       # "naive"
    memory_budget_bytes: int = 512 * MIB
    out: Path = Path("docs/benchmarks/soak")
    bootstrap: str | None = None      # an existing broker; topic bytes are then not measured
    drain_timeout_s: float = 120.0

    @property
    def size(self) -> tuple[int, int]:
        return SIZE_4K if self.scenario == "4k" else (self.width, self.height)

    @property
    def pair_count(self) -> int:
        return max(1, self.pairs // PAIRS_SCALE_4K) if self.scenario == "4k" else self.pairs

    @property
    def pair_rate(self) -> float:
        return self.rate / RATE_SCALE_4K if self.scenario == "4k" and self.rate else self.rate


@dataclasses.dataclass
class Progress:
    """What the load has done so far, shared by the load, the readers and the sampler."""

    started: float = dataclasses.field(default_factory=time.monotonic)
    pairs_sent: int = 0
    results_sent: int = 0
    frame_bytes: int = 0
    result_sent_at: dict[int, float] = dataclasses.field(default_factory=dict)
    sending_done: float | None = None
    out: dict[str, int] = dataclasses.field(default_factory=lambda: {"ours": 0, "naive": 0})
    matched: dict[str, int] = dataclasses.field(default_factory=lambda: {"ours": 0, "naive": 0})
    latencies: dict[str, list[float]] = dataclasses.field(default_factory=lambda: {"ours": [], "naive": []})
    slow_sink_read: int = 0
    output_span: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def output_rate(self, engine: str) -> float:
        """Matched pairs per second from the first output to the last."""
        first, last = self.output_span.get(engine, (0.0, 0.0))
        return self.matched[engine] / (last - first) if last > first else 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.started
