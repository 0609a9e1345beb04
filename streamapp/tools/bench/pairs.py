"""Synthetic frame/result pairs as the benchmarks publish them: a few pre-encoded JPEGs reused
with new ids, each result a few frames after its frame (as inference would), the load's producer,
and plain topics for baselines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streamapp import wire
from streamapp.agents.source import SyntheticScene, to_frame
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes

RESULT_LAG = 3          # a result is published this many frames after its frame
DISTINCT_FRAMES = 8     # pre-encoded JPEGs, reused with new ids
FRAME = "frame"
RESULT = "result"
MIB = 1024**2


def encoded_frames(width: int, height: int) -> list[bytes]:
    scene = SyntheticScene(width, height, seed=5)
    return [to_frame(wire.FrameId("soak", 1, index), 0, scene.render(index)[0]).jpeg
            for index in range(DISTINCT_FRAMES)]


def detections_for(frame_id: wire.FrameId, width: int, height: int) -> wire.Detections:
    box = wire.Box("object", 0.9, width // 4, height // 4, width // 8, height // 8)
    return wire.Detections(frame_id, (box,), "soak", 1.0, width, height)


def publish_order(start: int, count: int, lag: int = RESULT_LAG) -> Iterator[tuple[str, int]]:
    """``(FRAME, i)`` and ``(RESULT, i)`` for pairs ``start .. start+count-1``: each result
    ``lag`` frames after its frame, the last ``lag`` results after the last frame."""
    for index in range(start, start + count + lag):
        if index < start + count:
            yield FRAME, index
        if index - lag >= start:
            yield RESULT, index - lag


async def pace(rate: float, index: int, started: float) -> None:
    """Sleep until pair ``index`` is due at ``rate`` per second from ``started`` (monotonic);
    at rate 0 only yield now and then, so readers and samplers run."""
    if rate:
        ahead = started + index / rate - time.monotonic()
        if ahead > 0.002:
            await asyncio.sleep(ahead)
    elif index % 64 == 0:
        await asyncio.sleep(0)


def load_producer(settings: Settings) -> AIOKafkaProducer:
    """The load's producer: batches of up to 1 MiB, 5 ms linger, frames up to the frame limit."""
    return AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                            max_request_size=max_record_bytes(settings),
                            max_batch_size=min(max_record_bytes(settings), MIB), linger_ms=5)


async def create_plain_topics(settings: Settings, names: list[str]) -> None:
    """Topics outside the pipeline's own set, with its partition count and record size limit."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    config = {"max.message.bytes": str(max_record_bytes(settings)), "retention.ms": str(3600 * 1000)}
    try:
        await admin.create_topics([NewTopic(name, settings.partitions, settings.replication_factor,
                                            topic_configs=config) for name in names])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()

