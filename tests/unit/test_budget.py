"""The memory budget: every share of the plan together stays within nine tenths of it, and stream
buffers are bounded in bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest
from mode.utils.queues import FlowControlEvent

from streamapp.errors import ExitCode, UsageError, one_line
from streamapp.kafka.buffers import ByteBoundedQueue
from streamapp.kafka.producer import SendBufferBytes
from streamapp.memoryplan import MemoryPlan
from streamapp.settings import BACKPRESSURE, DROP_OLDEST, STAGES, Settings, SettingsError
from streamapp.units import parse_bytes
from streamapp.worker.budget import OverloadCounts, memory_plan
from streamapp.worker.factory import create_app

MIB = 1024**2


@dataclasses.dataclass
class Message:
    key: bytes
    value: bytes
    generation_id: int = 1


class Event:
    def __init__(self, size: int, generation: int = 1) -> None:
        self.message = Message(b"k", b"v" * (size - 1), generation)
        self.acked = False

    def ack(self) -> None:
        self.acked = True


# Stage sets: each stage alone, the pairs a small deployment runs, and all four in one worker.
STAGE_SETS = [(stage,) for stage in STAGES] + [("resize", "infer"), ("join", "sink"), STAGES]
BUDGETS = [64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB, 1024 * MIB, 4096 * MIB]


def _plan_or_smallest(settings: Settings) -> MemoryPlan | int:
    """The worker's plan, or the smallest budget its refusal names."""
    try:
        return memory_plan(settings)
    except UsageError as exc:
        assert str(exc).count("\n") == 0 and "STREAMAPP_MEMORY_BUDGET=" in str(exc)
        smallest = re.search(r"give it at least (\d+MiB),", str(exc))
        assert smallest, str(exc)
        return parse_bytes(smallest.group(1), name="budget")


@pytest.mark.parametrize("stages", STAGE_SETS, ids=",".join)
@pytest.mark.parametrize("partitions", [1, 4, 12, 48])
@pytest.mark.parametrize("frame", [64 * 1024, 1 * MIB, 4 * MIB, 16 * MIB])
def test_every_share_adds_up_to_at_most_nine_tenths_of_the_budget(stages, partitions, frame):
    for budget in BUDGETS:
        settings = Settings(memory_budget_bytes=budget, max_frame_bytes=frame, stages=stages, partitions=partitions)
        planned = _plan_or_smallest(settings)
        if isinstance(planned, int):  # refused: the budget it names fits, and the MiB below does not
            assert planned > budget
            assert memory_plan(settings.replace(memory_budget_bytes=planned)).planned_bytes <= 0.9 * planned
            assert isinstance(_plan_or_smallest(settings.replace(memory_budget_bytes=planned - MIB)), int)
            continue
        shares = planned.shares()
        assert sum(shares.values()) == planned.planned_bytes <= 0.9 * budget, shares
        assert planned.as_metrics()["budget_planned_bytes"] == planned.planned_bytes


def test_the_default_worker_fits_with_its_preview_and_frames_at_the_pixel_limit():
    plan = memory_plan(Settings())
    shares = plan.shares()
    assert plan.planned_bytes <= 0.9 * Settings().memory_budget_bytes
    assert shares["preview"] == Settings().preview_bytes and shares["join batches"] > 0
    assert shares["decoded frame"] == 6 * Settings().frame_pixel_limit
    assert shares["RocksDB block cache and write buffers"] == plan.rocksdb_bytes > 0


def test_a_worker_without_the_join_plans_no_join_share():
    shares = memory_plan(Settings(stages=("resize",))).shares()
    assert shares["RocksDB block cache and write buffers"] == shares["join batches"] == 0
    assert shares["recovery buffer"] == shares["preview"] == 0 and shares["decoded frame"] > 0


@pytest.mark.parametrize("frame", [64 * 1024, 1 * MIB, 16 * MIB])
def test_the_join_recovers_in_batches_of_more_than_one_record(frame):
    """With one, Faust reads on in the changelog after recovery and the join applies its own
    writes to its store again (streamapp.memoryplan)."""
    for budget in BUDGETS:
        planned = _plan_or_smallest(Settings(memory_budget_bytes=budget, max_frame_bytes=frame, stages=("join",)))
        if not isinstance(planned, int):
            assert planned.recovery_records > 1, planned


def test_a_budget_too_small_for_the_frames_is_refused_in_one_line_with_the_smallest_that_fits(tmp_path):
    settings = Settings(memory_budget_bytes=256 * MIB, data_dir=tmp_path)
    with pytest.raises(UsageError) as refused:
        create_app(settings)
    message = one_line(refused.value)
    assert message.startswith("STREAMAPP_MEMORY_BUDGET=256.0MiB is too small for stages resize,infer,join,sink")
    assert "give it at least 719MiB, or lower STREAMAPP_MAX_FRAME_BYTES, STREAMAPP_PARTITIONS or " \
           "STREAMAPP_PREVIEW_BYTES" in message
    assert refused.value.exit_code == ExitCode.USAGE


