"""Crafted records on the join's changelog (R11, R4), on the real broker and real RocksDB: with
the store deleted, recovery reads the changelog, skips and counts what it cannot read, restores
the rest, and the join goes on: the frames it restored meet their results."""

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer

from streamapp.settings import Settings
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tools.harness import Pipeline, read_joined, wait_for
from streamapp.tools.publisher import producer_config
from streamapp.topics import changelog_name

from publishing import pair_records, send_at

pytestmark = [pytest.mark.kafka]

PENDING = 12
CRAFTED = {
    "short": b"\x01F",
    "garbage": bytes(range(7, 250, 3)),
    "future version": b"\x07" + Entry(EntryKind.JOINED, 1).encode()[1:],
}


def _stat(pipeline: Pipeline, name: str) -> float:
    try:
        return pipeline.workers["join"].stats().get(name, 0)
    except OSError:
        return 0


async def _write_crafted(settings: Settings) -> None:
    """Each crafted record on each partition of the changelog of the join worker of ``settings``."""
    producer = AIOKafkaProducer(**producer_config(settings))
    await producer.start()
    try:
        for partition in range(settings.partitions):
            for name, value in CRAFTED.items():
                await producer.send(changelog_name(settings), value, key=f"{name}:{partition}".encode(),
                                    partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def test_crafted_changelog_records_are_skipped_and_the_restored_frames_join(kafka_bootstrap, tmp_path, unique_topic):
    # A TTL far beyond the test: the restored frames wait for their results, they never expire.
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=2,
                        join_ttl_s=300.0, done_marker_ttl_s=300.0, sweep_interval_s=0.5)
    pipeline = Pipeline(settings, tmp_path)
    pairs = pair_records("crafted", PENDING, start_ms=int(time.time() * 1000), size=(96, 72))
    try:
        pipeline.start_all(("join",))
        asyncio.run(send_at(settings, [(0.0, "frames", frame.id.bucket_key(settings.bucket_size), value, ts)
                                       for frame, value, _, ts in pairs]))
        assert asyncio.run(wait_for(lambda: _stat(pipeline, "join_pending_entries") == PENDING, 60)) is not None

        pipeline.kill("join", wipe_store=True)
        join_settings = pipeline.stage_settings("join")
        asyncio.run(_write_crafted(join_settings))
        pipeline.start("join")
        skipped = len(CRAFTED) * settings.partitions
        restored = asyncio.run(wait_for(
            lambda: _stat(pipeline, "join_changelog_records_skipped_total") == skipped
            and _stat(pipeline, "join_pending_entries") == PENDING, 60))
        assert restored is not None, (
            f"skipped {_stat(pipeline, 'join_changelog_records_skipped_total')} of {skipped} crafted records, "
            f"{_stat(pipeline, 'join_pending_entries')} of {PENDING} frames restored")
        assert _stat(pipeline, "join_recovery_failure_active") == 0
        log = pipeline.workers["join"].log_path.read_text()
        assert log.count("skipped, and so is every further record") == settings.partitions
        assert f"join changelog {changelog_name(join_settings)} partition 0 offset " in log

        asyncio.run(send_at(settings, [(0.0, "detections", frame.id.bucket_key(settings.bucket_size), value, ts)
                                       for frame, _, value, ts in pairs]))
        assert asyncio.run(wait_for(lambda: _stat(pipeline, "join_joined_total") == PENDING, 60)) is not None
        joined = asyncio.run(read_joined(settings))
        assert set(joined.copies) == {frame.id for frame, *_ in pairs}
        assert set(joined.copies.values()) == {1}
        assert all(outcome == {"joined"} for outcome in joined.outcomes.values())
    finally:
        pipeline.stop()
