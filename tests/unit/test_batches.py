"""Batches taken from a Faust stream's buffer: bounded in records and bytes, acked only when the
code consuming a batch acks it, never when it raised, and skipping records fetched before a
rebalance."""

import asyncio
import contextlib

import faust
import pytest
from faust.types import Message

from streamapp.batches import Batches, BatchSensors, acked_when_done
from streamapp.kafka.monitor import faust_monitor
from streamapp.worker.metrics import Metrics

VALUE = b"v" * 100


def _app() -> faust.App:
    # Never started: nothing connects to this broker. Flow is resumed as after an assignment.
    app = faust.App("batches-test", broker="kafka://localhost:1", store="memory://")
    app.flow_control.resume()
    return app


async def _put(app: faust.App, channel, count: int, *, generation: int | None = None,
               past_flow_control: bool = False) -> list:
    """``past_flow_control``: put while flow is suspended, as a hand-over already under way does."""
    events = []
    for offset in range(count):
        message = Message("in", 0, offset, 0.0, 0, [], b"k", VALUE, None,
                          generation_id=app.consumer_generation_id if generation is None else generation)
        message.incref()  # as the conductor does for the one channel it delivers to
        event = app.create_event(b"k", VALUE, [], message)
        events.append(event)
        if past_flow_control:
            channel.queue.put_nowait(event)
        else:
            await channel.put(event)
    return events


def _source(**limits):
    """An app, its channel, and the batches of a stream of it."""
    app = _app()
    channel = app.channel()
    options = {"max_bytes": 10**6, "max_events": 100, "linger_s": 0.001, "idle_s": 0.05, **limits}
    return app, channel, Batches(app.stream(channel), **options)


async def _started(**limits):
    """An app, its channel, batches taken from a stream of it, and the first batch to come."""
    app, channel, source = _source(**limits)
    batches = aiter(source)
    first = asyncio.ensure_future(batches.__anext__())
    await asyncio.sleep(0.01)  # the generator subscribes to the channel, then waits for it
    return app, channel, batches, first


def _tell_to_stop(channel) -> None:
    for subscribed in channel._subscribers:  # what Faust's actor does as the worker stops
        subscribed._throw(StopAsyncIteration())


async def _ends(next_batch) -> None:
    """The batches end: the awaited next batch raises StopAsyncIteration."""
    try:
        await asyncio.wait_for(next_batch, 2)
    except StopAsyncIteration:
        return
    raise AssertionError("a batch came out of a stopped stream")


def test_batches_are_bounded_and_acked_only_when_acked():
    async def scenario():
        app, channel, batches, first = await _started(max_events=3, max_bytes=10**6)
        events = await _put(app, channel, 5)
        batch = await asyncio.wait_for(first, 2)
        assert batch.events == events[:3]
        second = await asyncio.wait_for(batches.__anext__(), 2)
        assert second.events == events[3:]
        assert not any(event.message.acked for event in events)  # the first is still in flight
        batch.ack()
        assert [event.message.acked for event in events] == [True, True, True, False, False]
        second.ack()
        assert all(event.message.acked for event in events)
        await batches.aclose()

    asyncio.run(scenario())


def test_input_before_says_whether_input_came_before_a_deadline():
    async def scenario():
        app, channel, source = _source(max_events=2)
        batches = aiter(source)
        events = await _put(app, channel, 3)
        assert (await asyncio.wait_for(batches.__anext__(), 2)).events == events[:2]
        assert await source.input_before(asyncio.get_running_loop().create_future())  # one is waiting
        assert (await asyncio.wait_for(batches.__anext__(), 2)).events == events[2:]
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        assert not await source.input_before(done)
        deadline = asyncio.get_running_loop().create_future()
        later = asyncio.ensure_future(source.input_before(deadline))
        await asyncio.sleep(0.01)
        arriving = await _put(app, channel, 1)
        assert await asyncio.wait_for(later, 2)
        assert not deadline.cancelled()  # not the batches' to cancel
        assert (await asyncio.wait_for(batches.__anext__(), 2)).events == arriving
        await batches.aclose()

    asyncio.run(scenario())


def test_a_batch_closes_at_its_byte_limit():
    async def scenario():
        record_bytes = len(b"k") + len(VALUE)
        app, channel, batches, first = await _started(max_bytes=2 * record_bytes)
        events = await _put(app, channel, 3)
        assert (await asyncio.wait_for(first, 2)).events == events[:2]
        await batches.aclose()

    asyncio.run(scenario())


def test_a_batch_that_raised_is_not_acked():
    async def scenario():
        app, channel, batches, first = await _started()
        events = await _put(app, channel, 3)
        assert (await asyncio.wait_for(first, 2)).events == events
        try:
            await batches.athrow(RuntimeError("the join failed on this batch"))
        except RuntimeError:
            pass
        assert not any(event.message.acked for event in events)

    asyncio.run(scenario())


def test_records_fetched_before_a_rebalance_are_skipped_and_never_acked():
    async def scenario():
        app, channel, batches, first = await _started()
        stale = await _put(app, channel, 2, generation=app.consumer_generation_id + 1)
        current = await _put(app, channel, 1)
        assert (await asyncio.wait_for(first, 2)).events == current
        assert not any(event.message.acked for event in stale)  # read again from the committed offset
        await batches.aclose()

    asyncio.run(scenario())


