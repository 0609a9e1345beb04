"""Fetched records handed to the streams of their partition, directly when nothing can wait.

Faust's conductor hands each fetched record over through a chain of coroutines: its callback lock,
flow control, the producer's buffer, a decode per stream, then the stream's buffer. The consumer
also races each hand-over against flow suspension, stop and crash. Only flow control (a rebalance),
the callback lock, a producer buffer over its limit or a full stream buffer can make it wait, and
whether one holds is known beforehand (:meth:`HandOver.may_wait`). When none holds and every stream
of the partition reads raw keys and values (the decode then returns the bytes as fetched), the
record is put into the buffers here, without a coroutine: the same event, reference count, buffers
and pressure callbacks as Faust's. Otherwise Faust's path runs as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from faust.serializers.schemas import Schema
from faust.transport.conductor import Conductor
from faust.types import TP, AppT, EventT, Message


class _Route:
    """The streams of one partition as the conductor indexed them: their buffers, whether every one
    reads raw bytes, and the partition's pressure callbacks (Faust's: a buffer under high pressure
    counts as full and pauses the partition in the fetcher until it has drained)."""

    __slots__ = ("channels", "count", "queues", "raw", "on_high", "on_drop")

    def __init__(self, app: AppT, tp: TP, channels: Any) -> None:
        self.channels, self.count = channels, len(channels)  # the index's set, to notice a new one
        self.queues = tuple(channel.queue for channel in channels)
        self.raw = bool(channels) and all(_reads_raw(channel) for channel in channels)
        consumer, sensors = app.consumer, app.sensors
        tp = TP(tp.topic, tp.partition)  # a message's may be aiokafka's: Faust asserts its own

        def on_high() -> None:
            sensors.on_topic_buffer_full(tp)
            consumer.on_buffer_full(tp)

        def on_drop() -> None:
            consumer.on_buffer_drop(tp)

        self.on_high, self.on_drop = on_high, on_drop


class HandOver:
    """Where a fetched record goes, for one consumer of ``app``."""

    def __init__(self, app: AppT) -> None:
        self.app = app
        self.conductor = cast(Conductor, app.topics)
        self.create_event = cast(Callable[..., EventT], app.conf.Event)  # the class Faust makes events of
        self._routes: dict[TP, _Route] = {}

    def may_wait(self, tp: TP) -> bool:
        """Whether handing a record of ``tp`` to its streams could suspend."""
        app = self.app
        buffer = app.producer.buffer
        if (not app.flow_control.is_active() or self.conductor._tp_to_callback_lock.locked()
                or buffer.size > buffer.max_messages):
            return True
        for queue in self._route(tp).queues:
            if queue.full():
                return True
        return False

    def now(self, message: Message) -> bool:
        """Put ``message`` into its streams' buffers, as Faust's handler would when nothing waits;
        False, and nothing done, where a stream decodes (Faust's handler must run)."""
        route = self._route(message.tp)
        if not route.raw:
            return False
        message.incref(route.count)  # before any put: a stream must not ack it to zero meanwhile
        event = self.create_event(self.app, message.key, message.value, message.headers, message)
        for queue in route.queues:
            queue.put_nowait_enhanced(event, on_pressure_high=route.on_high, on_pressure_drop=route.on_drop)
        return True

    def _route(self, tp: TP) -> _Route:
        channels = self.conductor._tp_index.get(tp, ())
        route = self._routes.get(tp)
        # A rebalance rebuilds the index with new sets; within one, a set only grows while it is built.
        if route is None or route.channels is not channels or route.count != len(channels):
            route = self._routes[tp] = _Route(self.app, tp, channels)
        return route


def _reads_raw(channel: Any) -> bool:
    """Whether a stream's decode returns the record's key and value bytes as they are."""
    schema = getattr(channel, "schema", None)
    return (type(schema) is Schema and schema.key_type is None and schema.value_type is None
            and schema.key_serializer == "raw" and schema.value_serializer == "raw")
