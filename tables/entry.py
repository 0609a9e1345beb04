"""What the join store holds per join key: one pending side, or a marker that the key is done.

Every entry carries its own times, so expiry needs nothing but the entry itself: the store's
expiry index, a restored changelog and a rebalanced partition all derive them from the value.

* ``deadline_ms``: on the worker's clock. For a pending side, when it was stored plus the TTL:
  it leaves then if the other side is caught up and silent. For a marker, when it is forgotten.
* ``event_ms``: the pending record's Kafka timestamp (its frame's capture time): it leaves once
  the other side has been read past ``event_ms`` + TTL, however fast that happens.

Layout: ``version (1 byte) | kind (1 byte) | deadline_ms (u64 BE) | event_ms (u64 BE) | payload``
where the payload is the wire record of the pending side (frames and results) or empty (markers).
The same bytes are the store's value and the changelog record's, so both carry the version.
Entries written before the version byte (``kind | deadline_ms | event_ms | payload``) start with
a kind letter, never with a version number: :func:`upgrade_legacy` reads them.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import cast

from streamapp import wire
from streamapp.errors import StreamappError
from streamapp.jpeg import CorruptFrame, check_jpeg

FORMAT_VERSION = 1
_HEADER = struct.Struct(">BcQQ")
HEADER_BYTES = _HEADER.size
_LEGACY_HEADER_BYTES = HEADER_BYTES - 1


class EntryError(StreamappError, ValueError):
    """A join entry (a store value or a changelog record) this version cannot read."""


class EntryKind:
    FRAME = b"F"          # a frame waiting for its result
    RESULT = b"R"         # a result waiting for its frame
    JOINED = b"J"         # marker: the key was joined; later arrivals are duplicates
    EXPIRED = b"X"        # marker: the frame left unmatched; later results are late

    PENDING = (FRAME, RESULT)
    ALL = (FRAME, RESULT, JOINED, EXPIRED)


OTHER_SIDE = {EntryKind.FRAME: EntryKind.RESULT, EntryKind.RESULT: EntryKind.FRAME}


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    kind: bytes
    deadline_ms: int
    payload: bytes = b""
    event_ms: int = 0
    # A result's payload already decoded, while the entry is held by the join batch that stored
    # it: a pair completed in that batch does not parse the JSON twice. Never stored.
    decoded: object = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def is_pending(self) -> bool:
        return self.kind in EntryKind.PENDING

    def encode(self) -> bytes:
        return _HEADER.pack(FORMAT_VERSION, self.kind, self.deadline_ms, self.event_ms) + self.payload

    @classmethod
    def decode(cls, value: bytes) -> Entry:
        """A stored entry (its payload was checked before it was stored: see :func:`check`)."""
        kind, deadline_ms, event_ms = peek_times(value)
        return cls(kind, deadline_ms, bytes(value[HEADER_BYTES:]), event_ms)


def peek_times(value: bytes) -> tuple[bytes, int, int]:
    """Kind, deadline and event time from the header alone, without copying the payload (used on
    every store write, whose values this worker encoded or :func:`check` read)."""
    if len(value) < HEADER_BYTES:
        raise EntryError(f"join entry of {len(value)} bytes is shorter than its {HEADER_BYTES}-byte header")
    version, kind, deadline_ms, event_ms = _HEADER.unpack_from(value)
    if version != FORMAT_VERSION:
        raise EntryError(f"join entry of format version {version}; this streamapp reads version {FORMAT_VERSION}",
                         "run the streamapp version that wrote it, or let the entry go")
    if kind not in EntryKind.ALL:
        raise EntryError(f"join entry of unknown kind {kind!r}")
    return kind, deadline_ms, event_ms


def check(value: bytes, key: bytes) -> tuple[bytes, int, int]:
    """:func:`peek_times` of an entry from outside this worker (a changelog record under ``key``),
    after checking that its payload is what its kind holds: for a pending side, the record of the
    frame ``key`` names, read in full as the join will read it (every header field, the JPEG's
    markers, never its pixels), so that no record anyone may write to the changelog fails the join
    later, at every restart; nothing for a marker. Raises :class:`EntryError`."""
    kind, deadline_ms, event_ms = peek_times(value)
    payload = cast(bytes, memoryview(value)[HEADER_BYTES:])  # read like bytes
    if kind in EntryKind.PENDING:
        try:
            record_key = _pending_record(kind, payload).id.join_key()
        except (wire.WireError, CorruptFrame) as exc:
            raise EntryError(f"join entry of kind {kind.decode()} holds no record the join can read: {exc}") from None
        if record_key != key:
            raise EntryError(f"join entry under key {key!r} holds the record of {record_key!r}")
    elif payload:
        raise EntryError(f"join marker of kind {kind.decode()} carries {len(payload)} bytes")
    return kind, deadline_ms, event_ms


def _pending_record(kind: bytes, payload: bytes) -> wire.Frame | wire.Detections:
    """The record a pending side holds, checked as the join checks its input."""
    if kind == EntryKind.FRAME:
        frame = wire.decode_frame(payload, view=True)
        check_jpeg(frame.jpeg, (frame.width, frame.height))
        return frame
    return wire.decode_detections(payload)


def with_deadline(value: bytes, deadline_ms: int) -> bytes:
    """The same entry with another deadline."""
    version, kind, _, event_ms = _HEADER.unpack_from(value)
    return _HEADER.pack(version, kind, deadline_ms, event_ms) + bytes(value[HEADER_BYTES:])


def upgrade_legacy(value: bytes) -> bytes | None:
    """An entry in the layout before the version byte, in this one; None if it is not one."""
    if len(value) >= _LEGACY_HEADER_BYTES and bytes(value[:1]) in EntryKind.ALL:
        return bytes((FORMAT_VERSION,)) + bytes(value)
    return None
