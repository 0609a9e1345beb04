"""Capture: record topics into a recording file, or record a synthetic pipeline in-process."""

from __future__ import annotations

import collections
import dataclasses
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2

from streamapp import wire
from streamapp.connect import start_client
from streamapp.kafka.client import learn_topics
from streamapp.kafkasecurity import client_options
from streamapp.settings import Settings
from streamapp.tools.replay.format import Record, RecordingError, RecordingWriter
from streamapp.topics import max_record_bytes

# --- recording topics -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RecordLimits:
    """When recording stops: at the end offsets seen at the start (unless ``follow``), after
    ``max_records``, or after ``duration_s``, whichever comes first."""

    max_records: int | None = None
    duration_s: float | None = None
    follow: bool = False


async def record_topics(settings: Settings, topics: list[str], path: str | Path,
                        limits: RecordLimits = RecordLimits()) -> int:
    """Record every partition of ``topics`` from the beginning into ``path``; returns the count."""
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False,
                                max_partition_fetch_bytes=max_record_bytes(settings),
                                fetch_max_bytes=max(max_record_bytes(settings), 50 * 1024**2))
    await start_client(consumer, settings)
    try:
        counts = {}
        for topic in topics:
            partitions = consumer.partitions_for_topic(topic) or await _fetch_partitions(consumer, topic)
            counts[topic] = len(partitions)
        assigned = [TopicPartition(topic, number) for topic in topics
                    for number in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        with RecordingWriter(path, counts, note=f"recorded from {settings.bootstrap_servers}") as writer:
            await _copy(consumer, writer, ends, limits)
            return writer.count
    finally:
        await consumer.stop()


async def _fetch_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await learn_topics(consumer)
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise RecordingError(f"topic {topic!r} does not exist on the broker")
    return partitions


async def _copy(consumer: AIOKafkaConsumer, writer: RecordingWriter, ends: dict, limits: RecordLimits) -> None:
    """Write the records of all partitions merged by timestamp (each partition in offset order),
    so a replay paced by timestamps sends them as they were produced. A record is written once
    every partition that may still hold an earlier one has one buffered, so what is held is
    bounded by how far partitions are apart in time, not by the length of the recording."""
    deadline = None if limits.duration_s is None else time.monotonic() + limits.duration_s
    merge = _PartitionMerge(consumer, ends, limits.follow)
    while not await merge.finished():
        if deadline is not None and time.monotonic() >= deadline:
            return
        await merge.fetch()
        while (record := await merge.next_in_order()) is not None:
            writer.write(record)
            if limits.max_records is not None and writer.count >= limits.max_records:
                return


class _PartitionMerge:
    def __init__(self, consumer: AIOKafkaConsumer, ends: dict, follow: bool) -> None:
        self.consumer, self.ends, self.follow = consumer, ends, follow
        self.buffers: dict[TopicPartition, collections.deque[Record]] = {tp: collections.deque() for tp in ends}

    async def fetch(self) -> None:
        for tp, messages in (await self.consumer.getmany(timeout_ms=200)).items():
            for message in messages:
                if not self.follow and message.offset >= self.ends[tp]:
                    break
                self.buffers[tp].append(Record(tp.topic, tp.partition, message.offset, message.timestamp,
                                               message.key, message.value, tuple(message.headers or ())))

    async def next_in_order(self) -> Record | None:
        """The earliest buffered record, if no partition could still deliver an earlier one."""
        for tp, buffer in self.buffers.items():
            if not buffer and not await self._caught_up(tp):
                return None
        heads = [buffer for buffer in self.buffers.values() if buffer]
        if not heads:
            return None
        return min(heads, key=lambda buffer: buffer[0].timestamp_ms).popleft()

    async def finished(self) -> bool:
        if self.follow or any(self.buffers.values()):
            return False
        return all([await self._caught_up(tp) for tp in self.buffers])

    async def _caught_up(self, tp: TopicPartition) -> bool:
        """Fetched all there is to record (up to the end seen at the start, or, when following,
        up to what the broker last said it holds)."""
        position = await self.consumer.position(tp)
        if not self.follow:
            return position >= self.ends[tp]
        highwater = self.consumer.highwater(tp)
        return highwater is not None and position >= highwater


# --- recording the pipeline in-process ----------------------------------------------------------


def synthetic_records(settings: Settings, *, streams: int, frames: int, width: int, height: int,
                      fps: float, latency_ms: int, start_ms: int, prefix: str = "cam") -> Iterator[Record]:
    """What ``frames`` and ``detections`` would hold for synthetic cameras, without a broker.

    Each camera (``<prefix>1``, ``<prefix>2``, ..., its scene seeded by its name, so every camera
    shows another scene) runs the real source, resize and colour-detector code; its result is
    stamped ``latency_ms`` after its frame. Records come in time order, keyed and partitioned as
    the pipeline does it; every camera shares the epoch ``start_ms``, so frame indices overlap.
    """
    from streamapp.agents.infer import infer_frame, load_detector
    from streamapp.agents.resize import resize_frame
    from streamapp.agents.source import synthetic_frames
    from streamapp.cli.publisher import interleave

    detector = load_detector("color")
    names = [f"{prefix}{number}" for number in range(1, streams + 1)]
    cameras = [synthetic_frames(name, start_ms, frames, width, height, seed=zlib.crc32(name.encode()),
                                fps=fps, quality=settings.jpeg_quality, now_ms=start_ms)
               for name in names]
    stamp = _Stamper(settings)
    in_flight: list[Record] = []  # results, in time order (the latency is the same for all)
    for frame, _ in interleave(cameras):
        while in_flight and in_flight[0].timestamp_ms <= frame.timestamp_ms:
            yield in_flight.pop(0)
        yield stamp("frames", frame.id, frame.timestamp_ms, wire.encode_frame(frame))
        scaled = resize_frame(frame, settings.resize_width, settings.resize_height, settings.jpeg_quality)
        result = wire.encode_detections(infer_frame(scaled, detector))
        in_flight.append(stamp("detections", frame.id, frame.timestamp_ms + latency_ms, result))
    yield from in_flight


class _Stamper:
    """Keys, partitions and offsets records as a producer and broker would."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.offsets: dict[tuple[str, int], int] = {}

    def __call__(self, topic: str, frame_id: wire.FrameId, timestamp_ms: int, value: bytes) -> Record:
        key = frame_id.bucket_key(self.settings.bucket_size)
        partition = key_partition(key, self.settings.partitions)
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + 1
        return Record(topic, partition, offset, timestamp_ms, key, value)


def key_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partition for a key (murmur2), as the Java client and aiokafka compute it."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
