"""Crafted records on the join's changelog (R11, R4, R20), on the real broker and real RocksDB:
with the store deleted, recovery reads the changelog, skips and counts what it cannot read,
restores the rest, and the join goes on: the frames it restored meet their results. Entries
well-formed up to a header the join cannot read are skipped too: the worker stays up through
their deadlines and their partners' arrival."""

import asyncio
import time

import entrycraft
import pytest
from aiokafka import AIOKafkaProducer

from streamapp.cli.publisher import producer_config
from streamapp.settings import Settings
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tools.harness import Pipeline, read_joined, wait_for
from streamapp.topicadmin import ensure_topics
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


async def _write_changelog(settings: Settings, records) -> None:
    """``(key, value, partition)`` records on the changelog of the join worker of ``settings``."""
    producer = AIOKafkaProducer(**producer_config(settings))
    await producer.start()
    try:
        for key, value, partition in records:
            await producer.send(changelog_name(settings), value, key=key, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


async def _write_crafted(settings: Settings) -> None:
    """Each crafted record on each partition of the changelog of the join worker of ``settings``."""
    await _write_changelog(settings, [(f"{name}:{partition}".encode(), value, partition)
                                      for partition in range(settings.partitions) for name, value in CRAFTED.items()])


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


def test_entries_whose_record_the_join_cannot_read_are_skipped_and_the_join_stays_up(
        kafka_bootstrap, tmp_path, unique_topic):
    """Each crafted entry waits, in the changelog, under the key of a frame of its own: frames
    that get their result after the restart, frames due (their deadline past) at the first
    sweep, and results whose frame comes after the restart. Before the whole record was read,
    the first sweep or the first partner crashed the worker, and every restart again."""
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1,
                        join_ttl_s=3.0, done_marker_ttl_s=300.0, sweep_interval_s=0.5)
    pipeline = Pipeline(settings, tmp_path)
    join_settings, now_ms = pipeline.stage_settings("join"), int(time.time() * 1000)
    cases = [(kind, fault, due) for kind, fault in entrycraft.ALL_CASES
             for due in ((False, True) if kind == EntryKind.FRAME else (False,))]
    crafted = pair_records("crafted", len(cases), start_ms=now_ms, size=(96, 72))
    ordinary = pair_records("ordinary", PENDING, start_ms=now_ms, size=(96, 72))
    entries, partners = [], []
    for (kind, fault, due), (frame, frame_value, result_value, ts) in zip(cases, crafted, strict=True):
        deadline_ms = now_ms + (1_000 if due else 300_000)
        entries.append((frame.id.join_key(), entrycraft.entry(kind, fault, frame, deadline_ms=deadline_ms,
                                                              event_ms=ts), 0))
        if not due:
            partners.append(("detections", result_value, frame, ts) if kind == EntryKind.FRAME
                            else ("frames", frame_value, frame, ts))
    try:
        asyncio.run(ensure_topics(join_settings, layouts=[("join",)]))
        asyncio.run(_write_changelog(join_settings, entries))
        pipeline.start_all(("join",))
        sides = partners + [(role, value, frame, ts) for frame, frame_value, result_value, ts in ordinary
                            for role, value in (("frames", frame_value), ("detections", result_value))]
        asyncio.run(send_at(settings, [(0.0, role, frame.id.bucket_key(settings.bucket_size), value, ts)
                                       for role, value, frame, ts in sides]))

        # Every partner waits in the window, and leaves at its TTL: results as orphans, frames unmatched.
        waiting_frames = sum(role == "frames" for role, *_ in partners)
        settled = asyncio.run(wait_for(lambda: pipeline.exited() or (
            _stat(pipeline, "join_joined_total") == PENDING
            and _stat(pipeline, "join_unmatched_frames_total") == waiting_frames
            and _stat(pipeline, "join_orphan_results_total") == len(partners) - waiting_frames), 60))
        log_path = pipeline.workers["join"].log_path
        assert not pipeline.exited(), f"the join worker exited: see {log_path}"
        assert "Crashed reason" not in log_path.read_text(), f"the join agent or sweep crashed: see {log_path}"
        assert settled is not None, {name: _stat(pipeline, f"join_{name}_total")
                                     for name in ("joined", "unmatched_frames", "orphan_results")}
        assert _stat(pipeline, "join_changelog_records_skipped_total") == len(entries)
        assert _stat(pipeline, "join_unreadable_entries_total") == 0  # none got past the check
        joined = asyncio.run(read_joined(settings))
        assert all(joined.outcomes.get(frame.id) == {"joined"} and joined.copies[frame.id] == 1
                   for frame, *_ in ordinary)
    finally:
        pipeline.stop()
