"""Publishing a replay: records to their topics at their recorded pace, and the recordings opened for it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaProducer

from streamapp.cli.publisher import producer_config
from streamapp.connect import start_client
from streamapp.settings import Settings
from streamapp.tools.replay.format import Record, Recording
from streamapp.tools.replay.transforms import Records, ReplayError, frame_id, interleave, side_of
from streamapp.wire import new_epoch


@dataclasses.dataclass(frozen=True)
class Sent:
    """A record as published: where it went, its Kafka timestamp (its event time, moved to the
    replay), and when it was handed to the producer (ms since the Unix epoch)."""

    record: Record
    topic: str
    partition: int
    timestamp_ms: int
    sent_ms: int


@dataclasses.dataclass(frozen=True)
class ReplayTarget:
    """Where records go: ``rename`` maps recorded topics to target topics (others keep their
    name); ``recorded_partitions`` are the recorded topics' partition counts. A record keeps its
    recorded partition unless ``by_key`` or a transform re-keyed it (then Kafka's key partitioner
    places it, as it placed the original)."""

    rename: dict[str, str]
    recorded_partitions: dict[str, int]
    by_key: bool = False


async def publish(records: Iterable[Record], settings: Settings, target: ReplayTarget, *,
                  speed: float | None, on_sent: Callable[[Sent], None] | None = None) -> int:
    """Publish ``records`` at their recorded pace × ``speed`` (None: as fast as possible).

    Each record's Kafka timestamp is its event time moved by one shift, so that the first
    record happens now: the join sees the recorded event times, and retention counts from the
    replay, not from when they were recorded.
    """
    producer = AIOKafkaProducer(**producer_config(settings))
    await start_client(producer, settings)
    try:
        counts = _PartitionCounts(producer, target)
        pace = _Pace(speed)
        sent = 0
        shift: int | None = None
        for record in records:
            topic = target.rename.get(record.topic, record.topic)
            partition = await counts.partition(record, topic)
            await pace.wait(record.timestamp_ms)
            sent_ms = int(time.time() * 1000)
            if shift is None:
                shift = sent_ms - record.event_time_ms
            timestamp_ms = max(0, record.event_time_ms + shift)
            future = await producer.send(topic, record.value, key=record.key, partition=partition,
                                         headers=list(record.headers), timestamp_ms=timestamp_ms)
            if on_sent is not None:
                future.add_done_callback(_reporter(record, timestamp_ms, sent_ms, on_sent))
            sent += 1
        await producer.flush()
        return sent
    finally:
        await producer.stop()


def _reporter(record: Record, timestamp_ms: int, sent_ms: int, on_sent: Callable[[Sent], None]):
    # The timestamp as sent: aiokafka reports the first record's for every record of a batch.
    def report(future) -> None:
        if not future.cancelled() and future.exception() is None:
            metadata = future.result()
            on_sent(Sent(record, metadata.topic, metadata.partition, timestamp_ms, sent_ms))
    return report


class _PartitionCounts:
    def __init__(self, producer: AIOKafkaProducer, target: ReplayTarget) -> None:
        self.producer, self.target = producer, target
        self.known: dict[str, int] = {}

    async def partition(self, record: Record, topic: str) -> int | None:
        if topic not in self.known:
            try:
                self.known[topic] = len(await self.producer.partitions_for(topic))
            except Exception as exc:  # aiokafka reports a missing topic in several ways
                raise ReplayError(f"cannot publish to topic {topic!r}: {exc!r}; does it exist?") from None
        if record.partition is None or self.target.by_key:
            return None
        recorded = self.target.recorded_partitions.get(record.topic)
        if recorded != self.known[topic]:
            raise ReplayError(
                f"{record.topic!r} was recorded with {recorded} partitions but {topic!r} has "
                f"{self.known[topic]}: records would not land as recorded. Partition by key instead "
                f"(--by-key), or replay into a topic with {recorded} partitions.")
        return record.partition


class _Pace:
    """Sends each record at its offset from the first, divided by the speed; never bursts ahead."""

    def __init__(self, speed: float | None) -> None:
        if speed is not None and not speed > 0:
            raise ReplayError(f"speed must be > 0, or None for as fast as possible; got {speed!r}")
        self.speed = speed
        self.origin: tuple[float, int] | None = None

    async def wait(self, timestamp_ms: int) -> None:
        if self.speed is None:
            return
        if self.origin is None:
            self.origin = (time.monotonic(), timestamp_ms)
        started, first = self.origin
        delay = started + (timestamp_ms - first) / 1000 / self.speed - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def open_recordings(paths: list) -> tuple[Records, dict[str, int]]:
    """The records of one or more recordings (interleaved by time) and their topics' partition
    counts; recordings that disagree on a topic's partition count cannot be replayed together."""
    recordings = [Recording(path) for path in paths]
    partitions: dict[str, int] = {}
    for recording in recordings:
        for topic, count in recording.header.topics.items():
            if partitions.setdefault(topic, count) != count:
                raise ReplayError(f"recordings disagree on the partitions of {topic!r}: "
                                  f"{partitions[topic]} and {count} ({recording.path})")
    records = iter(recordings[0]) if len(recordings) == 1 else interleave(recordings)
    return records, partitions


def epoch_offset_to_now(records: Iterable[Record]) -> int:
    """How far to move epochs so the first frame's epoch becomes now (see :class:`ShiftEpochs`)."""
    for record in records:
        if side_of(record) is not None:
            return new_epoch() - frame_id(record).epoch
    return 0
