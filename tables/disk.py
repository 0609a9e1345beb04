"""The disk budget of the join window (R6): bounded bytes on disk, and a full disk waited out.

Two limits, checked every sweep:

* the window's own RocksDB bytes against ``STREAMAPP_DISK_BUDGET``: from 90 % of it, the entries
  with the earliest deadlines are expired early, through the ordinary sweep (so frames still
  leave flagged unmatched and the changelog gets their records), until the pending bytes are
  back under 75 %; then the partitions are compacted so the space returns now, not at RocksDB's
  next compaction. Each early expiry is counted.
* the free space of the file system that holds the data directory: below a reserve, the join
  stops taking records (its agent waits; Kafka keeps them) and logs why, and goes on by itself
  when space returns. RocksDB never meets a full disk mid-write, so the store never goes
  read-only or half-written, and the worker never exits into a crash loop.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import shutil
from pathlib import Path
from typing import Callable, Optional

from streamapp.units import format_bytes

log = logging.getLogger(__name__)

EXPIRE_FROM = 0.90      # of the budget: start expiring the oldest entries early
EXPIRE_DOWN_TO = 0.75   # of the budget: stop when pending bytes are back under this
# Free space RocksDB needs to flush memtables and compact without meeting a full disk.
FULL_DISK_RESERVE_BYTES = 64 * 1024**2


class DiskGuard:
    def __init__(self, budget_bytes: int, data_dir: Path, *,
                 free_bytes: Optional[Callable[[], int]] = None,
                 reserve_bytes: int = FULL_DISK_RESERVE_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        self._free_bytes = free_bytes or (lambda: shutil.disk_usage(data_dir).free)
        self._space = asyncio.Event()
        self._space.set()
        self.early_expired = 0
        self.full_disk_pauses = 0

    @property
    def paused(self) -> bool:
        return not self._space.is_set()

    async def wait_for_space(self) -> None:
        """Returns at once unless the disk is full; then when space has come back."""
        if not self._space.is_set():
            await self._space.wait()

    def check_free_space(self) -> None:
        free = self._free_bytes()
        if free < self.reserve_bytes and not self.paused:
            self.full_disk_pauses += 1
            self._space.clear()
            log.error("disk full: %s free, the join needs %s; it takes no records until space returns "
                      "(nothing is lost: they wait in Kafka)", format_bytes(free), format_bytes(self.reserve_bytes))
        elif free >= self.reserve_bytes and self.paused:
            self._space.set()
            log.warning("disk space is back (%s free); the join goes on", format_bytes(free))

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
            expired = await window.shed(cutoff, on_due)
            self.early_expired += expired
            log.warning("join window at %s on disk of a %s budget: expired the %d oldest entries early",
                        format_bytes(used), format_bytes(self.budget_bytes), expired)
        for partition in partitions:  # deleted entries hold disk space until compacted
            await asyncio.to_thread(partition.compact)

    def as_metrics(self) -> dict[str, float]:
        return {"disk_budget_bytes": self.budget_bytes,
                "disk_early_expired_total": self.early_expired,
                "disk_full_pauses_total": self.full_disk_pauses,
                "disk_full_paused": int(self.paused)}


def deadline_to_free(partitions, excess_bytes: int) -> Optional[int]:
    """The earliest deadline such that entries due by it hold at least ``excess_bytes``."""
    if excess_bytes <= 0:
        return None
    freed = 0
    for deadline, length in heapq.merge(*(partition.by_deadline() for partition in partitions)):
        freed += length
        if freed >= excess_bytes:
            return deadline
    return None
