"""Publishing frames to Kafka the way the join expects them: bucket-keyed, size-checked, paced;
and the one producer configuration every tool publishes with (:func:`producer_config`).

Keys are the frame-index bucket (stream, epoch, index // bucket size) and partitions come from
Kafka's default murmur2 partitioner (remembering recent keys' hashes, as the workers' producers
do) — the same function Faust's producer uses for ``detections`` — so a frame and its result
always land on the same partition number (R9).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from aiokafka import AIOKafkaProducer

from streamapp import wire
from streamapp.agents.source import Pacer, synthetic_frames
from streamapp.connect import acl_errors_named, quiet_logger, start_client
from streamapp.errors import StreamappError
from streamapp.groundtruth import TruthBox
from streamapp.kafka.producer import KeyPartitioner
from streamapp.kafkasecurity import client_options
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes, topic_names

# A batch waits this long for more records: a few frames per request under load, little delay alone.
LINGER_MS = 5
MAX_BATCH_BYTES = 1024**2


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """How every tool produces to the pipeline's topics: records up to the frame limit, batches
    bounded in bytes (aiokafka holds at most one per partition), each write acknowledged by every
    in-sync copy and never written twice by a retry (as the workers' own producers write)."""
    limit = max_record_bytes(settings)
    config = dict(**client_options(settings), max_request_size=limit,
                  max_batch_size=min(limit, MAX_BATCH_BYTES), linger_ms=LINGER_MS, acks="all",
                  enable_idempotence=True, partitioner=KeyPartitioner())
    return {**config, **overrides}


# A stream's frames, each with its true boxes (None: not known, e.g. a video).
Stream = Iterator[tuple[wire.Frame, list[TruthBox] | None]]


def synthetic_streams(count: int, width: int, height: int, *, frames: int | None, fps: float,
                      epoch: int, prefix: str = "cam") -> list[Stream]:
    """``count`` synthetic cameras ``<prefix>1``.. of one epoch, ``frames`` each (None: endless),
    their capture times ``fps`` apart; each frame comes with its true boxes."""
    return [synthetic_frames(f"{prefix}{number}", epoch, frames, width, height, seed=number, fps=fps)
            for number in range(1, count + 1)]


class FrameTooLarge(StreamappError, ValueError):
    """A frame over STREAMAPP_MAX_FRAME_BYTES, refused before it is sent."""


class FramePublisher:
    """An aiokafka producer for the ``frames`` topic; use as ``async with``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = topic_names(settings)["frames"]
        self.producer = AIOKafkaProducer(**producer_config(settings))
        self.published = 0
        self.published_bytes = 0

    async def __aenter__(self) -> FramePublisher:
        await start_client(self.producer, self.settings)
        try:
            # The topic's metadata now, so a missing ACL is named before anything is sent.
            with quiet_logger("aiokafka"), acl_errors_named(self.settings, operation="WRITE", topics=self.topic):
                await self.producer.partitions_for(self.topic)
        except BaseException:
            await self.producer.stop()
            raise
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

    async def play(self, streams: list[Iterator[tuple[wire.Frame, Any]]], fps: float | None, *,
                   on_frame: Callable[[wire.Frame, Any], None] = lambda frame, kept: None,
                   stopping: asyncio.Event | None = None) -> None:
        """Publish ``(frame, anything)`` streams interleaved frame by frame, as concurrent cameras
        arrive, each at ``fps`` (None or 0: as fast as the broker takes them), until they end or
        ``stopping`` is set; ``on_frame`` sees each frame once it is handed to the producer."""
        pacer = Pacer(fps * len(streams) if fps else None)
        with acl_errors_named(self.settings, operation="WRITE", topics=self.topic):
            async for frame, kept in paced(interleave(streams), pacer.delay):
                if stopping is not None and stopping.is_set():
                    break
                await self.publish(frame)
                on_frame(frame, kept)
            await self.flush()


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
