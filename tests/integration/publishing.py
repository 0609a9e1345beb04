"""Frame/result pairs on a schedule, for the integration tests that drive a join worker with both sides
(frames alone come from streamapp.tools.harness.publish_frames)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid

from aiokafka import AIOKafkaProducer

from streamapp import wire
from streamapp.agents.source import synthetic_frames
from streamapp.cli.publisher import producer_config
from streamapp.settings import Settings
from streamapp.topics import topic_names
from streamapp.wire import new_epoch


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
    await send_at(settings, schedule)


async def send_at(settings: Settings, schedule, *, transactions: bool = False) -> list[float]:
    """Publish ``(seconds from now, "frames" | "detections", key, value, timestamp_ms)`` records,
    each at its time (in the order given where times are equal); with ``transactions`` each in a
    transaction of its own, as the stages write under exactly-once (a commit marker follows it).
    Returns when each was sent (``time.time()``), in the schedule's order."""
    names = topic_names(settings)
    transactional = {"transactional_id": f"send-at-{uuid.uuid4().hex[:8]}"} if transactions else {}
    producer = AIOKafkaProducer(**producer_config(settings, **transactional))
    await producer.start()
    sent_at = [0.0] * len(schedule)
    try:
        started = time.monotonic()
        for number, (at_s, role, key, value, timestamp) in sorted(enumerate(schedule), key=lambda item: item[1][0]):
            if at_s:
                await asyncio.sleep(max(0.0, started + at_s - time.monotonic()))
            sent_at[number] = time.time()
            if transactions:
                async with producer.transaction():
                    await producer.send(names[role], value, key=key, timestamp_ms=timestamp)
            else:
                await producer.send(names[role], value, key=key, timestamp_ms=timestamp)
        await producer.flush()
    finally:
        await producer.stop()
    return sent_at
