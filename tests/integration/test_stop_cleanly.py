"""SIGTERM on each stage in the middle of a stream, on the real broker (R12, R4): each worker stops
by itself, commits what it finished, and the same worker started again goes on from there: no frame
lost, none twice in ``joined``, and nothing the stopped worker committed is read again."""

import asyncio
import threading
import time

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamapp.settings import STAGES, Settings
from streamapp.tools.harness import Pipeline, SteadyCameras, output_consumer, read_joined, wait_for
from streamapp.topics import topic_names

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

# What each stage reads, and the counters of what it took in from there.
INPUTS = {"resize": ["frames"], "infer": ["scaled"], "join": ["frames", "detections"], "sink": ["joined"]}
IN_COUNTERS = {"resize": ["resize_frames_in_total"], "infer": ["infer_frames_in_total"],
               "join": ["join_frames_in_total", "join_results_in_total"], "sink": ["sink_records_in_total"]}
# Frames a stage takes in between two SIGTERMs, so that each one falls mid-stream.
BETWEEN_STOPS = 30
STOP_TIMEOUT_S = 20.0


def _within(timeout_s: float, condition) -> bool:
    """Whether ``condition()`` (which may run its own event loop) holds within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def _taken_in(pipeline: Pipeline, stage: str) -> float:
    try:
        stats = pipeline.workers[stage].stats()
    except OSError:
        return 0
    return sum(stats.get(name, 0) for name in IN_COUNTERS[stage])


def _inputs(settings: Settings, stage: str) -> list[TopicPartition]:
    names = topic_names(settings)
    return [TopicPartition(names[role], number) for role in INPUTS[stage] for number in range(settings.partitions)]


async def _committed(settings: Settings, stage: str) -> int:
    """Records of its inputs the stage's consumer group has committed."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.group_id)
    finally:
        await admin.close()
    return sum(offsets[tp].offset for tp in _inputs(settings, stage) if tp in offsets)


async def _ends(settings: Settings, stage: str) -> int:
    consumer = output_consumer(settings)
    await consumer.start()
    try:
        return sum((await consumer.end_offsets(_inputs(settings, stage))).values())
    finally:
        await consumer.stop()


def test_sigterm_on_each_stage_mid_stream_loses_repeats_and_reads_again_nothing(kafka_bootstrap, tmp_path,
                                                                                unique_topic):
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=2,
                        join_ttl_s=60.0, done_marker_ttl_s=120.0, out_dir=tmp_path / "out")
    pipeline = Pipeline(settings, tmp_path)
    cameras = SteadyCameras(settings, 2, 160, 120, fps=6.0)
    loop = asyncio.new_event_loop()
    publishing = threading.Thread(target=loop.run_until_complete, args=(cameras.run(),), daemon=True)
    committed_at_stop: dict[str, int] = {}
    try:
        pipeline.start_all()
        publishing.start()
        for stage in STAGES:
            mid_stream = asyncio.run(wait_for(lambda stage=stage: _taken_in(pipeline, stage) >= BETWEEN_STOPS, 60))
            assert mid_stream is not None
            worker = pipeline.workers[stage]
            began = time.monotonic()
            worker.stop(STOP_TIMEOUT_S)
            assert time.monotonic() - began < STOP_TIMEOUT_S and worker.process.returncode == 0, (
                f"the {stage} worker did not stop by itself on SIGTERM (exit {worker.process.returncode}); "
                f"see {worker.log_path}")
            committed_at_stop[stage] = asyncio.run(_committed(pipeline.stage_settings(stage), stage))
            pipeline.start(stage)
            assert asyncio.run(wait_for(pipeline.workers[stage].ready, 90)) is not None
        loop.call_soon_threadsafe(cameras.stopping.set)
        publishing.join(30)
        produced = set(cameras.produced)

        # Each restarted worker takes in exactly what its input holds past the stopped one's commits.
        def left_for_restarted(stage: str) -> int:
            return asyncio.run(_ends(settings, stage)) - committed_at_stop[stage]

        def settled() -> bool:
            return (all(_taken_in(pipeline, stage) >= left_for_restarted(stage) for stage in STAGES)
                    and set(asyncio.run(read_joined(settings)).copies) >= produced)

        assert _within(120, settled), {
            stage: (_taken_in(pipeline, stage), left_for_restarted(stage)) for stage in STAGES}
        time.sleep(2)  # a record read again would arrive about now
        assert {stage: _taken_in(pipeline, stage) for stage in STAGES} == {
            stage: left_for_restarted(stage) for stage in STAGES}

        joined = asyncio.run(read_joined(settings))
        assert produced and set(joined.copies) == produced, f"lost: {len(produced - set(joined.copies))}"
        assert [frame for frame, copies in joined.copies.items() if copies > 1] == []
        assert all(outcome == {"joined"} for outcome in joined.outcomes.values())
    finally:
        if publishing.is_alive():
            loop.call_soon_threadsafe(cameras.stopping.set)
            publishing.join(30)
        pipeline.stop()
