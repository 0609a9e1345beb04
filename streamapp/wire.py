"""The wire format of every streamapp topic (version 1; documented in docs/wire-format.md).

A message value is::

    b"SA" | version (u8) | kind (u8) | header length N (u32, big-endian) | header | body

``header`` is N bytes of UTF-8 JSON with the metadata; ``body`` is the JPEG exactly as encoded
(frames and joined records) or empty (detections). JPEG bytes are never re-encoded, escaped or
copied into JSON, so a 250 KB frame costs 250 KB plus about 150 bytes on the wire and in state.

Decoders validate everything a producer could get wrong and raise :class:`WireError` with a reason
that names the field; callers dead-letter the original bytes with that reason.

Headers are parsed and written with ``orjson``, several times faster than the standard library
(docs/benchmarks.md, "Headers by orjson"): a join parses two headers and writes one per pair. It
reads what any JSON writer writes and is stricter
only where JSON is (``NaN`` is not JSON; integers past 64 bits come back as floats, which fail the
integer checks).
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
import threading
import time
from typing import cast

import orjson

from streamapp.errors import StreamappError

MAGIC = b"SA"
VERSION = 1
_PREFIX = struct.Struct(">2sBcI")  # magic, version, kind, header length
MAX_HEADER_BYTES = 64 * 1024
MAX_FRAME_INDEX = 2**40  # 2,300 years at 15 fps
MAX_EPOCH = 2**53
_STREAM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_DIMENSION = 16384
# Capture timestamps outside 2000-01-01 .. 2200-01-01 are nonsense, not clock skew.
MIN_TIMESTAMP_MS = 946_684_800_000
MAX_TIMESTAMP_MS = 7_258_118_400_000
_JPEG_START = b"\xff\xd8"


class Kind:
    FRAME = b"F"
    DETECTIONS = b"D"
    JOINED = b"J"


class WireError(StreamappError, ValueError):
    """A record that does not follow the wire format; ``reason`` says which part and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True, slots=True)
class FrameId:
    """The join key (R1): a frame is unique per stream, source run (epoch) and index."""

    stream: str
    epoch: int
    index: int

    def join_key(self) -> bytes:
        return f"{self.stream}:{self.epoch}:{self.index}".encode()

    def bucket_key(self, bucket_size: int) -> bytes:
        """Kafka key of every record of this frame: all topics that feed the join use it."""
        return f"{self.stream}:{self.epoch}:{self.index // bucket_size}".encode()


def parse_stream_id(raw: str) -> str:
    if not _STREAM_ID.fullmatch(raw):
        raise ValueError(
            f"stream id {raw!r} must be 1-64 characters of A-Z a-z 0-9 _ . - starting with a letter or digit")
    return raw


_epoch_lock = threading.Lock()
_last_epoch = 0


