"""Recordings: Kafka records of one or more topics in a file, to replay later (docs/recording-format.md).

A recording keeps what a consumer sees of each record (topic, partition, offset, timestamp, key,
value, headers), partitions merged by timestamp. Files are written and read one record at a time, so a
recording of any length costs one record of memory. Every record carries a CRC-32, and the file
ends with a marker holding the record count: a truncated or damaged file is an error that says
where, never a silently shorter replay.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import struct
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2

from streamapp import wire
from streamapp.connect import start_client
from streamapp.errors import StreamappError
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes

MAGIC = b"SAREC"
VERSION = 1
_FILE_PREFIX = struct.Struct(">5sBI")   # magic, version, header length
_RECORD_TAG, _END_TAG = b"R", b"E"
_FRAMING = struct.Struct(">II")         # body length, CRC-32 of the body
_END = struct.Struct(">Q")              # record count
_FIELDS = struct.Struct(">iqq")         # partition, offset, timestamp_ms
_LENGTH = struct.Struct(">i")           # -1 for None
_SHORT = struct.Struct(">H")
MAX_HEADER_BYTES = 1024**2
# Larger than any record a streamapp topic accepts (256 MiB frames at most): a bigger length
# field is damage, and must not turn into a huge allocation.
MAX_RECORD_BYTES = 300 * 1024**2


class RecordingError(StreamappError, ValueError):
    """A recording that cannot be read: not a recording, another version, truncated or damaged."""


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record. ``partition`` None means "partition by key" (e.g. after re-keying)."""

    topic: str
    partition: int | None
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    # When the record happened (its frame's capture time), if a replay transform moved when it
    # is sent (``timestamp_ms``) away from it; None: the same.
    event_ms: int | None = None

    @property
    def event_time_ms(self) -> int:
        return self.timestamp_ms if self.event_ms is None else self.event_ms


# --- writing ----------------------------------------------------------------------------------


class RecordingWriter:
    """Writes a recording record by record; use as a context manager (the end marker is written
    on a clean exit only, so an interrupted recording is recognisably incomplete)."""

    def __init__(self, path: str | Path, topics: dict[str, int], *, note: str = "") -> None:
        self.path = Path(path)
        self.count = 0
        header = {"format": "streamapp-recording", "version": VERSION,
                  "created_ms": int(time.time() * 1000), "topics": topics, "note": note}
        encoded = json.dumps(header, sort_keys=True).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = open(self.path, "wb")
        self._file.write(_FILE_PREFIX.pack(MAGIC, VERSION, len(encoded)) + encoded)

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            self._file.write(_END_TAG + _END.pack(self.count))
        self._file.close()

    def write(self, record: Record) -> None:
        body = encode_record(record)
        self._file.write(_RECORD_TAG + _FRAMING.pack(len(body), zlib.crc32(body)) + body)
        self.count += 1

    def write_all(self, records: Iterable[Record]) -> int:
        for record in records:
            self.write(record)
        return self.count


def encode_record(record: Record) -> bytes:
    parts = [_text(record.topic),
             _FIELDS.pack(-1 if record.partition is None else record.partition, record.offset,
                          record.timestamp_ms),
             _blob(record.key), _blob(record.value), _SHORT.pack(len(record.headers))]
    for name, value in record.headers:
        parts += [_text(name), _blob(value)]
    return b"".join(parts)


def _text(text: str) -> bytes:
    encoded = text.encode()
    return _SHORT.pack(len(encoded)) + encoded


def _blob(data: bytes | None) -> bytes:
    return _LENGTH.pack(-1) if data is None else _LENGTH.pack(len(data)) + data


# --- reading ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RecordingHeader:
    topics: dict[str, int]  # recorded topic -> its partition count when recorded
    created_ms: int
    note: str


