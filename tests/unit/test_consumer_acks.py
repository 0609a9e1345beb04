"""Which acks the consumer takes for the commit: none for a record a stream skipped unhandled
because flow was suspended (a stop or a rebalance began) or it was fetched in an earlier
generation; Faust's stream acks those, and the stop's last commit took their offsets."""

from __future__ import annotations

import asyncio
import contextlib

import faust
import pytest
from faust.types import TP, Message

from streamapp.kafka import consumer

TOPIC = TP("frames", 0)


class App(faust.App):
    def _new_transport(self):
        return consumer.Transport(self.conf.broker_consumer, self)


def _app_streaming():
    """A never-started app with our consumer and a stream of TOPIC (an acking topic), flowing."""
    app = App("consumer-acks-test", broker="kafka://localhost:1", store="memory://")
    topic = app.topic(TOPIC.topic, key_serializer="raw", value_serializer="raw")
    app.topics._acking_topics.add(TOPIC.topic)  # as the conductor's index does once subscribed
    app.flow_control.resume()
    return app, topic, app.stream(topic)


def _event(app, offset: int):
    message = Message(TOPIC.topic, TOPIC.partition, offset, 1.0, 0, [], b"k", b"v", None,
                      generation_id=app.consumer_generation_id)
    message.incref()  # as the conductor does for the one stream it delivers to
    return app.create_event(b"k", b"v", [], message)


def _committable(app) -> list[int]:
    return sorted(app.consumer._acked[TOPIC])


@pytest.mark.parametrize("skipped_by", ["stop", "rebalance"])
def test_a_record_faust_s_stream_skips_is_not_committable(skipped_by):
    async def scenario():
        app, topic, stream = _app_streaming()
        handled = []

        async def agent():
            async for event in stream.events():
                handled.append(event)

        task = asyncio.ensure_future(agent())
        await asyncio.sleep(0.01)
        first = _event(app, 0)
        stream.channel.queue.put_nowait(first)
        await asyncio.sleep(0.01)
        if skipped_by == "stop":
            app.flow_control.suspend()
        else:
            app.consumer_generation_id += 1
        late = _event(app, 1)
        late.message.generation_id = 0 if skipped_by == "rebalance" else late.message.generation_id
        stream.channel.queue.put_nowait(late)  # a hand-over already under way
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert handled == [first]
        assert first.message.acked
        assert _committable(app) == [0]  # the skipped one waits to be read again

    asyncio.run(scenario())


def test_a_record_handled_before_a_stop_and_acked_during_it_is_committable():
    async def scenario():
        app, topic, stream = _app_streaming()
        handling = asyncio.Event()
        acked = []

        async def agent():
            async for event in stream.events():
                handling.set()
                await asyncio.sleep(0.05)  # the stop comes while this one is handled
                acked.append(event)

        task = asyncio.ensure_future(agent())
        await asyncio.sleep(0.01)
        stream.channel.queue.put_nowait(_event(app, 0))
        await handling.wait()
        app.flow_control.suspend()
        await asyncio.sleep(0.1)  # handled, then acked as the loop asks for the next
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert len(acked) == 1 and _committable(app) == [0]

    asyncio.run(scenario())