def new_epoch() -> int:
    """A run epoch: wall-clock milliseconds, strictly increasing within this process."""
    global _last_epoch
    with _epoch_lock:
        _last_epoch = max(time.time_ns() // 1_000_000, _last_epoch + 1)
        return _last_epoch


def run_of(join_key: bytes) -> bytes:
    """The camera run (``stream:epoch``) of a join key (``stream:epoch:index``): one clock."""
    return join_key.rpartition(b":")[0]


@dataclasses.dataclass(frozen=True, slots=True)
class Box:
    label: str
    score: float
    x: int
    y: int
    w: int
    h: int

    def as_json(self) -> dict:
        return {"label": self.label, "score": round(self.score, 4),
                "x": self.x, "y": self.y, "w": self.w, "h": self.h}


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    """A JPEG frame. ``source_width/height`` are the original size when this is a scaled copy."""

    id: FrameId
    timestamp_ms: int
    width: int
    height: int
    jpeg: bytes
    source_width: int | None = None
    source_height: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Detections:
    """What inference found on one frame, in the original frame's pixels. No boxes is a result."""

    id: FrameId
    boxes: tuple[Box, ...]
    model: str
    latency_ms: float
    frame_width: int
    frame_height: int


@dataclasses.dataclass(frozen=True, slots=True)
class Joined:
    """An original frame with its detections, or alone with ``detections is None`` (unmatched)."""

    frame: Frame
    detections: Detections | None

    @property
    def matched(self) -> bool:
        return self.detections is not None


# --- encoding ---------------------------------------------------------------------------------


def encode_frame(frame: Frame) -> bytes:
    return _pack(Kind.FRAME, _frame_header(frame), frame.jpeg)


def encode_detections(detections: Detections) -> bytes:
    return _pack(Kind.DETECTIONS, _detections_header(detections), b"")


def encode_joined(joined: Joined) -> bytes:
    return b"".join(joined_pieces(joined))


def joined_pieces(joined: Joined) -> tuple[bytes, bytes]:
    """A joined record as its magic, kind and header, then the frame's JPEG as it is (a view when
    the frame was decoded as one): for a writer that would copy the JPEG once more to join them."""
    header = _frame_header(joined.frame)
    header["status"] = "joined" if joined.matched else "unmatched"
    if joined.detections is not None:
        detections = _detections_header(joined.detections)
        header.update(boxes=detections["boxes"], model=detections["model"],
                      latency_ms=detections["latency_ms"])
    return _head(Kind.JOINED, header), joined.frame.jpeg


def _frame_header(frame: Frame) -> dict:
    header = {"stream": frame.id.stream, "epoch": frame.id.epoch, "index": frame.id.index,
              "ts_ms": frame.timestamp_ms, "width": frame.width, "height": frame.height}
    if frame.source_width is not None:
        header.update(source_width=frame.source_width, source_height=frame.source_height)
    return header


def _detections_header(detections: Detections) -> dict:
    return {"stream": detections.id.stream, "epoch": detections.id.epoch,
            "index": detections.id.index, "model": detections.model,
            "latency_ms": round(detections.latency_ms, 3),
            "width": detections.frame_width, "height": detections.frame_height,
            "boxes": [box.as_json() for box in detections.boxes]}


def _pack(kind: bytes, header: dict, body: bytes) -> bytes:
    return _head(kind, header) + body


def _head(kind: bytes, header: dict) -> bytes:
    header_bytes = orjson.dumps(header)  # compact, UTF-8
    return _PREFIX.pack(MAGIC, VERSION, kind, len(header_bytes)) + header_bytes


# --- decoding ---------------------------------------------------------------------------------


def peek_kind(value: bytes | None) -> bytes:
    """The record kind after checking magic and version; raises WireError otherwise."""
    kind, _, _ = _unpack_header(value)
    return kind


def peek_joined(value: bytes | None) -> tuple[FrameId, bool]:
    """A joined record's frame id and whether it met its result, from its header alone: the
    frame is neither copied nor checked (for readers that only count outputs)."""
    kind, header, _ = _unpack_header(value)
    if kind != Kind.JOINED:
        raise WireError(f"expected a {Kind.JOINED.decode()} record, got {kind.decode()}")
    return _frame_id(header), _status_matched(header)


def decode(value: bytes | None, *, max_frame_bytes: int | None = None,
           view: bool = False) -> Frame | Detections | Joined:
    """``view``: a frame's JPEG is a view of ``value`` rather than a copy (a 50 KB copy per frame),
    for a reader done with the record before it lets go of ``value``."""
    # Unpacked once: the header is parsed and the body sliced here only, not again by kind.
    kind, header, body = _unpack(value, view=view)
    if kind == Kind.FRAME:
        return _frame_from(header, body, max_frame_bytes)
    if kind == Kind.DETECTIONS:
        return _detections_record(header, body)
    return _joined_from(header, body, max_frame_bytes)


def decode_frame(value: bytes | None, *, max_frame_bytes: int | None = None, view: bool = False) -> Frame:
    """``view`` as for :func:`decode`."""
    header, body = _expect(value, Kind.FRAME, view=view)
    return _frame_from(header, body, max_frame_bytes)


def decode_detections(value: bytes | None) -> Detections:
    header, body = _expect(value, Kind.DETECTIONS)
    return _detections_record(header, body)


def decode_joined(value: bytes | None, *, max_frame_bytes: int | None = None) -> Joined:
    header, body = _expect(value, Kind.JOINED)
    return _joined_from(header, body, max_frame_bytes)


def _detections_record(header: dict, body: bytes) -> Detections:
    if body:
        raise WireError(f"detections: unexpected {len(body)} body bytes after the header")
    return _detections_from(header)


def _joined_from(header: dict, body: bytes, max_frame_bytes: int | None) -> Joined:
    frame = _frame_from(header, body, max_frame_bytes)
    if not _status_matched(header):
        return Joined(frame, None)
    detections = _detections_from({**header, "width": frame.width, "height": frame.height})
    return Joined(frame, detections)


def _status_matched(header: dict) -> bool:
    status = header.get("status")
    if status not in ("joined", "unmatched"):
        raise WireError(f"joined: status must be 'joined' or 'unmatched', got {status!r}")
    return status == "joined"


def _unpack(value: bytes | None, *, view: bool = False) -> tuple[bytes, dict, bytes]:
    kind, header, end = _unpack_header(value)
    if view:
        return kind, header, cast(bytes, memoryview(cast(bytes, value))[end:])  # read like bytes, never written
    return kind, header, bytes(cast(bytes, value)[end:])


def _unpack_header(value: bytes | None) -> tuple[bytes, dict, int]:
    """Kind, parsed header and where the body starts, after checking everything before the body."""
    if not value:
        raise WireError("empty payload")
    if len(value) < _PREFIX.size:
        raise WireError(f"truncated: {len(value)} bytes is shorter than the {_PREFIX.size}-byte prefix")
    magic, version, kind, header_length = _PREFIX.unpack_from(value)
    if magic != MAGIC:
        raise WireError(f"not a streamapp record: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise WireError(f"unknown wire-format version {version}; this build reads version {VERSION}")
    if kind not in (Kind.FRAME, Kind.DETECTIONS, Kind.JOINED):
        raise WireError(f"unknown record kind {kind!r}")
    if header_length > MAX_HEADER_BYTES:
        raise WireError(f"header of {header_length} bytes exceeds {MAX_HEADER_BYTES}")
    end = _PREFIX.size + header_length
    if len(value) < end:
        raise WireError(f"truncated: header says {header_length} bytes, {len(value) - _PREFIX.size} present")
    try:
        header = orjson.loads(value[_PREFIX.size:end])  # a slice of a view is not copied
    except orjson.JSONDecodeError as exc:  # malformed JSON and invalid UTF-8 alike
        raise WireError(f"header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a JSON object")
    return kind, header, end


def _expect(value: bytes | None, kind: bytes, *, view: bool = False) -> tuple[dict, bytes]:
    actual, header, body = _unpack(value, view=view)
    if actual != kind:
        raise WireError(f"expected a {kind.decode()} record, got {actual.decode()}")
    return header, body


def _frame_id(header: dict) -> FrameId:
    stream = _field(header, "stream", str)
    try:
        parse_stream_id(stream)
    except ValueError as exc:
        raise WireError(str(exc)) from None
    epoch = _int_in(header, "epoch", 0, MAX_EPOCH)
    index = _int_in(header, "index", 0, MAX_FRAME_INDEX)
    return FrameId(stream, epoch, index)


def _frame_from(header: dict, body: bytes, max_frame_bytes: int | None) -> Frame:
    frame_id = _frame_id(header)
    if not body:
        raise WireError("frame has no JPEG body")
    if max_frame_bytes is not None and len(body) > max_frame_bytes:
        raise WireError(f"frame of {len(body)} bytes exceeds the limit of {max_frame_bytes}")
    if body[:2] != _JPEG_START:  # not startswith: the body may be a memoryview
        raise WireError("frame body is not a JPEG (no start-of-image marker)")
    source_width = header.get("source_width")
    return Frame(
        id=frame_id,
        timestamp_ms=_int_in(header, "ts_ms", MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS),
        width=_int_in(header, "width", 1, MAX_DIMENSION),
        height=_int_in(header, "height", 1, MAX_DIMENSION),
        jpeg=body,
        source_width=None if source_width is None else _int_in(header, "source_width", 1, MAX_DIMENSION),
        source_height=None if source_width is None else _int_in(header, "source_height", 1, MAX_DIMENSION),
    )


def _detections_from(header: dict) -> Detections:
    frame_id = _frame_id(header)
    width = _int_in(header, "width", 1, MAX_DIMENSION)
    height = _int_in(header, "height", 1, MAX_DIMENSION)
    latency = _field(header, "latency_ms", (int, float))
    if not math.isfinite(latency) or latency < 0:
        raise WireError(f"latency_ms must be a finite, non-negative number, got {latency!r}")
    boxes = _field(header, "boxes", list)
    return Detections(
        id=frame_id,
        boxes=tuple(_box(raw, width, height) for raw in boxes),
        model=_field(header, "model", str),
        latency_ms=float(latency),
        frame_width=width,
        frame_height=height,
    )


def _box(raw, width: int, height: int) -> Box:
    if not isinstance(raw, dict):
        raise WireError(f"box is not an object: {raw!r}")
    score = _field(raw, "score", (int, float))
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise WireError(f"box score must be within 0..1, got {score!r}")
    x = _int_in(raw, "x", 0, width - 1)
    y = _int_in(raw, "y", 0, height - 1)
    w = _int_in(raw, "w", 1, width - x)
    h = _int_in(raw, "h", 1, height - y)
    return Box(_field(raw, "label", str), float(score), x, y, w, h)


def _field(header: dict, name: str, kinds):
    if name not in header:
        raise WireError(f"missing field {name!r}")
    value = header[name]
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise WireError(f"field {name!r} has the wrong type: {value!r}")
    return value


def _int_in(header: dict, name: str, low: int, high: int) -> int:
    value = header.get(name)
    if type(value) is int and low <= value <= high:  # the common case, without _field's call
        return value
    value = _field(header, name, int)
    if not low <= value <= high:
        raise WireError(f"field {name!r} = {value} is outside {low}..{high}")
    return value
