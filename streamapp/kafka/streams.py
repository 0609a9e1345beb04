"""What streamapp.batches needs of a Faust stream beyond its public API: its buffer, its sensor
hooks, the consumer's set of unacked messages, and a message's reference count."""

from __future__ import annotations

from typing import Any, cast

from faust import Stream
from faust.types import AppT, ChannelT, EventT, Message


def stream_buffer(stream: Stream) -> Any:
    """The buffer the conductor fills for ``stream`` (subscribing it from now on)."""
    return cast(ChannelT, aiter(stream.channel)).queue


def event_in(stream: Stream, event: EventT) -> Any:
    """Faust's sensors told of ``event`` as the stream takes it; their state, for :func:`event_out`."""
    message = event.message
    return stream._on_stream_event_in(message.tp, message.offset, stream, event)


def event_out(stream: Stream, event: EventT, sensor_state: Any, last: bool) -> None:
    """Faust's sensors told the stream is done with ``event`` (``last``: its message fully acked)."""
    message = event.message
    stream._on_stream_event_out(message.tp, message.offset, stream, event, sensor_state)
    if last:
        stream._on_message_out(message.tp, message.offset, message)


def track_unsensed(consumer: Any, message: Message) -> None:
    """What ``Consumer.track_message`` does but its sensor call: the message's offset waits for its ack."""
    consumer._unacked_messages.add(message)


def keep_unacked(event: EventT) -> None:
    """One more reference on the event's message, so that Faust's coming ack leaves it unacked."""
    event.message.incref()

def flowing(app: AppT, message: Message) -> bool:
    """Whether ``message`` may be handled now: flow is not suspended (by a rebalance or a stop)
    and it was fetched in the consumer's current generation. If not, it is read again from the
    committed offset, so it must never be acked."""
    return app.flow_control.is_active() and message.generation_id == app.consumer_generation_id
