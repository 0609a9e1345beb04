"""Input that the broker deletes before a worker reads it is counted, per partition, exactly: a
worker whose committed offset lies below its partition's log start offset skips to the log start
(the Kafka client does, silently), and says how many records it skipped; so does a running worker
that fell behind the log start. Records deleted after they were read count nothing."""

import asyncio
import os
import signal

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete

from streamapp.settings import Settings
from streamapp.tools.harness import Pipeline, publish_frames, wait_for
from streamapp.topicadmin import ensure_topics
from streamapp.topics import topic_names

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

PRODUCED, LOG_START = 40, 25
METRIC = 'kafka_consumer_deleted_unread_records_total{topic="%s",partition="0"}'


async def _commit(settings: Settings, group: str, tp: TopicPartition, offset: int) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


async def _delete_before(settings: Settings, tp: TopicPartition, offset: int) -> None:
    """What retention does to old segments, at an offset of our choosing: the log start moves."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        assert await admin.delete_records({tp: RecordsToDelete(offset)}) == {tp: offset}
    finally:
        await admin.close()


# Committed 1: the worker has read offset 0 only, and a record read at offset 0 is a last read
# like any other (a gap right after it was once taken for nothing read).
@pytest.mark.parametrize("committed", [7, 1])
def test_records_deleted_before_a_worker_read_them_are_counted_exactly(kafka_bootstrap, tmp_path, unique_topic,
                                                                        committed):
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1)
    pipeline = Pipeline(settings, tmp_path)
    frames = TopicPartition(topic_names(settings)["frames"], 0)
    asyncio.run(ensure_topics(settings))
    asyncio.run(publish_frames(settings, "cam", PRODUCED, seed=1))
    # The resize stage had read some frames when it went down; retention has since deleted up to 25.
    asyncio.run(_commit(settings, pipeline.stage_settings("resize").group_id, frames, committed))
    asyncio.run(_delete_before(settings, frames, LOG_START))

    def stats():
        try:
            return pipeline.workers["resize"].stats()
        except OSError:
            return {}

    counted = METRIC % frames.topic
    try:
        pipeline.start_all(("resize",))
        assert asyncio.run(wait_for(lambda: stats().get("resize_frames_in_total") == PRODUCED - LOG_START
                                    and counted in stats(), 60)) is not None, stats()
        assert asyncio.run(wait_for(lambda: stats()[counted] > 0, 10)) is not None
        assert stats()[counted] == LOG_START - committed
        log = pipeline.workers["resize"].log_path
        warnings = [line for line in log.read_text().splitlines() if "deleted by the broker's retention" in line]
        assert len(warnings) == 1 and f"{LOG_START - committed} records of {frames.topic} partition 0" in warnings[0]

        # Records deleted after the worker read them are no loss: nothing more is counted.
        asyncio.run(_delete_before(settings, frames, PRODUCED))
        asyncio.run(publish_frames(settings, "cam", 5, seed=2))
        assert asyncio.run(wait_for(lambda: stats().get("resize_frames_in_total") == PRODUCED - LOG_START + 5,
                                    60)) is not None
        asyncio.run(asyncio.sleep(2))  # past the next judgement of gaps
        assert stats()[counted] == LOG_START - committed

        # A worker that falls behind while running: stopped (its fetch in flight answered empty
        # meanwhile, within the session timeout), 20 records arrive and retention deletes 15 of them.
        worker = pipeline.workers["resize"].process.pid
        os.killpg(worker, signal.SIGSTOP)
        try:
            asyncio.run(asyncio.sleep(2))
            asyncio.run(publish_frames(settings, "cam", 20, seed=3))
            asyncio.run(_delete_before(settings, frames, PRODUCED + 5 + 15))
        finally:
            os.killpg(worker, signal.SIGCONT)
        assert asyncio.run(wait_for(lambda: stats().get("resize_frames_in_total") == PRODUCED - LOG_START + 10
                                    and stats()[counted] == LOG_START - committed + 15, 60)) is not None, stats()
    finally:
        pipeline.stop()
