"""Runs a scenario against a join worker process and judges what came out of it.

A run replays the scenario's records into the worker's ``frames`` and ``detections`` topics,
reads ``joined`` as it goes and samples the worker's ``/streamapp/stats/`` for its pending state.
It ends when the worker has consumed every record, holds nothing pending and every frame is out
(then reads one more second, to catch a duplicate). The judge compares the outcome with what the
join's own decision predicts for the same records (``streamapp.tools.replay.predict``), frame by
frame.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import time
import uuid
from pathlib import Path

from aiokafka import TopicPartition

from streamapp import wire
from streamapp.settings import Settings
from streamapp.tools.harness import output_consumer
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.replay.format import Record
from streamapp.tools.replay.predict import Prediction
from streamapp.tools.replay.publish import ReplayTarget, Sent, publish
from streamapp.tools.replay.scenario import ReplayPlan, Scenario
from streamapp.tools.replay.transforms import side_of
from streamapp.tools.workers import Worker, wait_until
from streamapp.topics import topic_names

SCENARIOS = Path(__file__).parent / "scenarios"
# Scheduling slack on a loaded 2-core machine, added to every timing bound (never a pass on its own).
SLACK_S = 1.5
COUNTERS = {"frames": "join_frames_in_total", "results": "join_results_in_total",
            "joined": "join_joined_total", "unmatched": "join_unmatched_frames_total",
            "orphan": "join_orphan_results_total", "late": "join_late_results_total",
            "duplicates": "join_duplicates_total"}


def user_recordings() -> list[Path] | None:
    """``REPLAY_RECORDING`` (paths separated by ``:``) replaces the recordings of every scenario;
    the expected counters then come from the prediction instead of the scenario files."""
    value = os.environ.get("REPLAY_RECORDING")
    return [Path(path) for path in value.split(os.pathsep)] if value else None


def join_settings(bootstrap: str, scenario: Scenario, data_dir: Path, guarantee: str = "at_least_once") -> Settings:
    base = Settings(broker=f"kafka://{bootstrap}", topic_prefix=f"replay-{uuid.uuid4().hex[:8]}.",
                    stages=("join",), data_dir=data_dir, web_port=free_port(), processing_guarantee=guarantee)
    return scenario.settings(base)


def start_join(settings: Settings, log_dir: Path, timeout_s: float = 120.0) -> Worker:
    """A join worker process, once it says it is ready (its topics exist then)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    worker = Worker("join", settings, log_dir)
    wait_until(worker.ready, timeout_s, "the join worker to be ready")
    return worker


def plan_for(scenario: Scenario, settings: Settings) -> ReplayPlan:
    return ReplayPlan(user_recordings() or scenario.recordings, scenario.transforms, seed=scenario.seed,
                      speed=scenario.speed, settings=settings, by_key=True, fresh_epochs=True)


def to_pipeline(records, settings: Settings):
    """Frames to the worker's ``frames``, results to its ``detections``, whatever they were
    recorded from; anything else is not the join's input and stays out."""
    names = topic_names(settings)
    topics = {"frames": names["frames"], "results": names["detections"]}
    for record in records:
        side = side_of(record)
        if side is not None:
            yield dataclasses.replace(record, topic=topics[side])


# --- one run ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Output:
    joined: wire.Joined
    timestamp_ms: int


@dataclasses.dataclass
class Outcome:
    counts: dict[str, int]
    max_pending_entries: int = 0
    max_pending_bytes: int = 0
    outputs: list[Output] = dataclasses.field(default_factory=list)
    sent: list[Sent] = dataclasses.field(default_factory=list)
    drained_after_s: float | None = None  # from the last record sent to no pending entry
    lag_s: float = 0.0  # the worker's longest consumer lag: entries are stored up to this late

    def line(self, name: str) -> str:
        counts = " ".join(f"{key}={self.counts.get(key, 0)}" for key in COUNTERS)
        return (f"{name}: {counts} max_pending_entries={self.max_pending_entries} "
                f"max_pending_bytes={self.max_pending_bytes}")


