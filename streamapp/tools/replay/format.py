"""Recordings: Kafka records of one or more topics in a file, to replay later: the file format
(docs/recording-format.md), written and read.

A recording keeps what a consumer sees of each record (topic, partition, offset, timestamp, key,
value, headers), partitions merged by timestamp. Files are written and read one record at a time, so a
recording of any length costs one record of memory. Every record carries a CRC-32, and the file
ends with a marker holding the record count: a truncated or damaged file is an error that says
where, never a silently shorter replay.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from streamapp.errors import StreamappError

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
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:  # OverflowError: int(Infinity)
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
