"""What the join store holds per join key: one pending side, or a marker that the key is done.

Every entry carries its own times, so expiry needs nothing but the entry itself: the store's
expiry index, a restored changelog and a rebalanced partition all derive them from the value.

* ``deadline_ms``: on the worker's clock. For a pending side, when it was stored plus the TTL:
  it leaves then if the other side is caught up and silent. For a marker, when it is forgotten.
* ``event_ms``: the pending record's Kafka timestamp (its frame's capture time): it leaves once
  the other side has been read past ``event_ms`` + TTL, however fast that happens.

Layout: ``kind (1 byte) | deadline_ms (u64 BE) | event_ms (u64 BE) | payload`` where the payload
is the wire record of the pending side (frames and results) or empty (markers).
"""

from __future__ import annotations

import dataclasses
import struct

_HEADER = struct.Struct(">cQQ")
HEADER_BYTES = _HEADER.size


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
        return _HEADER.pack(self.kind, self.deadline_ms, self.event_ms) + self.payload

    @classmethod
    def decode(cls, value: bytes) -> Entry:
        kind, deadline_ms, event_ms = _HEADER.unpack_from(value)
        if kind not in EntryKind.ALL:
            raise ValueError(f"join store entry of unknown kind {kind!r}")
        return cls(kind, deadline_ms, bytes(value[HEADER_BYTES:]), event_ms)


def peek_times(value: bytes) -> tuple[bytes, int, int]:
    """Kind, deadline and event time without copying the payload (used on every store write)."""
    return _HEADER.unpack_from(value)
