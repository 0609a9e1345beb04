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

_PressureCallbacks = tuple[Callable[[], None], Callable[[], None]]


class HandOver:
    """Where a fetched record goes, for one consumer of ``app``."""

    def __init__(self, app: AppT) -> None:
        self.app = app
        self.conductor = cast(Conductor, app.topics)
        self.create_event = cast(Callable[..., EventT], app.conf.Event)  # the class Faust makes events of
        self._raw: dict[Any, bool] = {}  # per stream channel: whether its decode returns the bytes
        self._pressure: dict[TP, _PressureCallbacks] = {}

    def may_wait(self, tp: TP) -> bool:
        """Whether handing a record of ``tp`` to its streams could suspend."""
        app, conductor = self.app, self.conductor
        buffer = app.producer.buffer
        return (not app.flow_control.is_active()
                or conductor._tp_to_callback_lock.locked()
                or buffer.size > buffer.max_messages
                or any(channel.queue.full() for channel in conductor._tp_index.get(tp, ())))

    def now(self, message: Message) -> bool:
        """Put ``message`` into its streams' buffers, as Faust's handler would when nothing waits;
        False, and nothing done, where a stream decodes (Faust's handler must run)."""
        channels = self.conductor._tp_index.get(message.tp)
        if not channels or not all(self._reads_raw(channel) for channel in channels):
            return False
        message.incref(len(channels))  # before any put: a stream must not ack it to zero meanwhile
        event = self.create_event(self.app, message.key, message.value, message.headers, message)
        on_high, on_drop = self._pressure_callbacks(message.tp)
        for channel in channels:
            channel.queue.put_nowait_enhanced(event, on_pressure_high=on_high, on_pressure_drop=on_drop)
        return True

    def _reads_raw(self, channel: Any) -> bool:
        raw = self._raw.get(channel)
        if raw is None:
            schema = getattr(channel, "schema", None)
            raw = self._raw[channel] = (
                type(schema) is Schema and schema.key_type is None and schema.value_type is None
                and schema.key_serializer == "raw" and schema.value_serializer == "raw")
        return raw

    def _pressure_callbacks(self, tp: TP) -> _PressureCallbacks:
        """Faust's: a buffer under high pressure counts as full and pauses ``tp`` in the fetcher,
        until it has drained. One pair per partition: a buffer keeps each pending callback once."""
        callbacks = self._pressure.get(tp)
        if callbacks is None:
            consumer, sensors = self.app.consumer, self.app.sensors
            key, tp = tp, TP(tp.topic, tp.partition)  # a message's may be aiokafka's: Faust asserts its own

            def on_high() -> None:
                sensors.on_topic_buffer_full(tp)
                consumer.on_buffer_full(tp)

            def on_drop() -> None:
                consumer.on_buffer_drop(tp)

            callbacks = self._pressure[key] = (on_high, on_drop)
        return callbacks

