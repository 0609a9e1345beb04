"""Crafted join entries: a well-formed entry (format version, kind, times) holding a well-formed
wire record (magic, version, kind, header length, a JSON object) whose header, body or frame the
join cannot use. Anyone who may write the join's changelog can write them.

Shared by the unit tests of the changelog check and the store, and the recovery test on the broker.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import orjson

from streamapp import wire
from streamapp.tables.entry import Entry, EntryKind

_PREFIX = struct.Struct(">2sBcI")
WIRE_KIND = {EntryKind.FRAME: wire.Kind.FRAME, EntryKind.RESULT: wire.Kind.DETECTIONS}
Fault = Callable[[dict, bytes], tuple[dict, bytes]]


def _without(name: str) -> Fault:
    return lambda header, body: ({field: value for field, value in header.items() if field != name}, body)


def _with(**fields) -> Fault:
    return lambda header, body: ({**header, **fields}, body)


_EITHER: dict[str, Fault] = {
    "an empty header": lambda header, body: ({}, body),
    "index a string": _with(index="x"),
    "stream a number": _with(stream=5),
    "epoch negative": _with(epoch=-1),
    "stream with a newline inside": _with(stream="cam\nx"),
    "no index": _without("index"),
    "width zero": _with(width=0),
    "height a float": _with(height=24.0),
}
# What is wrong with the record a pending side holds, by entry kind. Every one passed the
# changelog check that read only the record's prefix.
FAULTS: dict[bytes, dict[str, Fault]] = {
    EntryKind.FRAME: {
        **_EITHER,
        "no ts_ms": _without("ts_ms"),
        "ts_ms a string": _with(ts_ms="now"),
        "no body": lambda header, body: (header, b""),
        "a body that is not a JPEG": lambda header, body: (header, b"not a jpeg"),
    },
    EntryKind.RESULT: {
        **_EITHER,
        "no model": _without("model"),
        "boxes not a list": _with(boxes="none"),
        "a box outside the frame": _with(boxes=[{"label": "a", "score": 0.5, "x": 10**6, "y": 0, "w": 1, "h": 1}]),
        "latency negative": _with(latency_ms=-1),
        "a body after the header": lambda header, body: (header, b"x"),
    },
}
# Faults the join could read, but that the check refuses all the same: the entry would go out
# as a frame that cannot be drawn, or as another frame's.
QUIET_FAULTS: dict[bytes, dict[str, Fault]] = {
    EntryKind.FRAME: {
        "a JPEG of another size": lambda header, body: ({**header, "width": header["width"] + 16}, body),
        "another frame's record": lambda header, body: ({**header, "index": header["index"] + 1}, body),
    },
    EntryKind.RESULT: {
        "another frame's record": lambda header, body: ({**header, "index": header["index"] + 1}, body),
    },
}
CASES = [(kind, name) for kind, faults in FAULTS.items() for name in faults]
ALL_CASES = CASES + [(kind, name) for kind, faults in QUIET_FAULTS.items() for name in faults]


def record(kind: bytes, fault: str, frame: wire.Frame) -> bytes:
    """The wire record a pending side of ``kind`` holds for ``frame`` (the frame, or an empty
    result for it), spoiled by ``fault``."""
    if kind == EntryKind.FRAME:
        good = wire.encode_frame(frame)
    else:
        good = wire.encode_detections(wire.Detections(frame.id, (), "test", 1.0, frame.width, frame.height))
    *_, length = _PREFIX.unpack_from(good)
    end = _PREFIX.size + length
    spoil = FAULTS[kind].get(fault) or QUIET_FAULTS[kind][fault]
    header, body = spoil(orjson.loads(good[_PREFIX.size:end]), good[end:])
    head = orjson.dumps(header)
    return _PREFIX.pack(wire.MAGIC, wire.VERSION, WIRE_KIND[kind], len(head)) + head + body


def entry(kind: bytes, fault: str, frame: wire.Frame, *, deadline_ms: int, event_ms: int) -> bytes:
    """A changelog value for ``frame``'s join key: an entry of ``kind`` holding a spoiled record."""
    return Entry(kind, deadline_ms, record(kind, fault, frame), event_ms).encode()
