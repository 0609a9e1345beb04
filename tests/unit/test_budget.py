"""The memory budget: every buffer's share fits in it, and stream buffers are bounded in bytes."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from mode.utils.queues import FlowControlEvent

from streamapp.kafka.buffers import ByteBoundedQueue
from streamapp.kafka.producer import SendBufferBytes
from streamapp.settings import BACKPRESSURE, DROP_OLDEST, STAGES, Settings, SettingsError
from streamapp.topics import max_record_bytes
from streamapp.worker.budget import MemoryPlan, OverloadCounts

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


def _planned_bytes(plan: MemoryPlan, settings: Settings) -> int:
    fetched = settings.partitions * 3 * plan.fetch_bytes_per_partition + max_record_bytes(settings)
    produced = (settings.partitions * 2 + 1) * 2 * plan.producer_batch_bytes + plan.send_buffer_bytes
    return plan.rocksdb_bytes + plan.stream_buffer_bytes * len(settings.stages) + fetched + produced


@pytest.mark.parametrize("budget, frame, stages, partitions", [
    (1024 * MIB, 16 * MIB, STAGES, 4),
    (512 * MIB, 16 * MIB, ("join",), 4),
    (256 * MIB, 4 * MIB, ("join",), 12),
    (128 * MIB, 1 * MIB, ("resize", "infer"), 8),
])
def test_every_buffer_share_fits_in_the_budget(budget, frame, stages, partitions):
    settings = Settings(memory_budget_bytes=budget, max_frame_bytes=frame, stages=stages, partitions=partitions)
    plan = MemoryPlan.for_settings(settings)
    assert _planned_bytes(plan, settings) <= budget * 0.9
    assert plan.stream_buffer_bytes >= max_record_bytes(settings)  # one frame always fits


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
