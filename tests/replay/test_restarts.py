"""Replay scenarios that kill the join worker: each has workers of its own.

A restarted worker with the same data dir and web port rejoins as the same static member and
gets its partitions back at once; one with others waits until the broker gives up on the killed
member (the 10 s session timeout). Every wait here is measured from what the new worker reports,
not from when it was started.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import time

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamapp.settings import Settings
from streamapp.sinkfiles import frame_path
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.replay.predict import Prediction, predict
from streamapp.tools.replay.publish import ReplayTarget, Sent, publish
from streamapp.tools.replay.scenario import Scenario
from streamapp.tools.workers import Worker
from streamapp.topics import topic_names

from harness import (
    COUNTERS,
    SCENARIOS,
    SLACK_S,
    JoinedReader,
    Outcome,
    Sampler,
    consumed_within_ms,
    counter_delta,
    counter_values,
    expected_counts,
    join_settings,
    plan_for,
    sent_sides,
    start_join,
    to_pipeline,
    unmatched_departures,
    wait_until,
)

pytestmark = pytest.mark.replay

RESTARTS = SCENARIOS / "restarts"


def _sum(*counts: dict[str, int]) -> dict[str, int]:
    return {key: sum(count[key] for count in counts) for key in COUNTERS}


async def uncommitted_records(settings: Settings) -> int:
    """Records of the join's inputs beyond the join group's committed offsets: what a restarted
    worker processes again."""
    names = topic_names(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(settings.group_id)
        partitions = [tp for tp in committed if tp.topic in (names["frames"], names["detections"])]
        await consumer._client.force_metadata_update()
        inputs = [tp for topic in (names["frames"], names["detections"])
                  for tp in _partitions(consumer, topic)]
        ends = await consumer.end_offsets(inputs)
        done = {tp: committed[tp].offset for tp in partitions}
        return sum(end - max(0, done.get(tp, 0)) for tp, end in ends.items())
    finally:
        await consumer.stop()
        await admin.close()


def _partitions(consumer: AIOKafkaConsumer, topic: str):
    return [TopicPartition(topic, number) for number in sorted(consumer.partitions_for_topic(topic) or ())]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_join_killed_mid_replay_loses_no_frame(kafka_bootstrap, tmp_path, guarantee):
    scenario = Scenario.load(RESTARTS / "join-killed-mid-replay.json")
    settings = join_settings(kafka_bootstrap, scenario, tmp_path / "join", guarantee)
    join = start_join(settings, tmp_path / "logs-1")
    sink_settings = settings.replace(stages=("sink",), web_port=free_port(), data_dir=tmp_path / "sink",
                                     out_dir=tmp_path / "out")
    sink = Worker("sink", sink_settings, tmp_path / "logs-1")
    try:
        wait_until(sink.ready, 120, "the sink worker to be ready")
        plan = plan_for(scenario, settings)
        records = list(to_pipeline(plan.records(), settings))
        prediction = predict(records, settings, speed=plan.speed)
        outcome, in_flight, join = asyncio.run(
            _replay_with_kill(join, settings, records, plan.speed, kill_after=len(records) * 2 // 5,
                              log_dir=tmp_path / "logs-2", frames=len(prediction.joined | prediction.unmatched)))
        per_frame = collections.Counter(output.joined.frame.id for output in outcome.outputs)
        repeats = sum(per_frame.values()) - len(per_frame)
        print("\n" + outcome.line(scenario.name) + f" in_flight_at_kill={in_flight} repeats_in_joined={repeats}")

        expected = expected_counts(scenario, prediction)
        frames, results = sent_sides(outcome.sent)
        assert set(per_frame) == set(frames), "every frame sent comes out, and nothing else"
        assert len({o.joined.frame.id for o in outcome.outputs if o.joined.matched}) == expected["joined"]
        assert len({o.joined.frame.id for o in outcome.outputs if not o.joined.matched}) == expected["unmatched"]
        for output in outcome.outputs:
            assert output.joined.detections.boxes == results[output.joined.frame.id].boxes
        # At least once a frame in flight at the kill may come out again; under exactly-once none does.
        assert repeats <= (in_flight if guarantee == "at_least_once" else 0)
        # The sink writes each frame once, however often it comes.
        wait_until(lambda: _sink_handled(sink) == len(outcome.outputs), 60, "the sink to take every output")
        assert sink.stats()["sink_frames_written_total"] == len(frames)
        assert all(frame_path(sink_settings.out_dir, frame_id).exists() for frame_id in frames)
    finally:
        join.stop()
        sink.stop()


def _sink_handled(sink: Worker) -> int:
    stats = sink.stats()
    return stats["sink_frames_written_total"] + stats["sink_duplicates_total"]


async def _replay_with_kill(join: Worker, settings: Settings, records, speed, *, kill_after: int,
                            log_dir, frames: int) -> tuple[Outcome, int, Worker]:
    sampler = Sampler(join)
    reader = JoinedReader(settings)
    await reader.start()
    sent: list[Sent] = []
    publishing = asyncio.create_task(
        publish(records, settings, ReplayTarget({}, {}, by_key=True), speed=speed,
                       on_sent=sent.append))
    try:
        while len(sent) < kill_after:
            await sampler.poll()
            await reader.read(timeout_ms=100)
        before_kill = counter_values(sampler.last)
        join.kill()
        in_flight = await uncommitted_records(settings)
        join = await asyncio.to_thread(start_join, settings, log_dir)
        await publishing
        deadline = time.monotonic() + 120
        while len({output.joined.frame.id for output in reader.outputs}) < frames and time.monotonic() < deadline:
            await reader.read()
        await asyncio.sleep(1.0)
        await reader.read(timeout_ms=500)
        after = counter_values(await Sampler(join).poll())
    finally:
        publishing.cancel()
        await reader.stop()
    outcome = Outcome(_sum(before_kill, after), sampler.max_entries, sampler.max_bytes, reader.outputs, sent)
    return outcome, in_flight, join


def test_pending_entries_expire_on_time_after_restarts(kafka_bootstrap, tmp_path):
    scenario = Scenario.load(RESTARTS / "pending-through-restarts.json")
    settings = join_settings(kafka_bootstrap, scenario, tmp_path / "join")
    join = start_join(settings, tmp_path / "logs-0")
    try:
        for phase, keep_store in (("store-kept", True), ("changelog-only", False)):
            plan = plan_for(scenario, settings)
            records = list(to_pipeline(plan.records(), settings))
            prediction = predict(records, settings, speed=plan.speed)
            outcome, recovered_at_ms, stored_within_ms, join = asyncio.run(
                _replay_kill_restart(join, settings, records, prediction, keep_store, tmp_path / f"logs-{phase}"))
            print("\n" + outcome.line(f"{scenario.name} ({phase})") + f" stored_within_ms={stored_within_ms}")

            assert outcome.counts == expected_counts(scenario, prediction)
            unmatched = {o.joined.frame.id for o in outcome.outputs if not o.joined.matched}
            assert unmatched == prediction.unmatched
            # Each pending frame leaves once its partner can no longer arrive (TTL after it was
            # sent, or once its side's results were sent past its event time + TTL), and no later
            # than its deadline (TTL after the worker stored it, which trails sending under load by
            # up to the measured stored_within_ms), or than the restarted worker having its
            # partitions back.
            ttl_ms, sweep_ms = settings.join_ttl_s * 1000, settings.sweep_interval_s * 1000
            for departure in unmatched_departures(outcome, settings.join_ttl_s):
                assert departure.left_ms >= departure.earliest_ms, ("expired before its partner was due", departure)
                due_ms = max(departure.sent_ms + stored_within_ms + ttl_ms, recovered_at_ms)
                assert departure.left_ms <= due_ms + sweep_ms + SLACK_S * 1000, ("expired late", departure)
    finally:
        join.stop()


async def _replay_kill_restart(join: Worker, settings: Settings, records, prediction: Prediction,
                               keep_store: bool, log_dir) -> tuple[Outcome, float, int, Worker]:
    """Burst, wait until only the frames without results are pending and the input offsets are
    committed, SIGKILL, restart (without
    the local store unless ``keep_store``), and collect until every pending frame is out.
    Returns the outcome, when (ms since the Unix epoch) the new worker held the pending entries
    again, and the most any record of the burst waited between being sent and being consumed."""
    sampler = Sampler(join)
    start = counter_values(await sampler.poll())
    reader = JoinedReader(settings)
    await reader.start()
    sent: list[Sent] = []
    sampling = asyncio.create_task(sampler.run())
    try:
        await publish(records, settings, ReplayTarget({}, {}, by_key=True), speed=None,
                             on_sent=sent.append)
        pending = len(prediction.unmatched)
        consumed = (prediction.counts["frames_in"], prediction.counts["results_in"])
        while True:
            stats = await sampler.poll()
            counts = counter_values(stats)
            if ((counts["frames"] - start["frames"], counts["results"] - start["results"]) == consumed
                    and stats["join_pending_entries"] == pending and await uncommitted_records(settings) == 0):
                break  # committed, so the restarted worker sees none of it again
            await asyncio.sleep(0.2)
        sampling.cancel()
        stored_within_ms = consumed_within_ms(sampler.consumed, start["frames"] + start["results"], sent)
        before_kill = counter_delta(counter_values(stats), start)
        join.kill()
        if not keep_store:
            shutil.rmtree(settings.data_dir)
        join = await asyncio.to_thread(start_join, settings, log_dir)
        restarted = Sampler(join)
        deadline = time.monotonic() + 120
        while (await restarted.poll()).get("join_pending_entries", 0) < pending and not restarted.last.get(
                "join_unmatched_frames_total"):
            assert time.monotonic() < deadline, "the restarted worker never recovered the pending entries"
            await asyncio.sleep(0.1)
        recovered_at_ms = time.time() * 1000
        deadline = time.monotonic() + settings.join_ttl_s + 60
        while len({o.joined.frame.id for o in reader.outputs if not o.joined.matched}) < pending:
            assert time.monotonic() < deadline, "pending frames never came out after the restart"
            await reader.read()
        await asyncio.sleep(1.0)
        await reader.read(timeout_ms=500)
        after = counter_values(await restarted.poll())
    finally:
        sampling.cancel()
        await reader.stop()
    outcome = Outcome(_sum(before_kill, after), sampler.max_entries, sampler.max_bytes, reader.outputs, sent)
    return outcome, recovered_at_ms, stored_within_ms, join
