"""The join store on a real full file system: a write that meets ENOSPC changes nothing, is
retried once space returns, and the store reopens complete (R6)."""

import asyncio
import functools
import os

import rocksdict

from streamapp.diskspace import SpacePause, free_bytes_of
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.memory import RocksMemory
from streamapp.tables.store import EXPIRY_FAMILY, JoinPartition

from conftest import fill_disk

MIB = 1024**2
PAYLOAD = 200 * 1024
ENTRIES = 100  # 20 MB: fits the disk once the filler is gone, with room for the WAL and flushes


def _memory() -> RocksMemory:
    cache = rocksdict.Cache(32 * MIB)
    return RocksMemory(32 * MIB, cache,
                       rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(16 * MIB, False, cache))


def _open(path, memory) -> JoinPartition:
    return JoinPartition(rocksdict.Rdict(str(path), options=memory.options(),
                                         column_families={EXPIRY_FAMILY: memory.options()}))


def _entry(index: int) -> tuple[bytes, bytes]:
    return f"cam:1:{index}".encode(), Entry(EntryKind.FRAME, 10_000 + index, os.urandom(PAYLOAD), index).encode()


def test_a_write_on_a_full_disk_pauses_changes_nothing_and_goes_on_when_space_returns(small_disk):
    memory = _memory()
    partition = _open(small_disk / "join-0", memory)
    filler = fill_disk(small_disk, leave_bytes=8 * MIB)
    space = SpacePause("the join", free_bytes_of(small_disk), resume_bytes=16 * MIB, poll_s=0.05)
    written = 0

    async def give_space_back_once_paused():
        while not space.paused:
            await asyncio.sleep(0.01)
        assert partition.stats.entries == written  # the refused batch counted nothing
        await asyncio.sleep(0.3)
        filler.unlink()

    async def scenario():
        nonlocal written
        freeing = asyncio.create_task(give_space_back_once_paused())
        while written < ENTRIES:
            await space.retry(functools.partial(partition.write_many, [_entry(written)], wait=False))
            written += 1
        await freeing

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert space.pauses >= 1, "the disk never filled up"
    assert partition.stats.entries == written == ENTRIES
    partition.close()

    reopened = _open(small_disk / "join-0", memory)
    assert reopened.stats.entries == ENTRIES and reopened.stats.pending_bytes == partition.stats.pending_bytes
    assert all(reopened.get(_entry(index)[0]) is not None for index in range(ENTRIES))
    assert len(reopened.due_by_deadline(EntryKind.ALL, 10**9, 1000)) == ENTRIES
    reopened.close()
