"""Publishing helper shared by the integration tests that drive workers with synthetic frames."""

from __future__ import annotations

import asyncio
import math
import time

from aiokafka import AIOKafkaProducer

from streamapp import wire
from streamapp.agents.source import synthetic_frames
from streamapp.settings import Settings
from streamapp.tools.publisher import FramePublisher
from streamapp.topics import max_record_bytes, topic_names
from streamapp.wire import new_epoch


async def publish_frames(settings: Settings, stream: str, count: int, *, seed: int) -> list[wire.FrameId]:
    """Publish ``count`` small synthetic frames of a new epoch of ``stream``; return their ids."""
    frames = [frame for frame, _ in synthetic_frames(stream, new_epoch(), count, 160, 120, seed=seed)]
    async with FramePublisher(settings) as publisher:
        for frame in frames:
            await publisher.publish(frame)
        await publisher.flush()
    return [frame.id for frame in frames]


def pair_records(stream: str, count: int, *, start_ms: int, fps: float = 15.0, images: int = 8,
                 size: tuple[int, int] = (320, 240)) -> list[tuple[wire.Frame, bytes, bytes, int]]:
    """``count`` frames of a new epoch of ``stream`` captured at ``fps`` from ``start_ms``, each with
    its (empty) result: (frame, encoded frame, encoded result, capture time). A few distinct
    images are reused under new ids."""
    epoch = new_epoch()
    pictures = [frame.jpeg for frame, _ in synthetic_frames(stream, epoch, images, *size, seed=3)]
    pairs = []
    for index in range(count):
        timestamp = start_ms + round(index * 1000 / fps)
        frame = wire.Frame(wire.FrameId(stream, epoch, index), timestamp, size[0], size[1], pictures[index % images])
        result = wire.Detections(frame.id, (), "test", 1.0, size[0], size[1])
        pairs.append((frame, wire.encode_frame(frame), wire.encode_detections(result), timestamp))
    return pairs


async def send_pairs(settings: Settings, pairs, *, results: str = "beside", rate: float | None = None) -> None:
    """Publish frame/result pairs, each record's Kafka timestamp its frame's capture time.

    ``results``: "beside" (each result right after its frame), "after" (every result after all
    the frames) or "none". ``rate``: pairs per second, None for as fast as the broker takes them.
    """
    schedule = []
    for number, (frame, frame_value, result_value, timestamp) in enumerate(pairs):
        at_s, key = number / rate if rate else 0.0, frame.id.bucket_key(settings.bucket_size)
        schedule.append((at_s, "frames", key, frame_value, timestamp))
        if results != "none":
            schedule.append((at_s if results == "beside" else len(pairs) / (rate or math.inf), "detections",
                             key, result_value, timestamp))
    await send_at(settings, schedule, linger_ms=5)


async def send_at(settings: Settings, schedule, *, linger_ms: int = 0) -> None:
    """Publish ``(seconds from now, "frames" | "detections", key, value, timestamp_ms)`` records,
    each at its time (in the order given where times are equal)."""
    names = topic_names(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=linger_ms,
                                max_request_size=max_record_bytes(settings), max_batch_size=1024**2)
    await producer.start()
    try:
        started = time.monotonic()
        for at_s, role, key, value, timestamp in sorted(schedule, key=lambda item: item[0]):
            if at_s:
                await asyncio.sleep(max(0.0, started + at_s - time.monotonic()))
            await producer.send(names[role], value, key=key, timestamp_ms=timestamp)
        await producer.flush()
    finally:
        await producer.stop()