class Sampler:
    """Polls the worker's stats: the last snapshot, the peaks of its pending state, and how many
    input records it had consumed when (for :func:`consumer_lag_s`)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.last: dict = {}
        self.max_entries = self.max_bytes = 0
        self.zero_since: float | None = None
        self.consumed: list[tuple[int, int]] = []  # (ms since the Unix epoch, frames + results)

    async def poll(self) -> dict:
        self.last = await asyncio.to_thread(self.worker.stats)
        counts = counter_values(self.last)
        self.consumed.append((int(time.time() * 1000), counts["frames"] + counts["results"]))
        entries = int(self.last.get("join_pending_entries", 0))
        self.max_entries = max(self.max_entries, entries)
        self.max_bytes = max(self.max_bytes, int(self.last.get("join_pending_bytes", 0)))
        if entries:
            self.zero_since = None
        elif self.zero_since is None:
            self.zero_since = time.monotonic()
        return self.last

    async def run(self, interval_s: float = 0.1) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(interval_s)


class JoinedReader:
    """Reads ``joined`` from its end at the start of the run, as a downstream consumer would
    (committed records only, under exactly-once)."""

    def __init__(self, settings: Settings) -> None:
        self.consumer = output_consumer(settings, isolation_level="read_committed")
        self.topic = topic_names(settings)["joined"]
        self.outputs: list[Output] = []

    async def start(self) -> None:
        await self.consumer.start()
        await self.consumer._client.force_metadata_update()  # aiokafka learns of topics lazily
        partitions = [TopicPartition(self.topic, number)
                      for number in sorted(self.consumer.partitions_for_topic(self.topic) or ())]
        assert partitions, f"topic {self.topic} does not exist"
        self.consumer.assign(partitions)
        await self.consumer.seek_to_end(*partitions)
        for partition in partitions:
            await self.consumer.position(partition)  # fixes the start before anything is sent

    async def read(self, timeout_ms: int = 200) -> None:
        for records in (await self.consumer.getmany(timeout_ms=timeout_ms)).values():
            self.outputs += [Output(wire.decode_joined(record.value), record.timestamp) for record in records]

    async def stop(self) -> None:
        await self.consumer.stop()


def counter_values(stats: dict) -> dict[str, int]:
    return {key: int(stats.get(metric, 0)) for key, metric in COUNTERS.items()}


async def run_scenario(worker: Worker, settings: Settings, records: list[Record], speed: float | None,
                       prediction: Prediction, *, timeout_s: float = 90.0) -> Outcome:
    sampler = Sampler(worker)
    before = counter_values(await sampler.poll())
    reader = JoinedReader(settings)
    await reader.start()
    sent: list[Sent] = []
    sampling = asyncio.create_task(sampler.run())
    try:
        target = ReplayTarget({}, {}, by_key=True)
        await publish(records, settings, target, speed=speed, on_sent=sent.append)
        last_sent = time.monotonic()
        expected_in = (prediction.counts["frames_in"], prediction.counts["results_in"])
        frames_out = len(prediction.joined | prediction.unmatched)
        deadline = time.monotonic() + timeout_s
        while True:
            await reader.read()
            counts = counter_delta(counter_values(sampler.last), before)
            consumed = (counts["frames"], counts["results"]) == expected_in
            out = len({output.joined.frame.id for output in reader.outputs})
            if consumed and out >= frames_out and sampler.zero_since is not None:
                break
            if time.monotonic() > deadline:
                break  # the judge says what is missing
        await asyncio.sleep(1.0)  # anything more would be a duplicate
        await reader.read(timeout_ms=500)
        await sampler.poll()
    finally:
        sampling.cancel()
        await reader.stop()
    outcome = Outcome(counter_delta(counter_values(sampler.last), before), sampler.max_entries, sampler.max_bytes,
                      reader.outputs, sent)
    outcome.lag_s = consumer_lag_s(sampler.consumed, before["frames"] + before["results"], sent)
    if sampler.zero_since is not None:
        outcome.drained_after_s = max(0.0, sampler.zero_since - last_sent)
    return outcome


def counter_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in COUNTERS}


# --- judging ----------------------------------------------------------------------------------


def expected_counts(scenario: Scenario, prediction: Prediction) -> dict[str, int]:
    """The scenario file's counters for its own recording; the prediction's for a user's."""
    if user_recordings() is None:
        return scenario.expect
    predicted = prediction.counts
    return {key: predicted[metric.removeprefix("join_").removesuffix("_total")]
            for key, metric in COUNTERS.items()}


def sent_sides(sent: list[Sent]) -> tuple[dict, dict]:
    """First copy of every frame sent (value, when sent) and of every result (decoded)."""
    frames, results = {}, {}
    for item in sent:
        decoded = wire.decode(item.record.value)
        if isinstance(decoded, wire.Frame):
            frames.setdefault(decoded.id, (decoded, item.sent_ms))
        else:
            results.setdefault(decoded.id, decoded)
    return frames, results


