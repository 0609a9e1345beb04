"""Scale-out: two worker processes per stage on the real broker share each stage's partitions, and
the output is complete: every frame leaves the join exactly once and is written exactly once.

Each pair is one consumer group, so Kafka splits the partitions between the two; each sink writes
to its own folder (see docs/operations.md, "Scaling out"). Frames are small and the bucket size is
small too, so the few frames spread over every partition.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamapp import wire
from streamapp.cli.publisher import FramePublisher, synthetic_streams
from streamapp.samples import sample_name
from streamapp.settings import STAGES, Settings
from streamapp.sinkfiles import frame_path
from streamapp.tools.harness import read_joined_until
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker
from streamapp.topicadmin import ensure_topics
from streamapp.topics import topic_names
from streamapp.wire import new_epoch

pytestmark = pytest.mark.e2e

REPLICAS = 2
STREAMS, FRAMES = 2, 40
INPUT_TOPIC = {"resize": "frames", "infer": "scaled", "join": "frames", "sink": "joined"}


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}", pytrace=False)
        time.sleep(0.5)


def assigned(worker: Worker) -> int:
    topic = topic_names(worker.settings)[INPUT_TOPIC[worker.stage]]
    return int(worker.stats().get(sample_name("kafka_consumer_assigned_partitions", topic=topic), 0))


def shared_evenly(workers: list[Worker], partitions: int) -> bool:
    """Every worker has partitions of its stage's input, and each stage's add up to all of them."""
    counts = {worker: assigned(worker) for worker in workers}
    per_stage = Counter()
    for worker, count in counts.items():
        per_stage[worker.stage] += count
    return all(counts.values()) and set(per_stage.values()) == {partitions}


async def publish(settings: Settings) -> set[wire.FrameId]:
    produced: set[wire.FrameId] = set()
    async with FramePublisher(settings) as publisher:
        await publisher.play(synthetic_streams(STREAMS, 160, 120, frames=FRAMES, fps=15.0, epoch=new_epoch()), None,
                             on_frame=lambda frame, truth: produced.add(frame.id))
    return produced


def metric_families(worker: Worker) -> dict:
    url = f"http://127.0.0.1:{worker.settings.web_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return {family.name: family for family in text_string_to_metric_families(response.read().decode())}


@dataclasses.dataclass
class Run:
    root: Path
    workers: list[Worker]
    produced: set[wire.FrameId]
    seen: Counter  # frame id -> times on the joined topic


@pytest.fixture(scope="module")
def run(kafka_bootstrap, tmp_path_factory):
    """Eight workers, their partitions split, every frame published and read back from `joined`."""
    root = tmp_path_factory.mktemp("scale-out")
    base = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"scale-{uuid.uuid4().hex[:8]}.",
                    partitions=4, bucket_size=4, join_ttl_s=30.0, resize_width=160, resize_height=120)
    asyncio.run(ensure_topics(base))
    workers: list[Worker] = []
    try:
        for replica in range(REPLICAS):
            logs = root / f"logs-{replica}"
            logs.mkdir()
            for stage in STAGES:
                workers.append(Worker(stage, base.replace(
                    stages=(stage,), web_port=free_port(), data_dir=root / f"data-{stage}-{replica}",
                    out_dir=root / f"out-{replica}"), logs))
        wait_for(lambda: all(worker.ready() for worker in workers), 150, "8 workers to start")
        wait_for(lambda: shared_evenly(workers, base.partitions), 90,
                 "each stage's partitions to be split between its two workers")
        produced = asyncio.run(publish(base))
        seen: Counter = Counter()
        asyncio.run(read_joined_until(base, len(produced), 120, lambda joined: seen.update([joined.frame.id])))
        yield Run(root, workers, produced, seen)
    finally:
        for worker in workers:
            worker.stop()


def test_every_frame_is_joined_and_written_exactly_once(run):
    assert set(run.seen) == run.produced
    assert [frame_id for frame_id, count in run.seen.items() if count > 1] == []

    def files_written() -> Counter:
        return Counter(frame_id for frame_id in run.produced for replica in range(REPLICAS)
                       if frame_path(run.root / f"out-{replica}", frame_id).exists())

    wait_for(lambda: len(files_written()) == len(run.produced), 60, "the sinks to write every frame")
    assert set(files_written().values()) == {1}


def test_both_workers_of_every_stage_did_part_of_the_work(run):
    wait_for(lambda: sum(worker.stats()["sink_records_in_total"] for worker in run.workers
                         if worker.stage == "sink") == len(run.produced), 60, "the sinks to read every record")
    stats = {worker: worker.stats() for worker in run.workers}
    processed = {"resize": "resize_frames_in_total", "infer": "infer_frames_in_total",
                 "join": "join_frames_in_total", "sink": "sink_records_in_total"}
    for worker, values in stats.items():
        assert values[processed[worker.stage]] > 0, f"a {worker.stage} worker processed nothing"
    for stage, counter in processed.items():
        assert sum(values[counter] for worker, values in stats.items() if worker.stage == stage) \
            == len(run.produced), stage
    joins = [values for worker, values in stats.items() if worker.stage == "join"]
    assert sum(values["join_joined_total"] for values in joins) == len(run.produced)
    assert sum(values["join_unmatched_frames_total"] + values["join_duplicates_total"] for values in joins) == 0
    assert sum(values["join_latency_seconds_count"] for values in joins) == len(run.produced)
    # Every frame met its result: nothing waits, and the oldest wait is none.
    assert [(values["join_pending_entries"], values["join_oldest_pending_age_seconds"]) for values in joins] \
        == [(0, 0.0)] * REPLICAS


def test_every_metric_a_worker_exposes_has_help(run):
    for worker in run.workers:
        undocumented = {name for name, family in metric_families(worker).items() if not family.documentation}
        assert not undocumented, f"{worker.stage}: metrics without help in streamapp.worker.metrics.HELP " \
                                 f"(and docs/operations.md): {sorted(undocumented)}"
