"""The window's changelog writer: records go to the producer in order, one callback per write
moves the offset marker, and a record that was not delivered stops the worker."""

import asyncio
from types import SimpleNamespace

from aiokafka.structs import RecordMetadata

from streamapp.tables.changelog import ChangelogWriter

TOPIC = "app-join-changelog"


class Producer:
    """Futures the test resolves, as the Kafka producer resolves them on acknowledgement."""

    def __init__(self):
        self.sent = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        delivery = asyncio.get_running_loop().create_future()
        self.sent.append((topic, key, value, partition, delivery))
        return delivery


def _writer():
    producer, crashes, marked = Producer(), [], []

    async def crash(reason):
        crashes.append(reason)

    app = SimpleNamespace(in_transaction=False, producer=producer, crash=crash)
    store = SimpleNamespace(set_persisted_offset=lambda tp, offset: marked.append((tp.partition, offset)))
    table = SimpleNamespace(app=app, data=store, changelog_topic=SimpleNamespace(get_topic_name=lambda: TOPIC))
    return ChangelogWriter(table), producer, crashes, marked


def _ack(sent, offset):
    *_, partition, delivery = sent
    delivery.set_result(RecordMetadata(TOPIC, partition, None, offset, -1, 0, 0))


def test_records_go_out_in_order_and_the_marker_moves_once_per_write():
    async def scenario():
        writer, producer, crashes, marked = _writer()
        await writer.send(2, [(b"a", b"1"), (b"b", None), (b"c", b"3")])
        assert [(key, value, partition) for _, key, value, partition, _ in producer.sent] == [
            (b"a", b"1", 2), (b"b", None, 2), (b"c", b"3", 2)]
        for offset, sent in enumerate(producer.sent):
            _ack(sent, 10 + offset)
        await asyncio.sleep(0)
        return crashes, marked

    crashes, marked = asyncio.run(scenario())
    assert crashes == [] and marked == [(2, 12)]


def test_a_record_not_delivered_stops_the_worker_and_moves_no_marker():
    async def scenario():
        writer, producer, crashes, marked = _writer()
        await writer.send(0, [(b"a", b"1"), (b"b", b"2")])
        producer.sent[0][-1].set_exception(OSError("broker gone"))
        _ack(producer.sent[1], 5)
        for _ in range(3):
            await asyncio.sleep(0)
        return crashes, marked

    crashes, marked = asyncio.run(scenario())
    assert [str(reason) for reason in crashes] == ["broker gone"] and marked == []
