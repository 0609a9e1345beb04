"""Batches of events from a Faust stream, bounded in bytes and in records, acked after the batch.

Faust's ``Stream.take_events`` counts records (a batch of 4K frames would be gigabytes) and holds a
part-full batch for its whole timeout. Here a batch closes as soon as it is full, in bytes or
records, or when the stream buffer has run empty and ``linger_s`` more has passed: under load
batches grow, at a trickle a record waits at most the linger. A batch's events are acked only
when the code consuming it calls :meth:`Batch.ack`, so offsets commit after the batch's outputs,
and the next batch can be taken while this one's outputs are on their way; a batch never acked
(the code raised, or was cancelled) is read again after a restart (at-least-once).

The batch is taken straight from the stream's buffer, which the conductor fills. Iterating the
stream would run Faust's per-event machinery (an event-loop turn, the processors, the context
variable) for each record, a cost that shows in a backlog drain (docs/benchmarks.md,
Measurements). What of it matters is done here once per record: skipping records fetched before
a rebalance, tracking each for the commit, and the sensors (once per batch when the worker's
monitor is the only one).

A record taken while flow is suspended (a rebalance or a stop began) or fetched in an earlier
generation is skipped and never acked, so that it is read again from the committed offset.
Faust's own stream acks what it skips (streamapp.kafka.consumer refuses those acks): acked, a
stop's last commit took a skipped record's offset along with those after it, and the record was
never handled.

A :class:`HoldBack` may keep events taken for a batch back for a later one (the join holds a
record until its partner may have been read, so that the two are decided together). Held events
are taken and tracked, so their offsets do not commit, and are carried into the next batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, TypeVar, cast

from faust import Stream
from faust.types import EventT, Message

from streamapp.kafka import streams
from streamapp.kafka.streams import flowing
from streamapp.units import event_bytes

Taken = TypeVar("Taken", EventT, list[EventT])
# An event taken for a batch, its sensors' state, and when it was taken from the stream (monotonic).
TakenEvent = tuple[EventT, Any, float]


class Batch:
    """Events taken at once, and Faust's sensors' state for them, until they are acked."""

    def __init__(self, stream: Stream, sensors: Sensors) -> None:
        self.stream, self.sensors = stream, sensors
        self.events: list[EventT] = []
        self.sensor_states: list[Any] = []  # per event (PerEventSensors), for the same event out
        self.read_at: list[float] = []  # per event: when it was taken from the stream (monotonic)
        self.time_in: float | None = None  # the batch's (BatchSensors)
        self.bytes = 0

    def add(self, event: EventT, sensor_state: Any, read_at: float) -> None:
        self.events.append(event)
        self.sensor_states.append(sensor_state)
        self.read_at.append(read_at)
        self.bytes += event_bytes(event)

    def ack(self) -> None:
        """Done with every event: their offsets may commit."""
        self.sensors.events_out(self)
        self.sensor_states = []

    def __len__(self) -> int:
        return len(self.events)


class BatchMonitor(Protocol):
    """A Faust sensor that also counts a batch of events at once (streamapp.worker.metrics)."""

    def on_events_in(self, stream: Stream, events: int, messages: Sequence[Message]) -> float: ...

    def on_events_out(self, stream: Stream, events: int, time_in: float, finished: Sequence[Message]) -> None: ...


class PerEventSensors:
    """Faust's sensors, called for each event as Faust's stream would."""

    def __init__(self, stream: Stream) -> None:
        self.stream, self.consumer = stream, stream.app.consumer

    def track(self, message: Message) -> None:
        self.consumer.track_message(message)

    def event_in(self, event: EventT) -> Any:
        return streams.event_in(self.stream, event)

    def batch_in(self, batch: Batch) -> None:
        """Each event was counted as it was taken."""

    def events_out(self, batch: Batch) -> None:
        for event, state in zip(batch.events, batch.sensor_states, strict=True):
            ack(self.stream, event, state)

    def let_go(self, batch: Batch) -> None:
        """Let go unacked of events taken but never decided: counted out, never acked."""
        for event, state in zip(batch.events, batch.sensor_states, strict=True):
            streams.event_out(self.stream, event, state, last=False)


class BatchSensors:
    """The worker's monitor, when it is the only sensor: one call per batch in and one out instead
    of four per event (docs/benchmarks.md, "Sensors once per batch"). The counts are the same; an
    event's runtime is its batch's."""

    def __init__(self, stream: Stream, monitor: BatchMonitor) -> None:
        self.stream, self.monitor, self.consumer = stream, monitor, stream.app.consumer

    def track(self, message: Message) -> None:
        streams.track_unsensed(self.consumer, message)  # its sensor call made per batch in batch_in

    def event_in(self, event: EventT) -> Any:
        return None

    def batch_in(self, batch: Batch) -> None:
        tracked = [event.message for event in batch.events if event.message.tracked]
        batch.time_in = self.monitor.on_events_in(self.stream, len(batch.events), tracked)

    def events_out(self, batch: Batch) -> None:
        finished = [event.message for event in batch.events if event.ack()]
        if batch.time_in is not None:  # else never counted in (let go before it was decided)
            self.monitor.on_events_out(self.stream, len(batch.events), batch.time_in, finished)

    def let_go(self, batch: Batch) -> None:
        """Let go unacked of events taken but never decided: never counted in (batch_in), so
        nothing to count out."""


Sensors = PerEventSensors | BatchSensors


def sensors_for(stream: Stream) -> Sensors:
    app = stream.app
    monitor = app.monitor
    # The app registers its monitor as a sensor when it starts.
    if hasattr(monitor, "on_events_in") and all(sensor is monitor for sensor in app.sensors):
        return BatchSensors(stream, cast(BatchMonitor, monitor))
    return PerEventSensors(stream)


class HoldBack(Protocol):
    """Keeps some of the events taken for a batch back for a later batch."""

    def take(self, taken: Sequence[TakenEvent], now: float) -> list[TakenEvent]:
        """Events just taken, with their sensor states and when they were taken, oldest first:
        those to decide now, among them and those held before (``now`` and the times taken:
        monotonic seconds)."""

    def holding(self) -> bool:
        """Whether any event is held."""

    def poll_s(self) -> float:
        """How long the stream may wait for input while events are held: held events are looked
        at again this often."""




def ack(stream: Stream, event: EventT, sensor_state: Any) -> None:
    streams.event_out(stream, event, sensor_state, last=event.ack())


class _BufferedEvents:
    """The stream's side of its channel's buffer: takes events as Faust's stream would."""

    def __init__(self, stream: Stream, hold_back: HoldBack | None = None) -> None:
        self.stream, self.hold_back = stream, hold_back
        # Subscribes: from now on the conductor fills this channel's buffer.
        self.queue = streams.stream_buffer(stream)
        app = stream.app
        self.app, self.acking_topics = app, app.topics.acking_topics
        self.sensors = sensors_for(stream)
        self.batch = Batch(stream, self.sensors)
        self.stopped = False

    async def wait(self, timeout_s: float, until: asyncio.Future | None = None) -> bool:
        """Wait at most ``timeout_s``, or until ``until`` is done, for an event to take; False
        once the agent has been told to stop reading (Faust throws StopAsyncIteration into the
        channel), and from then on."""
        if self.stopped:
            return False
        if self.queue.empty() and not self.batch.events:
            taking = self.queue.get()
            # Shielded: Faust cancels what did not finish first, and ``until`` is not its to cancel.
            waits = (taking,) if until is None else (taking, asyncio.shield(until))
            if self.holding():
                timeout_s = min(timeout_s, cast(HoldBack, self.hold_back).poll_s())
            try:
                waited = await self.stream.wait_first(*waits, timeout=timeout_s)
            except StopAsyncIteration:  # raised inside this generator it would become a RuntimeError
                self.stopped = True  # Faust throws it once, maybe while the agent waits between batches
                return False
            if taking in waited.done:
                self._take(waited.results[waited.done.index(taking)])
        return True

    def fill(self, max_bytes: int, max_events: int) -> bool:
        """Move events waiting in the buffer into the batch; whether it is full."""
        queue, batch = self.queue, self.batch
        while batch.bytes < max_bytes and len(batch) < max_events and not queue.empty():
            self._take(queue.get_nowait())
        return batch.bytes >= max_bytes or len(batch) >= max_events

    def holding(self) -> bool:
        return self.hold_back is not None and self.hold_back.holding()

    def take_batch(self) -> Batch:
        """The events taken so far and those held before, less those the hold-back keeps."""
        batch, self.batch = self.batch, Batch(self.stream, self.sensors)
        if self.hold_back is not None:
            batch = self._ready(batch)
        if batch.events:
            self.sensors.batch_in(batch)
        return batch

    def _ready(self, batch: Batch) -> Batch:
        ready, stale = Batch(self.stream, self.sensors), Batch(self.stream, self.sensors)
        taken = list(zip(batch.events, batch.sensor_states, batch.read_at, strict=True))
        for event, sensor_state, read_at in cast(HoldBack, self.hold_back).take(taken, time.monotonic()):
            # Held over a rebalance or into a stop: never acked, read again from the committed offset.
            (ready if flowing(self.app, event.message) else stale).add(event, sensor_state, read_at)
        self.sensors.let_go(stale)
        return ready

    def _take(self, event: EventT) -> None:
        message = event.message
        if not flowing(self.app, message):
            return  # never acked: read again from the committed offset
        if message.topic in self.acking_topics and not message.tracked:
            message.tracked = True
            self.sensors.track(message)
        self.batch.add(event, self.sensors.event_in(event), time.monotonic())


