"""The disk budget of the join window (R6): bounded bytes on disk, and a full disk waited out.

Two limits, checked every sweep:

* the window's own RocksDB bytes against ``STREAMAPP_DISK_BUDGET``: from 90 % of it, the entries
  with the earliest deadlines are expired early, through the ordinary sweep (so frames still
  leave flagged unmatched and the changelog gets their records), until the pending bytes are
  back under 75 %; then the partitions are compacted so the space returns now, not at RocksDB's
  next compaction. Each early expiry is counted.
* the free space of the file system that holds the data directory: below a reserve
  (``STREAMAPP_DISK_RESERVE``), the join stops taking records (its agent waits; Kafka keeps them)
  and logs why, and goes on by itself when space returns. A write that meets a full disk between
  two checks fails whole (one atomic RocksDB batch), pauses the join the same way, and is tried
  again once space is back; RocksDB resumes by itself. So the store is never half-written, and
  the worker never exits into a crash loop.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from streamapp.diskspace import SpacePause, free_bytes_of
from streamapp.units import format_bytes

log = logging.getLogger(__name__)

EXPIRE_FROM = 0.90      # of the budget: start expiring the oldest entries early
EXPIRE_DOWN_TO = 0.75   # of the budget: stop when pending bytes are back under this


class DiskGuard:
    def __init__(self, budget_bytes: int, data_dir: Path, *, reserve_bytes: int,
                 free_bytes: Callable[[], int] | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        self.space = SpacePause("the join", free_bytes or free_bytes_of(data_dir), resume_bytes=reserve_bytes)
        self.early_expired = 0

    @property
    def paused(self) -> bool:
        return self.space.paused

    async def wait_for_space(self) -> None:
        """Returns at once unless the disk is full; then when space has come back."""
        await self.space.wait()

    def check_free_space(self) -> None:
        if not self.space.check() and self.space.free_bytes() < self.reserve_bytes:
            self.space.pause(f"{format_bytes(self.space.free_bytes())} free, under the reserve of "
                             f"{format_bytes(self.reserve_bytes)}")

    async def written(self, write: Callable[[], None]) -> None:
        """Run a store write, waiting out a full disk for as long as it lasts."""
        await self.space.retry(write)

    async def unless_full(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` (a sweep) unless the disk is full; one that meets a full disk pauses the
        join. Its writes after a delivery wait for space (:meth:`written`), so what it emitted is
        never emitted again."""
        await self.space.unless_full(work)

    async def tend(self, window, on_due) -> None:
        """One check of both limits; expires early and compacts when over the budget."""
        self.check_free_space()
        store = window.table.data
        used = store.disk_bytes()
        if used < EXPIRE_FROM * self.budget_bytes:
            return
        partitions = [partition for _, partition in store.active_partitions()]
        pending = sum(partition.stats.bytes for partition in partitions)
        cutoff = deadline_to_free(partitions, pending - int(EXPIRE_DOWN_TO * self.budget_bytes))
        if cutoff is not None:
            expired = await window.shed(cutoff, on_due, self.written)
            self.early_expired += expired
            log.warning("join window at %s on disk of a %s budget: expired the %d oldest entries early",
                        format_bytes(used), format_bytes(self.budget_bytes), expired)
        for partition in partitions:  # deleted entries hold disk space until compacted
            await asyncio.to_thread(partition.compact)

    def as_metrics(self) -> dict[str, float]:
        return {"disk_budget_bytes": self.budget_bytes,
                "disk_early_expired_total": self.early_expired,
                **self.space.as_metrics()}


def deadline_to_free(partitions, excess_bytes: int) -> int | None:
    """The earliest deadline such that entries due by it hold at least ``excess_bytes``."""
    if excess_bytes <= 0:
        return None
    freed = 0
    for deadline, length in heapq.merge(*(partition.by_deadline() for partition in partitions)):
        freed += length
        if freed >= excess_bytes:
            return deadline
    return None
