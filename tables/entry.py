"""What the join store holds per join key: one pending side, or a marker that the key is done.

Every entry carries its own deadline, so expiry needs nothing but the entry itself: the store's
expiry index, a restored changelog and a rebalanced partition all derive it from the value.

Layout: ``kind (1 byte) | deadline_ms (u64 big-endian) | payload`` where the payload is the wire
record of the pending side (frames and results) or empty (markers).
"""

from __future__ import annotations

import dataclasses
import struct

_HEADER = struct.Struct(">cQ")


class EntryKind:
    FRAME = b"F"          # a frame waiting for its result
    RESULT = b"R"         # a result waiting for its frame
    JOINED = b"J"         # marker: the key was joined; later arrivals are duplicates
    EXPIRED = b"X"        # marker: the frame left unmatched; later results are late

    PENDING = (FRAME, RESULT)
    ALL = (FRAME, RESULT, JOINED, EXPIRED)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    kind: bytes
    deadline_ms: int
    payload: bytes = b""

    @property
    def is_pending(self) -> bool:
        return self.kind in EntryKind.PENDING

    def encode(self) -> bytes:
        return _HEADER.pack(self.kind, self.deadline_ms) + self.payload

    @classmethod
    def decode(cls, value: bytes) -> "Entry":
        kind, deadline_ms = _HEADER.unpack_from(value)
        if kind not in EntryKind.ALL:
            raise ValueError(f"join store entry of unknown kind {kind!r}")
        return cls(kind, deadline_ms, bytes(value[_HEADER.size:]))


def peek_deadline(value: bytes) -> tuple[bytes, int]:
    """Kind and deadline without copying the payload (used on every store write)."""
    kind, deadline_ms = _HEADER.unpack_from(value)
    return kind, deadline_ms
