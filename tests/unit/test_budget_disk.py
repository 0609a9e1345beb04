"""The disk budget: the oldest entries expire early near it, and a full disk pauses the join."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import rocksdict

from streamapp.tables.disk import DiskGuard, deadline_to_free
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.memory import shared_rocks_memory
from streamapp.tables.store import EXPIRY_FAMILY, JoinPartition

MIB = 1024**2
ENTRY_BYTES = 10_000 + 9  # payload plus the entry header


class Window:
    """The window as the guard sees it: its store's partitions and a sweep up to a deadline."""

    def __init__(self, partitions: list[JoinPartition], disk_bytes: int) -> None:
        self.partitions = partitions
        self.used = disk_bytes
        self.table = self
        self.data = self

    def disk_bytes(self) -> int:
        return self.used

    def active_partitions(self):
        return enumerate(self.partitions)

    async def shed(self, deadline_ms, on_due, retry) -> int:
        expired = 0
        for partition in self.partitions:
            for key, _ in partition.due_by_deadline(EntryKind.ALL, deadline_ms, limit=10**6):
                partition.write(key, None)
                expired += 1
        return expired


@pytest.fixture
def partitions(tmp_path):
    memory = shared_rocks_memory(64 * MIB)
    opened = [JoinPartition(rocksdict.Rdict(str(tmp_path / f"p{number}"), options=memory.options(),
                                            column_families={EXPIRY_FAMILY: memory.options()}))
              for number in range(2)]
    deadlines = itertools.count(1000)
    for number in range(100):  # deadlines interleave across the two partitions
        opened[number % 2].write(f"k{number}".encode(), Entry(EntryKind.FRAME, next(deadlines), b"p" * 10_000).encode())
    yield opened
    for partition in opened:
        partition.close()


def _guard(budget: int, free: list[int]) -> DiskGuard:
    return DiskGuard(budget, data_dir=None, free_bytes=lambda: free[0], reserve_bytes=64 * MIB)


def test_deadline_to_free_walks_all_partitions_in_deadline_order(partitions):
    assert deadline_to_free(partitions, 0) is None
    assert deadline_to_free(partitions, 1) == 1000
    assert deadline_to_free(partitions, 3 * ENTRY_BYTES) == 1002
    assert deadline_to_free(partitions, 10**9) is None  # more than everything pending


def test_near_the_budget_the_oldest_entries_expire_early_and_are_counted(partitions):
    pending = 100 * ENTRY_BYTES
    budget = int(pending / 0.95)  # the store is at 95 % of its budget
    guard = _guard(budget, [10**12])
    window = Window(partitions, disk_bytes=pending)
    asyncio.run(guard.tend(window, on_due=None))
    remaining = [deadline for partition in partitions for deadline, _ in partition.by_deadline()]
    assert sum(partition.stats.bytes for partition in partitions) <= 0.75 * budget
    assert guard.early_expired == 100 - len(remaining) > 0
    assert min(remaining) == 1000 + guard.early_expired  # exactly the oldest went
    assert guard.as_metrics()["disk_early_expired_total"] == guard.early_expired


def test_under_the_budget_nothing_expires(partitions):
    guard = _guard(budget=10**9, free=[10**12])
    asyncio.run(guard.tend(Window(partitions, disk_bytes=100 * ENTRY_BYTES), on_due=None))
    assert guard.early_expired == 0
    assert sum(partition.stats.entries for partition in partitions) == 100


def test_a_full_disk_pauses_the_join_until_space_returns():
    free = [10 * MIB]
    guard = _guard(budget=10**9, free=free)

    async def scenario():
        guard.check_free_space()
        assert guard.paused and guard.space.pauses == 1
        waiting = asyncio.create_task(guard.wait_for_space())
        await asyncio.sleep(0.01)
        guard.check_free_space()  # still full: one pause, still waiting
        assert not waiting.done() and guard.space.pauses == 1
        free[0] = 1024 * MIB
        guard.check_free_space()
        await asyncio.wait_for(waiting, 1)
        assert not guard.paused
        await guard.wait_for_space()  # returns at once with space

    asyncio.run(scenario())
    assert guard.as_metrics()["disk_full_pauses_total"] == 1
