"""SIGTERM on each stage in the middle of a stream, on the real broker (R12, R4): each worker stops
by itself, commits what it finished, and the same worker started again goes on from there: no frame
lost, none twice in ``joined``, and nothing the stopped worker finished done again."""

import asyncio
import threading
import time

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamapp.kafkasecurity import client_options
from streamapp.settings import STAGES, Settings
from streamapp.sinkfiles import frame_path
from streamapp.tools.harness import Pipeline, SteadyCameras, output_consumer, read_joined
from streamapp.topics import topic_names

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

# What each stage reads, and the counters of what it took in.
INPUTS = {"resize": ["frames"], "infer": ["scaled"], "join": ["frames", "detections"], "sink": ["joined"]}
IN_COUNTERS = {"resize": ["resize_frames_in_total"], "infer": ["infer_frames_in_total"],
               "join": ["join_frames_in_total", "join_results_in_total"], "sink": ["sink_records_in_total"]}
# Records a stage takes in before its SIGTERM, so that it falls mid-stream.
BEFORE_STOP = 30
# Frames large enough that resize and the sink spend much of the stream decoding, so that a
# SIGTERM finds them in the middle of a frame.
FRAME_SIZE = (1280, 960)
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


async def _records(settings: Settings, role: str) -> int:
    consumer = output_consumer(settings)
    await consumer.start()
    try:
        topic = topic_names(settings)[role]
        ends = await consumer.end_offsets([TopicPartition(topic, number) for number in range(settings.partitions)])
        return sum(ends.values())
    finally:
        await consumer.stop()


async def _committed(settings: Settings) -> int:
    """The offsets committed by the group of ``settings``, summed over its input partitions."""
    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    try:
        return sum(offset.offset for offset in (await admin.list_consumer_group_offsets(settings.group_id)).values())
    finally:
        await admin.close()


def test_sigterm_on_each_stage_mid_stream_loses_and_repeats_nothing(kafka_bootstrap, tmp_path, unique_topic):
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=2,
                        join_ttl_s=60.0, done_marker_ttl_s=120.0, out_dir=tmp_path / "out")
    pipeline = Pipeline(settings, tmp_path)
    committed: dict[str, int] = {}  # by each stopped worker
    cameras = SteadyCameras(settings, 2, *FRAME_SIZE, fps=6.0)
    loop = asyncio.new_event_loop()
    publishing = threading.Thread(target=loop.run_until_complete, args=(cameras.run(),), daemon=True)
    try:
        pipeline.start_all()
        publishing.start()
        for stage in STAGES:
            assert _within(60, lambda stage=stage: _taken_in(pipeline, stage) >= BEFORE_STOP)
            worker = pipeline.workers[stage]
            began = time.monotonic()
            worker.stop(STOP_TIMEOUT_S)
            assert time.monotonic() - began < STOP_TIMEOUT_S and worker.process.returncode == 0, (
                f"the {stage} worker did not stop by itself on SIGTERM (exit {worker.process.returncode}); "
                f"see {worker.log_path}")
            committed[stage] = asyncio.run(_committed(pipeline.stage_settings(stage)))
            pipeline.start(stage)
            assert _within(90, pipeline.workers[stage].ready)
        loop.call_soon_threadsafe(cameras.stopping.set)
        publishing.join(30)
        produced = set(cameras.produced)

        written = {frame_id: frame_path(settings.out_dir, frame_id) for frame_id in produced}
        _within(120, lambda: all(path.exists() for path in written.values()))
        time.sleep(2)  # a record read again would be through by now
        # A stop cancels a stage in the middle of what it holds (resize and the sink one frame,
        # infer one batch): that is neither committed nor lost, but done again after the restart.
        # Everything it finished is committed: nothing more is done twice.
        records = {role: asyncio.run(_records(settings, role)) for role in ("frames", "scaled", "detections", "joined")}
        frames = len(produced)
        assert records["frames"] == frames
        assert frames <= records["scaled"] <= frames + 1, records
        assert frames <= records["detections"] <= records["scaled"] + settings.infer_batch, records
        joined = asyncio.run(read_joined(settings))
        assert records["joined"] == frames, f"not in joined: {sorted(map(str, produced - set(joined.copies)))}"
        assert set(joined.copies) == produced and set(joined.copies.values()) == {1}
        assert all(outcome == {"joined"} for outcome in joined.outcomes.values()), pipeline.workers["join"].stats()
        assert [frame_id for frame_id, path in written.items() if not path.exists()] == []
        assert pipeline.workers["sink"].stats()["sink_duplicates_total"] <= 1
        # The restarted worker took in exactly what the stopped one had not committed.
        for stage, inputs in INPUTS.items():
            assert _taken_in(pipeline, stage) == sum(records[role] for role in inputs) - committed[stage], (
                stage, committed[stage], records)
    finally:
        if publishing.is_alive():
            loop.call_soon_threadsafe(cameras.stopping.set)
            publishing.join(30)
        pipeline.stop()