def judge_outputs(outcome: Outcome, prediction: Prediction) -> list[str]:
    """Every frame out exactly once, joined or not as predicted, with its own pixels and its own
    result's boxes (a join across streams or epochs would show here)."""
    problems = []
    frames, results = sent_sides(outcome.sent)
    per_frame = collections.Counter(output.joined.frame.id for output in outcome.outputs)
    repeated = {frame_id: count for frame_id, count in per_frame.items() if count > 1}
    if repeated:
        problems.append(f"{len(repeated)} frames came out more than once, e.g. {next(iter(repeated))}")
    foreign = set(per_frame) - set(frames)
    if foreign:
        problems.append(f"{len(foreign)} outputs for frames never sent, e.g. {next(iter(foreign))}")
    joined = {o.joined.frame.id for o in outcome.outputs if o.joined.matched}
    unmatched = {o.joined.frame.id for o in outcome.outputs if not o.joined.matched}
    if joined != prediction.joined:
        problems.append(f"joined frames differ: {len(joined - prediction.joined)} unexpected, "
                        f"{len(prediction.joined - joined)} missing")
    if unmatched != prediction.unmatched:
        problems.append(f"unmatched frames differ: {len(unmatched - prediction.unmatched)} unexpected, "
                        f"{len(prediction.unmatched - unmatched)} missing")
    for output in outcome.outputs:
        frame_id = output.joined.frame.id
        if frame_id in frames and output.joined.frame.jpeg != frames[frame_id][0].jpeg:
            problems.append(f"{frame_id} came out with another frame's pixels")
        if output.joined.matched and frame_id in results and (
                output.joined.detections.boxes != results[frame_id].boxes
                or output.joined.detections.id != frame_id):
            problems.append(f"{frame_id} came out with another frame's result")
    return problems


@dataclasses.dataclass(frozen=True)
class Departure:
    """When an unmatched frame was sent and left, and the earliest it may leave: TTL after it
    was sent, or once a result of its camera on its partition with an event time past the
    frame's + TTL was sent (its own result can no longer arrive), whichever is first."""

    sent_ms: int
    left_ms: int
    earliest_ms: int


def unmatched_departures(outcome: Outcome, ttl_s: float) -> list[Departure]:
    ttl_ms = round(ttl_s * 1000)
    frames = {}
    results_sent = collections.defaultdict(list)  # (partition, stream) -> [(event ms, sent ms)]
    for item in outcome.sent:
        decoded = wire.decode(item.record.value)
        if isinstance(decoded, wire.Frame):
            frames.setdefault(decoded.id, item)
        else:
            results_sent[(item.partition, decoded.id.stream)].append((item.timestamp_ms, item.sent_ms))
    departures = []
    for output in outcome.outputs:
        sent = frames.get(output.joined.frame.id)
        if output.joined.matched or sent is None:
            continue
        passed = [sent_ms for event_ms, sent_ms in results_sent[(sent.partition, output.joined.frame.id.stream)]
                  if event_ms > sent.timestamp_ms + ttl_ms]
        departures.append(Departure(sent.sent_ms, output.timestamp_ms, min([sent.sent_ms + ttl_ms, *passed])))
    return departures


def consumer_lag_s(consumed: list[tuple[int, int]], baseline: int, sent: list[Sent]) -> float:
    """The longest the worker was behind: at each sample, the age of the oldest record sent but not
    yet consumed (by count; the worker's own counters say how many it has consumed)."""
    times = sorted(item.sent_ms for item in sent)
    lags = [at - times[done - baseline] for at, done in consumed
            if 0 <= done - baseline < len(times) and times[done - baseline] <= at]
    return max(lags, default=0) / 1000


def consumed_within_ms(consumed: list[tuple[int, int]], baseline: int, sent: list[Sent]) -> int:
    """An upper bound on how long after being sent any record was consumed: the records counted
    between two samples were sent no earlier than the oldest one not yet consumed at the first, and
    consumed by the second (by count, as :func:`consumer_lag_s`)."""
    times = sorted(item.sent_ms for item in sent)
    delays = [at - times[done - baseline] for (_, done), (at, after) in zip(consumed, consumed[1:], strict=False)
              if 0 <= done - baseline < len(times) and after > done]
    return max(delays, default=0)


def most_sent_within(sent: list[Sent], window_s: float) -> int:
    """The most records sent in any window of ``window_s``: all that can be pending at once."""
    times = sorted(item.sent_ms for item in sent)
    most, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] > window_s * 1000:
            start += 1
        most = max(most, end - start + 1)
    return most
