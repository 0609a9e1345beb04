"""Publishing frames to Kafka the way the join expects them: bucket-keyed, size-checked, paced.

Keys are the frame-index bucket (stream, epoch, index // bucket size) and partitions come from the
producer's default murmur2 partitioner — the same function Faust's producer uses for ``detections``
— so a frame and its result always land on the same partition number (R9).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator

from aiokafka import AIOKafkaProducer

from streamapp import wire
from streamapp.connect import start_client
from streamapp.errors import StreamappError
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes, topic_names


class FrameTooLarge(StreamappError, ValueError):
    """A frame over STREAMAPP_MAX_FRAME_BYTES, refused before it is sent."""


class FramePublisher:
    """An aiokafka producer for the ``frames`` topic; use as ``async with``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = topic_names(settings)["frames"]
        self.producer = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap_servers,
            max_request_size=max_record_bytes(settings),
            # Bounded in bytes: aiokafka holds at most one batch of this size per partition.
            max_batch_size=min(max_record_bytes(settings), 1024**2),
            linger_ms=5,
            acks="all",
            enable_idempotence=True,
        )
        self.published = 0
        self.published_bytes = 0

    async def __aenter__(self) -> FramePublisher:
        await start_client(self.producer, self.settings.bootstrap_servers)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.producer.stop()

    async def publish(self, frame: wire.Frame) -> None:
        if len(frame.jpeg) > self.settings.max_frame_bytes:
            raise FrameTooLarge(
                f"frame {frame.id} is {len(frame.jpeg)} bytes, over STREAMAPP_MAX_FRAME_BYTES="
                f"{self.settings.max_frame_bytes}"
            )
        value = wire.encode_frame(frame)
        # The Kafka timestamp is the capture time: it is the event time the join expires by.
        await self.producer.send(self.topic, value, key=frame.id.bucket_key(self.settings.bucket_size),
                                 timestamp_ms=frame.timestamp_ms)
        self.published += 1
        self.published_bytes += len(value)

    async def flush(self) -> None:
        await self.producer.flush()


async def paced(frames: Iterable, delay) -> AsyncIterator:
    """Yield from a (blocking) frame iterator, sleeping ``delay()`` seconds before each item."""
    for item in frames:
        pause = delay()
        if pause:
            await asyncio.sleep(pause)
        yield item


def interleave(iterators: Iterable[Iterator]) -> Iterator:
    """Round-robin over several frame iterators, as concurrent cameras would arrive."""
    active = list(iterators)
    while active:
        for iterator in list(active):
            try:
                yield next(iterator)
            except StopIteration:
                active.remove(iterator)