class Recording:
    """A recording file: its header now, its records lazily (each iteration reads the file anew)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise RecordingError(f"{self.path}: no such recording file")
        with open(self.path, "rb") as file:
            self.header = _read_header(file, self.path)

    def __iter__(self) -> Iterator[Record]:
        with open(self.path, "rb") as file:
            _read_header(file, self.path)
            count = 0
            while True:
                tag = file.read(1)
                if tag == _END_TAG:
                    (expected,) = _END.unpack(self._exactly(file, _END.size, count))
                    if expected != count:
                        raise self._error(f"end marker says {expected} records, {count} were read")
                    return
                if tag != _RECORD_TAG:
                    what = "ends without its end marker" if not tag else f"has an unknown tag {tag!r}"
                    raise self._error(f"{what} after {count} records (cut short or damaged)")
                length, crc = _FRAMING.unpack(self._exactly(file, _FRAMING.size, count))
                if length > MAX_RECORD_BYTES:
                    raise self._error(f"record {count} claims {length} bytes (damaged)")
                body = self._exactly(file, length, count)
                if zlib.crc32(body) != crc:
                    raise self._error(f"record {count} fails its CRC-32 check (damaged)")
                yield _decode_record(body, lambda reason, number=count: self._error(f"record {number}: {reason}"))
                count += 1

    def _exactly(self, file: BinaryIO, size: int, count: int) -> bytes:
        data = file.read(size)
        if len(data) != size:
            raise self._error(f"is truncated in record {count}")
        return data

    def _error(self, reason: str) -> RecordingError:
        return RecordingError(f"{self.path}: {reason}")


def _read_header(file: BinaryIO, path: Path) -> RecordingHeader:
    prefix = file.read(_FILE_PREFIX.size)
    if len(prefix) < _FILE_PREFIX.size or not prefix.startswith(MAGIC):
        raise RecordingError(f"{path}: not a streamapp recording (no {MAGIC.decode()} magic)")
    _, version, length = _FILE_PREFIX.unpack(prefix)
    if version != VERSION:
        raise RecordingError(f"{path}: recording format version {version}; this build reads version {VERSION}")
    if length > MAX_HEADER_BYTES:
        raise RecordingError(f"{path}: header of {length} bytes (damaged)")
    try:
        header = json.loads(file.read(length))
        topics = {str(name): int(count) for name, count in header["topics"].items()}
        return RecordingHeader(topics, int(header["created_ms"]), str(header.get("note", "")))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RecordingError(f"{path}: unreadable header: {exc}") from None


class _Reader:
    def __init__(self, data: bytes, fail) -> None:
        self.data, self.at, self.fail = data, 0, fail

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise self.fail("fields run past the end of the record")
        chunk = self.data[self.at:self.at + size]
        self.at += size
        return chunk

    def unpack(self, layout: struct.Struct) -> tuple:
        return layout.unpack(self.take(layout.size))

    def text(self) -> str:
        try:
            return self.take(self.unpack(_SHORT)[0]).decode()
        except UnicodeDecodeError:
            raise self.fail("a topic or header name is not UTF-8") from None

    def blob(self) -> bytes | None:
        (length,) = self.unpack(_LENGTH)
        return None if length < 0 else self.take(length)


def _decode_record(body: bytes, fail) -> Record:
    reader = _Reader(body, fail)
    topic = reader.text()
    partition, offset, timestamp_ms = reader.unpack(_FIELDS)
    key, value = reader.blob(), reader.blob()
    headers = tuple((reader.text(), reader.blob()) for _ in range(reader.unpack(_SHORT)[0]))
    if reader.at != len(body):
        raise fail(f"{len(body) - reader.at} bytes left over after the last field")
    return Record(topic, None if partition < 0 else partition, offset, timestamp_ms, key, value, headers)


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
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False,
                                max_partition_fetch_bytes=max_record_bytes(settings),
                                fetch_max_bytes=max(max_record_bytes(settings), 50 * 1024**2))
    await start_client(consumer, settings.bootstrap_servers)
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
    await consumer._client.force_metadata_update()  # aiokafka learns of topics lazily
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
    from streamapp.publisher import interleave

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
