"""Kafka responses read off the socket without asyncio's growing buffer.

aiokafka reads each response with ``StreamReader.readexactly(size)``. asyncio's reader extends one
bytearray with every socket read, pausing the socket each time it holds 128 KiB, and then copies
the whole response out of it. A backlog's fetch responses are many MiB (~50 KB frames, up to the
fetch limit on every partition), and that buffering was 16 % of the join worker's time holding
the GIL in a drain, more than its join decisions. :class:`WholeResponseReader` keeps the socket's
reads of a large response as they come and joins them once.

Nothing is buffered beyond the response aiokafka asked for, which its fetch limits bound.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from aiokafka.conn import AIOKafkaConnection

# Reads from this size on are gathered as chunks; smaller ones (headers, acks, metadata) go through
# asyncio's buffer, where they cost nothing.
WHOLE_FROM_BYTES = 256 * 1024


class WholeResponseReader(asyncio.StreamReader):
    """A StreamReader whose large ``readexactly`` gathers the socket's reads and joins them once."""

    _chunks: list | None = None   # the socket reads of the large read in progress
    _missing = 0                  # bytes still to come for it; negative once the next response began

    # asyncio's own state, which the stubs leave out (annotations only: nothing is shadowed).
    _buffer: bytearray
    _eof: bool
    _exception: BaseException | None
    _wakeup_waiter: Callable[[], None]
    _wait_for_data: Callable[[str], Awaitable[None]]
    _maybe_resume_transport: Callable[[], None]

    def feed_data(self, data: bytes) -> None:  # type: ignore[override]  # the transport feeds bytes
        if self._chunks is None or not data:
            super().feed_data(data)
            return
        self._chunks.append(data)
        self._missing -= len(data)
        if self._missing <= 0:
            self._wakeup_waiter()

    async def readexactly(self, n: int) -> bytes:
        if n < WHOLE_FROM_BYTES or len(self._buffer) >= n or self._exception is not None:
            return await super().readexactly(n)
        chunks = self._chunks = [bytes(self._buffer)]
        self._missing = n - len(self._buffer)
        self._buffer.clear()
        try:
            while self._missing > 0:
                if self._eof:
                    raise asyncio.IncompleteReadError(b"".join(chunks), n)
                await self._wait_for_data("readexactly")  # resumes a paused socket
        finally:
            self._chunks = None
        if self._missing < 0:  # the last read holds the start of the next response: keep it
            last = memoryview(chunks[-1])
            end = len(last) + self._missing
            self._buffer.extend(last[end:])
            chunks[-1] = last[:end]
        self._missing = 0
        self._maybe_resume_transport()
        return b"".join(chunks)


def install() -> None:
    """Make every aiokafka connection opened from now on in this process read through
    :class:`WholeResponseReader`. Idempotent."""
    connect = AIOKafkaConnection.connect
    if getattr(connect, "reads_whole_responses", False):
        return

    @functools.wraps(connect)
    async def connect_reading_whole_responses(self):
        opened = await connect(self)
        # aiokafka makes a plain StreamReader inside connect(); its subclass only adds class
        # attributes, so the reader it made can take the subclass's methods.
        self._reader.__class__ = WholeResponseReader
        return opened

    connect_reading_whole_responses.reads_whole_responses = True  # type: ignore[attr-defined]
    AIOKafkaConnection.connect = connect_reading_whole_responses  # type: ignore[method-assign]
