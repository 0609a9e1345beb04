"""The window's changelog writer: records go to the producer in order, in as few record batches
as they fill, one callback per write moves the offset marker to the last record's offset, and a
record that was not delivered stops the worker. Under exactly-once the records go through the
partition's transactional producer and the marker moves once the store holds them."""

import asyncio
from types import SimpleNamespace

from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.structs import RecordMetadata

from streamapp.tables.changelog import ChangelogWriter

TOPIC = "app-join-changelog"


class KafkaProducer:
    """aiokafka's batch interface with real batch builders (``batch_size`` bytes each); the test
    resolves each batch's future, as the producer does on acknowledgement."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.sent: list[tuple[BatchBuilder, int, asyncio.Future]] = []

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(self.batch_size, 0)  # uncompressed

    async def send_batch(self, batch, topic, *, partition):
        assert topic == TOPIC
        delivery = asyncio.get_running_loop().create_future()
        self.sent.append((batch, partition, delivery))
        return delivery

    def records(self) -> list[list[tuple[bytes, bytes | None, int]]]:
        """Each batch's records as (key, value, partition), read back from its bytes."""
        return [[(record.key, record.value, partition) for record in DefaultRecordBatch(bytes(batch._build()))]
                for batch, partition, _ in self.sent]


def _writer(*, batch_size=16384):
    kafka, crashes, marked = KafkaProducer(batch_size), [], []

    def mark(tp, offset):
        marked.append((tp.partition, offset))

    async def crash(reason):
        crashes.append(reason)

    app = SimpleNamespace(crash=crash, producer=SimpleNamespace(_ensure_producer=lambda: kafka))
    store = SimpleNamespace(set_persisted_offset=mark)
    table = SimpleNamespace(app=app, data=store, changelog_topic=SimpleNamespace(get_topic_name=lambda: TOPIC))
    return ChangelogWriter(table), kafka, crashes, marked


def _ack(delivery: asyncio.Future, partition: int, offset: int) -> None:
    delivery.set_result(RecordMetadata(TOPIC, partition, None, offset, -1, 0, 0))


def test_records_go_out_in_order_in_one_batch_and_the_marker_moves_to_the_last_one():
    async def scenario():
        writer, kafka, crashes, marked = _writer()
        await writer.send(2, [(b"a", b"1"), (b"b", None), (b"c", b"3")])
        assert kafka.records() == [[(b"a", b"1", 2), (b"b", None, 2), (b"c", b"3", 2)]]
        _ack(kafka.sent[0][2], 2, 10)  # the batch's first record is at offset 10
        await asyncio.sleep(0)
        return crashes, marked

    crashes, marked = asyncio.run(scenario())
    assert crashes == [] and marked == [(2, 12)]


def test_records_past_a_full_batch_go_in_the_next_and_the_marker_waits_for_the_last():
    async def scenario():
        writer, kafka, crashes, marked = _writer(batch_size=200)
        changes = [(f"key-{index}".encode(), b"v" * 50) for index in range(7)]
        await writer.send(0, changes)
        batches = kafka.records()
        assert len(batches) > 1 and [record for batch in batches for record in batch] == [
            (key, value, 0) for key, value in changes]
        offset = 100
        for batch, (_, partition, delivery) in zip(batches[:-1], kafka.sent[:-1], strict=True):
            _ack(delivery, partition, offset)
            offset += len(batch)
        await asyncio.sleep(0)
        assert marked == []  # the last batch is not acknowledged yet
        _ack(kafka.sent[-1][2], 0, offset)
        await asyncio.sleep(0)
        return crashes, marked

    crashes, marked = asyncio.run(scenario())
    assert crashes == [] and marked == [(0, 106)]


def test_under_exactly_once_the_marker_moves_only_when_told_the_store_holds_the_changes():
    async def scenario():
        writer, faust_kafka, crashes, marked = _writer()
        transactional = KafkaProducer(16384)
        deliveries = await writer.send_in_transaction(transactional, 1, [(b"a", b"1"), (b"b", b"2")])
        assert faust_kafka.sent == [] and transactional.records() == [[(b"a", b"1", 1), (b"b", b"2", 1)]]
        _ack(transactional.sent[0][2], 1, 40)
        await asyncio.sleep(0)
        assert marked == []  # delivered, but the transaction has not committed yet
        writer.persisted(1, deliveries)
        return crashes, marked

    crashes, marked = asyncio.run(scenario())
    assert crashes == [] and marked == [(1, 41)]


def test_a_batch_not_delivered_stops_the_worker_and_moves_no_marker():
    async def scenario():
        writer, kafka, crashes, marked = _writer(batch_size=200)
        await writer.send(0, [(f"key-{index}".encode(), b"v" * 50) for index in range(7)])
        kafka.sent[0][2].set_exception(OSError("broker gone"))
        for _, partition, delivery in kafka.sent[1:]:
            _ack(delivery, partition, 5)
        for _ in range(3):
            await asyncio.sleep(0)
        return crashes, marked

    crashes, marked = asyncio.run(scenario())
    assert [str(reason) for reason in crashes] == ["broker gone"] and marked == []
