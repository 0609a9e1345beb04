"""Two join workers in one consumer group on the real broker: one is killed, later restarted, so
partitions move to the survivor and back. Nothing is lost, every result still meets its frame,
and frames without a result still expire on partitions that moved (the expiry index is rebuilt
from the store on assignment, R4).

Results are published straight to ``detections`` (no resize or infer workers): this is about the
join, and keeps the test light.
"""

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from streamapp import wire
from streamapp.agents.source import synthetic_frames
from streamapp.cli.publisher import FramePublisher, producer_config
from streamapp.settings import Settings
from streamapp.sinkfiles import frame_path
from streamapp.tools.harness import processed, read_joined, wait_for
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker
from streamapp.topicadmin import ensure_topics
from streamapp.topics import topic_names
from streamapp.wire import Detections, new_epoch

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

FRAMES_PER_PHASE = 24
# Waits are generous: a rebalance on a loaded 2-core machine can take minutes; a test that
# passes returns as soon as the condition holds.


@pytest.fixture(params=["at_least_once", "exactly_once"])
def settings(kafka_bootstrap, tmp_path, unique_topic, request):
    """Under exactly-once the partitions' transactional ids move with them, and each new owner
    fences the one before."""
    return Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=4,
                    bucket_size=2, join_ttl_s=20.0, sweep_interval_s=0.5, done_marker_ttl_s=30.0,
                    out_dir=tmp_path / "out", processing_guarantee=request.param)


def _worker(settings: Settings, stage: str, name: str, root) -> Worker:
    log_dir = root / "logs" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    return Worker(stage, settings.replace(stages=(stage,), web_port=free_port(), data_dir=root / "data" / name),
                  log_dir)


async def _publish(settings: Settings, stream: str) -> list[wire.FrameId]:
    """Frames, and a result for every even index: odd frames must expire unmatched."""
    frames = [frame for frame, _ in synthetic_frames(stream, new_epoch(), FRAMES_PER_PHASE, 160, 120, seed=2)]
    producer = AIOKafkaProducer(**producer_config(settings))
    await producer.start()
    try:
        async with FramePublisher(settings) as publisher:
            for frame in frames:
                await publisher.publish(frame)
                if frame.id.index % 2 == 0:
                    result = Detections(frame.id, (), "test", 1.0, frame.width, frame.height)
                    await producer.send(topic_names(settings)["detections"], wire.encode_detections(result),
                                        key=frame.id.bucket_key(settings.bucket_size))
            await publisher.flush()
        await producer.flush()
    finally:
        await producer.stop()
    return [frame.id for frame in frames]


def test_partitions_move_back_and_forth_without_loss_and_still_expire(settings, tmp_path):
    asyncio.run(ensure_topics(settings.replace(stages=("join",))))
    sink = _worker(settings, "sink", "sink", tmp_path)
    first = _worker(settings, "join", "join-a", tmp_path)
    second = _worker(settings, "join", "join-b", tmp_path)
    workers = [sink, first, second]
    try:
        assert asyncio.run(wait_for(lambda: all(worker.ready() for worker in workers), 120)) is not None
        ids = asyncio.run(_publish(settings, "before"))
        assert asyncio.run(wait_for(lambda: processed(first) > 0 and processed(second) > 0, 60)) is not None, \
            "both join workers own partitions"

        second.kill()  # its pending entries move to the survivor once its session times out
        while_down = asyncio.run(_publish(settings, "while-down"))
        ids += while_down
        matched = [frame_path(settings.out_dir, frame_id) for frame_id in while_down if frame_id.index % 2 == 0]
        assert asyncio.run(wait_for(lambda: all(path.exists() for path in matched), 240)) is not None, \
            "the survivor takes every partition"

        second = _worker(settings, "join", "join-b-again", tmp_path)
        workers.append(second)
        assert asyncio.run(wait_for(second.ready, 120)) is not None
        ids += asyncio.run(_publish(settings, "after"))
        assert asyncio.run(wait_for(lambda: processed(second) > 0, 240)) is not None, "partitions move back"

        files = [frame_path(settings.out_dir, frame_id) for frame_id in ids]
        assert asyncio.run(wait_for(lambda: all(path.exists() for path in files), 240)) is not None, \
            [str(frame_id) for frame_id, path in zip(ids, files, strict=True) if not path.exists()][:10]
        joined = asyncio.run(read_joined(settings))
        assert set(joined.copies) == set(ids)
        if settings.processing_guarantee == "exactly_once":
            assert set(joined.copies.values()) == {1}, "a frame committed twice to joined"
        for frame_id in ids:
            expected = {"joined"} if frame_id.index % 2 == 0 else {"unmatched"}
            assert joined.outcomes[frame_id] == expected, frame_id
    finally:
        for worker in workers:
            worker.stop()