class Batches:
    """Batches of a stream; between two, the consumer may wait for input with a deadline."""

    def __init__(self, stream: Stream, *, max_bytes: int, max_events: int, linger_s: float = 0.005,
                 idle_s: float = 1.0, hold_back: HoldBack | None = None) -> None:
        self.stream, self.max_bytes, self.max_events = stream, max_bytes, max_events
        self.linger_s, self.idle_s = linger_s, idle_s
        self.events = _BufferedEvents(stream, hold_back)

    async def input_before(self, until: asyncio.Future) -> bool:
        """Whether input for the next batch arrived before ``until`` was done."""
        events = self.events
        await events.wait(self.idle_s, until)
        return bool(events.batch.events) or not events.queue.empty()

    async def __aiter__(self) -> AsyncIterator[Batch]:
        events, stream = self.events, self.stream
        while not stream.should_stop and await events.wait(self.idle_s):
            if not events.fill(self.max_bytes, self.max_events) and events.batch.events:
                await asyncio.sleep(self.linger_s)  # what arrives meanwhile joins this batch
                events.fill(self.max_bytes, self.max_events)
            if events.batch.events or events.holding():
                batch = events.take_batch()
                if batch.events:
                    yield batch


async def acked_when_done(taken: AsyncIterator[Taken]) -> AsyncIterator[Taken]:
    """``stream.events()`` or ``stream.take_events(...)``, except that what the loop over it is
    handling when it is left, by a stop or an exception, is never acked.

    Faust acks an event (or a taken list) in a ``finally`` around its ``yield``, and that runs
    whenever its iterator is closed: when SIGTERM cancels an agent in the middle of a frame, and
    earlier still for ``take_events``, which the stream's own stop closes while the agent is
    still detecting the batch it yielded. The consumer's last commit on the way out then
    committed records nothing was sent for: lost (R12). Here each message holds one more
    reference while the loop handles it, given back only once the loop asks for the next, so no
    ack of Faust's meanwhile is the last one: a record left unhandled is read again after the
    restart."""
    async for item in taken:
        events = item if isinstance(item, list) else [item]
        for event in events:
            streams.keep_unacked(event)
        yield item  # left here (GeneratorExit), the reference stays: never acked
        for event in events:
            event.ack()  # the last ack if Faust's came while the loop handled it
