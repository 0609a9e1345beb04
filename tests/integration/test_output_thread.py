"""The join's output thread on the real broker: a chunk's records arrive in order (in record batches,
one larger than a batch alone in its own), chunks go out over every connection, an oversized record
is refused by position without holding back the others, and a stopped thread refuses new work."""

import asyncio

import faust
import pytest
from aiokafka import AIOKafkaConsumer

from streamapp.settings import Settings
from streamapp.topicadmin import ensure_topics
from streamapp.topics import max_record_bytes, topic_names
from streamapp.worker.outbox import OUTPUT_CONNECTIONS, OutputThread


@pytest.fixture
def settings(kafka_bootstrap, tmp_path, unique_topic):
    return Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1,
                    max_frame_bytes=64 * 1024, data_dir=tmp_path / "data", out_dir=tmp_path / "out")


async def _read(settings: Settings, topic: str, count: int) -> list[tuple[bytes, bytes]]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.bootstrap_servers, auto_offset_reset="earliest")
    await consumer.start()
    try:
        records = []
        while len(records) < count:
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            records += [(record.key, record.value) for batch in batches.values() for record in batch]
        return records
    finally:
        await consumer.stop()


def test_refuses_an_oversized_record_by_position_and_sends_the_rest(settings):
    async def scenario():
        await ensure_topics(settings)
        joined = topic_names(settings)["joined"]
        # A bare Faust app: the worker's would also size this process's RocksDB pool.
        app = faust.App("test-outputs", broker=settings.broker, producer_max_request_size=max_record_bytes(settings))
        thread = OutputThread(app.producer, name="test-outputs")
        oversized = b"x" * (max_record_bytes(settings) + 1024)
        beyond_a_batch = b"y" * (app.conf.producer_max_batch_size * 2)  # fits a request: goes alone
        records = [(b"a", b"first"), (b"b", oversized), (b"c", b"third"), (b"e", beyond_a_batch)]
        # Handed over together before the producers have started: each chunk over its own connection.
        first = thread.submit(joined, records)
        second = thread.submit(joined, [(b"d", b"fourth")])
        refused = await first
        assert refused[0] is None and refused[2] is None and refused[3] is None
        assert "MessageSizeTooLarge" in refused[1]
        assert await second == [None]
        assert len(thread.producers) == OUTPUT_CONNECTIONS >= 2
        # Chunks over two connections may land in either order; a chunk's own records stay in order.
        arrived = await _read(settings, joined, 4)
        assert sorted(arrived) == [(b"a", b"first"), (b"c", b"third"), (b"d", b"fourth"), (b"e", beyond_a_batch)]
        assert arrived.index((b"a", b"first")) < arrived.index((b"c", b"third")) < arrived.index((b"e", beyond_a_batch))
        await thread.stop()
        assert not thread.thread.is_alive()
        with pytest.raises(RuntimeError, match="shutting down"):
            thread.submit(joined, records)

    asyncio.run(scenario())
