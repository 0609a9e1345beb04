"""Counters and gauges of one worker process, served as JSON on the worker's web port.

Counters count outcomes (every record ends in exactly one); gauges are read when asked, from
providers registered by the stages (join state, RocksDB) plus the process itself (RSS, gc).
"""

from __future__ import annotations

import gc
import resource
import time
from collections import Counter
from typing import Callable

GaugeProvider = Callable[[], dict[str, float]]


class Metrics:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self._providers: list[GaugeProvider] = []
        self._gc_seconds = 0.0
        self._gc_started = 0.0
        gc.callbacks.append(self._time_gc)

    def inc(self, name: str, amount: int = 1) -> None:
        self.counters[name] += amount

    def add_gauges(self, provider: GaugeProvider) -> None:
        self._providers.append(provider)

    def snapshot(self) -> dict[str, float]:
        values: dict[str, float] = dict(self.counters)
        values.update(process_gauges())
        values["gc_seconds_total"] = round(self._gc_seconds, 6)
        for provider in self._providers:
            values.update(provider())
        return values

    def _time_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_seconds += time.perf_counter() - self._gc_started


def rss_bytes() -> int:
    """Resident set size now (not the peak), from /proc."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def process_gauges() -> dict[str, float]:
    return {
        "process_resident_memory_bytes": rss_bytes(),
        "process_peak_resident_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "gc_collections_total": sum(generation["collections"] for generation in gc.get_stats()),
    }
