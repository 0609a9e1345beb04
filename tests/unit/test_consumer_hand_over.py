"""When the consumer may hand a fetched record to its streams directly, without Faust's race
against flow suspension, stop and crash (streamapp.worker.consumer)."""

from __future__ import annotations

import asyncio
import types

import pytest
from faust.types import TP

from streamapp.worker.consumer import StreamappConsumer

TOPIC = TP("frames", 0)


class Queue:
    def __init__(self, full: bool) -> None:
        self._full = full

    def full(self) -> bool:
        return self._full


def _consumer(*, flow_active=True, lock_held=False, buffered=0, buffer_limit=100, queues_full=(False,)):
    lock = asyncio.Lock()
    if lock_held:
        lock._locked = True  # type: ignore[attr-defined]  # held by a callback-map update
    conductor = types.SimpleNamespace(
        _tp_to_callback_lock=lock,
        _tp_index={TOPIC: [types.SimpleNamespace(queue=Queue(full)) for full in queues_full]})
    app = types.SimpleNamespace(
        topics=conductor,
        flow_control=types.SimpleNamespace(is_active=lambda: flow_active),
        producer=types.SimpleNamespace(buffer=types.SimpleNamespace(size=buffered, max_messages=buffer_limit)))
    return types.SimpleNamespace(app=app)


def test_a_record_goes_straight_to_a_stream_with_room():
    assert not StreamappConsumer.hand_over_may_wait(_consumer(), TOPIC)


def test_a_partition_without_streams_never_waits():
    assert not StreamappConsumer.hand_over_may_wait(_consumer(), TP("other", 3))


@pytest.mark.parametrize("state", [
    {"flow_active": False},           # a rebalance suspended the flow
    {"lock_held": True},              # the conductor is rebuilding its callbacks
    {"buffered": 101},                # the producer's send buffer is over its limit
    {"queues_full": (False, True)},   # one of the partition's stream buffers is full
])
def test_a_hand_over_that_can_wait_takes_fausts_race(state):
    assert StreamappConsumer.hand_over_may_wait(_consumer(**state), TOPIC)
