"""An outbox's ``acked()`` is only for waiting: it is done once every output is acknowledged or
failed, never fails itself, and ``delivered()`` is where a failure is raised; the outputs on their
way are counted until they are acknowledged (streamapp.worker.outbox)."""

from __future__ import annotations

import asyncio
import gc

import pytest
from aiokafka.errors import KafkaError

from streamapp.worker.outbox import CHUNK_RECORDS, OutputsInFlight, ThreadOutbox


class _Submitting:
    """An output thread's submit: each chunk's future, in turn."""

    def __init__(self, deliveries: list[asyncio.Future]) -> None:
        self.deliveries = iter(deliveries)

    def submit(self, topic, records) -> asyncio.Future:
        return next(self.deliveries)


class _Topic:
    def get_topic_name(self) -> str:
        return "joined"


def test_acked_waits_for_all_outputs_and_leaves_a_failure_to_delivered():
    async def scenario():
        loop = asyncio.get_running_loop()
        unhandled: list[dict] = []
        loop.set_exception_handler(lambda loop, context: unhandled.append(context))
        failed, sent = loop.create_future(), loop.create_future()
        in_flight = OutputsInFlight()
        outbox = ThreadOutbox(_Topic(), dead_letters=None, stage="join",  # type: ignore[arg-type]
                              thread=_Submitting([failed, sent]), in_flight=in_flight)
        for _ in range(2):  # two chunks
            for _ in range(CHUNK_RECORDS):
                await outbox.add(object(), b"key", b"value")
        acked = outbox.acked()
        failed.set_exception(KafkaError("broker gone"))
        await asyncio.sleep(0)
        assert not acked.done()  # the other output is still on its way
        assert in_flight.as_metrics() == {"outputs_in_flight_records": CHUNK_RECORDS,
                                          "outputs_in_flight_bytes": 5 * CHUNK_RECORDS, "outputs_acked_total": 0}
        sent.set_result([None] * CHUNK_RECORDS)
        await acked  # done, and does not raise
        assert in_flight.as_metrics() == {"outputs_in_flight_records": 0, "outputs_in_flight_bytes": 0,
                                          "outputs_acked_total": CHUNK_RECORDS}
        # A waiter that stopped waiting (input came first) drops it: nothing is left unretrieved.
        outbox.acked()
        await asyncio.sleep(0)
        gc.collect()
        assert unhandled == []
        with pytest.raises(KafkaError, match="broker gone"):
            await outbox.delivered()

    asyncio.run(scenario())


def test_outputs_count_in_flight_until_acknowledged_and_refused_ones_are_not_acked():
    async def scenario():
        loop = asyncio.get_running_loop()
        in_flight = OutputsInFlight()
        chunk, other, lost = loop.create_future(), loop.create_future(), loop.create_future()
        in_flight.track(chunk, 3, 300)
        in_flight.track(other, 1, 50)
        in_flight.track(lost, 2, 20)
        assert (in_flight.records, in_flight.bytes) == (6, 370)
        chunk.set_result([None, "MessageSizeTooLargeError", None])  # a chunk: the refusal of each
        other.set_result(object())                                  # one output's metadata
        lost.set_exception(KafkaError("broker gone"))
        await asyncio.sleep(0)
        assert in_flight.as_metrics() == {"outputs_in_flight_records": 0, "outputs_in_flight_bytes": 0,
                                          "outputs_acked_total": 3}
        lost.exception()

    asyncio.run(scenario())


def test_a_value_in_pieces_is_refused_where_its_joined_bytes_are():
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import MessageSizeTooLargeError

    from streamapp.kafka.producer import check_size
    from streamapp.recordbatches import Pieces

    async def check() -> None:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", max_request_size=10_000)
        head, outcomes = b"h" * 100, set()
        for body_size in range(9_780, 9_900, 3):  # across the limit, as its record overhead counts
            body = memoryview(bytes(body_size))
            refused = []
            for value in (head + bytes(body), Pieces(head, body)):
                try:
                    check_size(producer, b"cam0:1:7", value)
                    refused.append(False)
                except MessageSizeTooLargeError:
                    refused.append(True)
            assert refused[0] == refused[1], body_size
            outcomes.add(refused[0])
        assert outcomes == {False, True}
        await producer.stop()

    asyncio.run(check())