def test_memory_budget_rejects_ambiguous_units():
    with pytest.raises(SettingsError, match="ambiguous"):
        Settings.from_env({"STREAMAPP_MEMORY_BUDGET": "512M"})
    assert Settings.from_env({"STREAMAPP_MEMORY_BUDGET": "512MiB"}).memory_budget_bytes == 512 * MIB


def test_overload_policy_is_checked():
    with pytest.raises(SettingsError, match="STREAMAPP_OVERLOAD"):
        Settings.from_env({"STREAMAPP_OVERLOAD": "drop"})


def _queue(limit: int, policy: str, *, generation: int = 1,
           flow: FlowControlEvent | None = None) -> tuple[ByteBoundedQueue, OverloadCounts]:
    dropped = OverloadCounts()
    flow = flow or FlowControlEvent(initially_suspended=False)
    return ByteBoundedQueue(limit, policy=policy, dropped=dropped, current_generation=lambda: generation,
                            flow_control=flow, clear_on_resume=True), dropped


def test_queue_size_is_its_bytes_and_full_means_over_the_limit():
    queue, _ = _queue(1000, BACKPRESSURE)
    for _ in range(3):
        queue.force_put_nowait(Event(300))
    assert queue.qsize() == 900 and not queue.full()
    queue.force_put_nowait(Event(300))
    assert queue.full()  # the conductor now waits, so nothing more is fetched
    queue.get_nowait()
    assert queue.qsize() == 900 and not queue.full()


def test_backpressure_pauses_the_partition_on_bytes_and_resumes_when_drained():
    queue, dropped = _queue(1000, BACKPRESSURE)
    calls = []

    def put(size):
        queue.put_nowait_enhanced(Event(size), on_pressure_high=lambda: calls.append("pause"),
                                  on_pressure_drop=lambda: calls.append("resume"))

    put(500)
    put(400)  # 500 bytes queued: under 80 % of the limit
    assert calls == []
    put(10)  # 900 bytes queued: over 80 %
    assert calls == ["pause"]
    assert dropped.as_metrics()["budget_stream_buffer_pauses_total"] == 1
    while not queue.empty():
        asyncio.run(queue.get())
    asyncio.run(_get_with_timeout(queue))
    assert calls == ["pause", "resume"]


async def _get_with_timeout(queue):
    try:
        await asyncio.wait_for(queue.get(), 0.01)
    except TimeoutError:
        pass


def test_clear_when_a_rebalance_suspends_flow_drops_everything():
    flow = FlowControlEvent(initially_suspended=False)
    queue, _ = _queue(1000, BACKPRESSURE, generation=2, flow=flow)
    for generation in (1, 2):
        queue.force_put_nowait(Event(100, generation))
    flow.suspend()
    flow.clear()  # what Faust does when partitions are revoked
    assert queue.empty() and queue.qsize() == 0


def test_resuming_flow_keeps_what_was_fetched_in_this_generation():
    """After recovery Faust resumes the new assignment, then seeks, then resumes flow, which
    clears stream buffers: records fetched in between must stay, the consumer will not fetch
    them again."""
    flow = FlowControlEvent(initially_suspended=True)
    queue, _ = _queue(1000, BACKPRESSURE, generation=3, flow=flow)
    stale, fetched = Event(100, generation=2), [Event(200, generation=3), Event(300, generation=3)]
    for event in (stale, *fetched):
        queue.force_put_nowait(event)
    flow.resume()
    assert [queue.get_nowait() for _ in range(len(fetched))] == fetched
    assert queue.empty() and queue.qsize() == 0


def test_drop_oldest_makes_room_acks_and_counts_what_it_dropped():
    queue, dropped = _queue(1000, DROP_OLDEST)
    events = [Event(300) for _ in range(10)]
    for event in events:
        queue.put_nowait_enhanced(event, on_pressure_high=pytest.fail, on_pressure_drop=lambda: None)
        assert not queue.full() and queue.qsize() <= 1000
    assert queue.qsize() == 900
    assert [event.acked for event in events] == [True] * 7 + [False] * 3
    assert dropped.as_metrics() == {"budget_stream_buffer_pauses_total": 0,
                                    "budget_dropped_records_total": 7, "budget_dropped_bytes_total": 2100}
    assert queue.get_nowait() is events[7]  # the newest stay


def test_send_buffer_size_is_bytes_waiting_to_be_sent():
    buffer = SendBufferBytes()
    for size in (100, 250):
        buffer.put_nowait(Event(size))
    assert buffer.qsize() == 350
    buffer.get_nowait()
    assert buffer.qsize() == 250 and not buffer.empty()
