"""A worker's memory plan (streamapp.memoryplan) from its settings, and what its full stream
buffers did.

When a stream buffer is full the worker stops fetching (backpressure), or, with
``STREAMAPP_OVERLOAD=drop-oldest`` for live video, drops the oldest buffered records, counted.
"""

from __future__ import annotations

from collections import Counter

from streamapp.memoryplan import MemoryPlan
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes


def memory_plan(settings: Settings) -> MemoryPlan:
    """The plan of a worker of these settings; refuses, in one line, a budget it does not fit in."""
    return MemoryPlan.of(budget_bytes=settings.memory_budget_bytes, record_bytes=max_record_bytes(settings),
                         partitions=settings.partitions, stages=settings.stages,
                         max_frame_pixels=settings.max_frame_pixels, preview_bytes=settings.preview_bytes)


class OverloadCounts(Counter):
    """What full stream buffers did: partitions paused (backpressure), records dropped (drop-oldest)."""

    def as_metrics(self) -> dict[str, int]:
        return {"budget_stream_buffer_pauses_total": self["pauses"],
                "budget_dropped_records_total": self["records"],
                "budget_dropped_bytes_total": self["bytes"]}
