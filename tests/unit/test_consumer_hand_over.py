"""How the consumer hands a fetched record to the streams of its partition
(streamapp.kafka.handover): directly when nothing can wait and every stream reads raw bytes,
giving the stream what Faust's conductor would; through Faust's path otherwise."""

from __future__ import annotations

import asyncio
import types

import faust
import pytest
from aiokafka import TopicPartition
from faust.transport.conductor import ConductorCompiler
from faust.types import TP, Message

from streamapp.kafka.handover import HandOver

TOPIC = TP("frames", 0)


def _app_reading(*serializers: str):
    """A never-started app with one stream channel per serializer on TOPIC, as after an assignment."""
    app = faust.App("hand-over-test", broker="kafka://localhost:1", store="memory://")
    app.flow_control.resume()
    channels = [app.topic(TOPIC.topic, key_serializer="raw", value_serializer=serializer).clone(is_iterator=True)
                for serializer in serializers]
    app.topics._tp_index[TOPIC].update(channels)
    return app, channels


def _message(offset: int = 7) -> Message:
    return Message(TOPIC.topic, TOPIC.partition, offset, 1.0, 0, [("trace", b"1")], b"key", b"value", None)


def _queued(channel) -> list:
    return list(channel.queue._queue)


def test_a_raw_record_reaches_every_stream_as_fausts_conductor_delivers_it():
    async def scenario():
        app, channels = _app_reading("raw", "raw")
        direct, via_faust = _message(), _message()
        assert HandOver(app).now(direct)
        ours = [_queued(channel) for channel in channels]
        for channel in channels:
            channel.queue.clear()
        await ConductorCompiler().build(app.topics, TOPIC, set(channels))(via_faust)
        theirs = [_queued(channel) for channel in channels]
        assert [len(events) for events in ours] == [len(events) for events in theirs] == [1, 1]
        assert ours[0][0] is ours[1][0]  # one event for streams with the same key and value types, as Faust
        for event, faust_event in ((ours[0][0], theirs[0][0]), (ours[1][0], theirs[1][0])):
            assert type(event) is type(faust_event)
            assert (event.key, event.value, event.headers) == (faust_event.key, faust_event.value, faust_event.headers)
        assert event.message is direct and direct.refcount == via_faust.refcount == 2
    asyncio.run(scenario())


def test_after_a_rebalance_records_go_to_the_streams_indexed_then():
    async def scenario():
        app, (before,) = _app_reading("raw")
        hand_over = HandOver(app)
        assert hand_over.now(_message(1))
        after = app.topic(TOPIC.topic, key_serializer="raw", value_serializer="raw").clone(is_iterator=True)
        app.topics._tp_index.clear()  # as Faust rebuilds its index on an assignment
        app.topics._tp_index[TOPIC].add(after)
        assert hand_over.now(_message(2))
        assert [event.message.offset for event in _queued(before)] == [1]
        assert [event.message.offset for event in _queued(after)] == [2]
    asyncio.run(scenario())


def test_a_stream_that_decodes_leaves_the_record_to_faust():
    async def scenario():
        app, channels = _app_reading("raw", "json")
        message = _message()
        assert not HandOver(app).now(message)
        assert message.refcount == 0 and not any(_queued(channel) for channel in channels)
    asyncio.run(scenario())


def test_a_partition_without_streams_is_left_to_faust():
    async def scenario():
        app, _ = _app_reading("raw")
        message = Message("other", 3, 0, 1.0, 0, [], b"k", b"v", None)
        assert not HandOver(app).now(message)
    asyncio.run(scenario())


def test_a_buffer_under_high_pressure_pauses_its_partition_as_fausts_does():
    async def scenario():
        app, (channel,) = _app_reading("raw")
        consumer = app.consumer
        consumer._active_partitions = {TOPIC}  # as after an assignment
        hand_over = HandOver(app)
        for offset in range(channel.queue.pressure_high_size + 1):
            message = _message(offset)
            message.tp = TopicPartition(*TOPIC)  # fetched records name their partition as aiokafka does
            assert hand_over.now(message)
        assert consumer._buffered_partitions == {TOPIC} and TOPIC not in consumer._get_active_partitions()
        while not channel.queue.empty():
            channel.queue.get_nowait()
        # Drained: fetched again. Faust's books take only its own TP (it asserts so when it reads them).
        assert consumer._get_active_partitions() == {TOPIC} and consumer._buffered_partitions == set()
    asyncio.run(scenario())


def _waits_app(*, flow_active=True, lock_held=False, buffered=0, buffer_limit=100, queues_full=(False,)):
    lock = asyncio.Lock()
    if lock_held:
        lock._locked = True  # type: ignore[attr-defined]  # held by a callback-map update
    conductor = types.SimpleNamespace(
        _tp_to_callback_lock=lock,
        _tp_index={TOPIC: [types.SimpleNamespace(queue=types.SimpleNamespace(full=lambda full=full: full))
                           for full in queues_full]})
    return types.SimpleNamespace(
        topics=conductor, conf=types.SimpleNamespace(Event=None), consumer=None, sensors=None,
        flow_control=types.SimpleNamespace(is_active=lambda: flow_active),
        producer=types.SimpleNamespace(buffer=types.SimpleNamespace(size=buffered, max_messages=buffer_limit)))


def test_a_record_goes_straight_to_a_stream_with_room():
    assert not HandOver(_waits_app()).may_wait(TOPIC)


def test_a_partition_without_streams_never_waits():
    assert not HandOver(_waits_app()).may_wait(TP("other", 3))


@pytest.mark.parametrize("state", [
    {"flow_active": False},           # a rebalance suspended the flow
    {"lock_held": True},              # the conductor is rebuilding its callbacks
    {"buffered": 101},                # the producer's send buffer is over its limit
    {"queues_full": (False, True)},   # one of the partition's stream buffers is full
])
def test_a_hand_over_that_can_wait_takes_fausts_race(state):
    assert HandOver(_waits_app(**state)).may_wait(TOPIC)