def test_batches_end_quietly_when_the_agent_is_told_to_stop():
    async def scenario():
        app, channel, batches, first = await _started()
        _tell_to_stop(channel)
        await _ends(first)

    asyncio.run(scenario())


def test_batches_end_when_the_agent_was_told_to_stop_while_it_waited_between_batches():
    async def scenario():
        app, channel, source = _source()
        batches = aiter(source)
        waiting = asyncio.ensure_future(source.input_before(asyncio.get_running_loop().create_future()))
        await asyncio.sleep(0.01)
        _tell_to_stop(channel)
        assert not await asyncio.wait_for(waiting, 2)
        await _ends(batches.__anext__())

    asyncio.run(scenario())


class HoldFirstUntilLetGo:
    """A hold-back that keeps the first event it sees until told to let it go."""

    def __init__(self) -> None:
        self.held: list = []
        self.let_go = False
        self.seen = 0

    def take(self, taken, now):
        taken = list(taken)
        if not self.seen and taken:
            self.held.append(taken.pop(0))
        self.seen += len(taken) + len(self.held)
        if self.let_go:
            taken, self.held = self.held + taken, []
        return taken

    def holding(self) -> bool:
        return bool(self.held)

    def poll_s(self) -> float:
        return 0.01


def test_a_held_event_comes_in_a_later_batch_even_with_no_new_input_and_is_acked_with_it():
    async def scenario():
        hold = HoldFirstUntilLetGo()
        app, channel, batches, first = await _started(hold_back=hold, idle_s=10.0)
        events = await _put(app, channel, 3)
        batch = await asyncio.wait_for(first, 2)
        assert batch.events == events[1:]
        batch.ack()
        assert not events[0].message.acked  # held: its offset does not commit
        hold.let_go = True
        later = await asyncio.wait_for(batches.__anext__(), 2)  # woken by the poll, not by input
        assert later.events == events[:1]
        later.ack()
        assert events[0].message.acked
        await batches.aclose()

    asyncio.run(scenario())


def test_an_event_held_over_a_rebalance_is_skipped_and_never_acked():
    async def scenario():
        hold = HoldFirstUntilLetGo()
        app, channel, batches, first = await _started(hold_back=hold)
        events = await _put(app, channel, 2)
        assert (await asyncio.wait_for(first, 2)).events == events[1:]
        app.consumer_generation_id += 1
        hold.let_go = True
        arriving = await _put(app, channel, 1)
        assert (await asyncio.wait_for(batches.__anext__(), 2)).events == arriving
        assert not events[0].message.acked
        await batches.aclose()

    asyncio.run(scenario())


def test_what_a_stop_finds_held_or_arriving_is_never_acked():
    """A stop suspends flow: a record held then, or taken after, is not handled, and an ack
    would let the stop's last commit take its offset."""

    async def scenario():
        hold = HoldFirstUntilLetGo()
        app, channel, batches, first = await _started(hold_back=hold)
        events = await _put(app, channel, 2)
        assert (await asyncio.wait_for(first, 2)).events == events[1:]
        following = asyncio.ensure_future(batches.__anext__())
        app.flow_control.suspend()
        hold.let_go = True
        events += await _put(app, channel, 1, past_flow_control=True)
        await asyncio.sleep(0.2)  # the held one is looked at again at least once
        assert not following.done()
        assert not events[0].message.acked and not events[2].message.acked
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following

    asyncio.run(scenario())


def test_with_the_worker_s_monitor_sensors_count_each_batch_at_once():
    async def scenario():
        app = _app()
        app.monitor = faust_monitor(Metrics().registry)  # the worker's: it counts a batch at once
        channel = app.channel()
        source = Batches(app.stream(channel), max_bytes=10**6, max_events=3, linger_s=0.001, idle_s=0.05)
        assert isinstance(source.events.sensors, BatchSensors)
        batches = aiter(source)
        events = await _put(app, channel, 5)
        first = await asyncio.wait_for(batches.__anext__(), 2)
        assert app.monitor.events_total == app.monitor.events_active == 3
        first.ack()
        second = await asyncio.wait_for(batches.__anext__(), 2)
        second.ack()
        assert all(event.message.acked for event in events)
        assert (app.monitor.events_total, app.monitor.events_active) == (5, 0)
        assert len(app.monitor.events_runtime) == 5
        await batches.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("taking", ["events", "take_events"])
@pytest.mark.parametrize("guarded", [True, False])
def test_what_the_loop_handles_when_a_stop_comes_is_not_acked(guarded, taking):
    """Faust's own iterator acks what its loop was handling when it is closed: by the stop
    cancelling the agent, and for ``take_events`` earlier, by the stream's stop, while the agent
    still handles the batch. The consumer then commits it, unhandled; acked_when_done leaves it
    for after the restart."""

    async def scenario():
        app = _app()
        channel = app.channel()
        stream = app.stream(channel)
        handled = []

        async def agent():
            taken = stream.events() if taking == "events" else stream.take_events(1, within=0.01)
            async for item in acked_when_done(taken) if guarded else taken:
                handled.append(item)
                if len(handled) == 2:
                    await asyncio.sleep(10)  # the stop comes in the middle of this one

        task = asyncio.ensure_future(agent())
        await asyncio.sleep(0.01)
        events = await _put(app, channel, 2)
        await asyncio.sleep(0.05)
        await stream.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)  # the loop closes the iterators the agent left
        assert handled == (events if taking == "events" else [[event] for event in events])
        assert [event.message.acked for event in events] == [True, not guarded]

    asyncio.run(scenario())
