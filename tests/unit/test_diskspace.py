"""SpacePause: what a full disk does to a stage, with the free space and the failures scripted."""

import asyncio
import errno
import logging

import pytest

from streamapp.diskspace import DiskFull, SpacePause, is_disk_full, is_write_stall

MIB = 1024**2


def test_full_disk_errors_are_recognised_from_the_os_and_from_rocksdb():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(DiskFull(errno.ENOSPC, "video cut short"))
    assert is_disk_full(Exception("IO error: No space left on device: While appending to file: 000004.log"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert is_write_stall(Exception("Result incomplete: Write stall"))


def test_a_write_that_meets_a_full_disk_pauses_logs_once_and_is_retried_when_space_returns(caplog):
    free = [0]
    failures = [OSError(errno.ENOSPC, "No space left on device")] * 3
    attempts = []

    def write():
        attempts.append(free[0])
        if failures:
            raise failures.pop()
        return "written"

    space = SpacePause("the sink", lambda: free[0], resume_bytes=8 * MIB, poll_s=0.01)

    async def scenario():
        writing = asyncio.create_task(space.retry(write))
        await asyncio.sleep(0.1)
        assert space.paused and not writing.done() and len(attempts) == 1  # waits, does not spin
        free[0] = 64 * MIB  # two more refusals with space free: RocksDB still resuming
        return await asyncio.wait_for(writing, 1)

    with caplog.at_level(logging.WARNING, logger="streamapp.diskspace"):
        assert asyncio.run(scenario()) == "written"
    assert len(attempts) == 4 and not space.paused
    assert space.as_metrics("sink_") == {"sink_disk_full_paused": 0, "sink_disk_full_pauses_total": 1}
    assert [record.levelname for record in caplog.records] == ["ERROR", "WARNING"]  # paused once, resumed once


def test_other_errors_are_not_a_full_disk():
    space = SpacePause("the join", lambda: 0, resume_bytes=0)

    def write():
        raise ValueError("bad record")

    with pytest.raises(ValueError):
        asyncio.run(space.retry(write))
    with pytest.raises(ValueError):
        asyncio.run(space.unless_full(lambda: asyncio.to_thread(write)))
    assert space.pauses == 0


def test_upkeep_is_skipped_while_paused_and_pauses_on_a_full_disk():
    free = [64 * MIB]
    space = SpacePause("the join", lambda: free[0], resume_bytes=8 * MIB)
    runs = []

    async def sweep():
        runs.append(1)
        raise Exception("IO error: No space left on device")

    free[0] = 0
    asyncio.run(space.unless_full(sweep))
    assert space.paused and runs == [1]
    asyncio.run(space.unless_full(sweep))
    assert runs == [1]  # skipped: still full
    free[0] = 64 * MIB
    asyncio.run(space.unless_full(lambda: asyncio.sleep(0)))
    assert not space.paused


def test_a_paused_stage_that_can_make_room_itself_resumes_without_waiting_for_others():
    free = [0]
    asked = []

    async def make_room():
        asked.append(free[0])
        free[0] = 16 * MIB  # e.g. the sink deleted its oldest files

    space = SpacePause("the sink", lambda: free[0], resume_bytes=8 * MIB, poll_s=10, make_room=make_room)
    space.pause("test")

    async def scenario():
        await asyncio.wait_for(space.wait(), 1)  # well before the next poll

    asyncio.run(scenario())
    assert asked == [0] and not space.paused and space.pauses == 1
