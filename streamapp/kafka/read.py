"""Kafka responses read off the socket without asyncio's growing buffer, and decoded without
joining them first.

aiokafka reads each response with ``StreamReader.readexactly(size)``. asyncio's reader extends one
bytearray with every socket read, pausing the socket each time it holds 128 KiB, and then copies
the whole response out of it. A backlog's fetch responses are many MiB (~50 KB frames, up to the
fetch limit on every partition), and in a drain that buffering held the GIL longer than the join
decisions (docs/benchmarks.md). :class:`WholeResponseReader` keeps the socket's
reads of a large response as they come (:class:`ResponseChunks`).

aiokafka then decodes a response from ``io.BytesIO(response)``, which copies each record set out of
the response again. Joining the chunks into one bytes first would be a third copy ("Fetch
responses decoded from the socket's reads"). A large response is decoded from :class:`ChunksReader` instead: a
record set is joined once from the reads it spans, and the whole response never exists as one.

Nothing is buffered beyond the one response being read. Its size is the length the broker puts in
front of it, trusted here as aiokafka trusts it: the fetch limits bound it only as far as the
broker honours them.
"""

from __future__ import annotations

import asyncio
import functools
import io
from collections.abc import Awaitable, Callable

import aiokafka.conn
from aiokafka.conn import AIOKafkaConnection

# Reads from this size on are gathered as chunks; smaller ones (headers, acks, metadata) go through
# asyncio's buffer, where they cost nothing.
WHOLE_FROM_BYTES = 256 * 1024


class ResponseChunks(tuple):
    """The socket reads of one response, in order; the last may run on past the response's ``size``
    bytes (into the next response, whose start the reader also keeps)."""

    size: int

    def __new__(cls, chunks: list[bytes], size: int) -> ResponseChunks:
        made = super().__new__(cls, chunks)
        made.size = size
        return made


class ChunksReader:
    """``io.BytesIO(response).read`` over a response's chunks, all aiokafka's protocol decoders
    call: a field within one chunk is sliced out of it, one across chunks joined from its pieces."""

    def __init__(self, chunks: ResponseChunks) -> None:
        self._chunks = chunks
        self._left = chunks.size  # bytes of the response not yet read
        self._index = 0           # the chunk being read
        self._at = 0              # where in it

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        self._left -= size
        chunk = self._chunks[self._index] if self._index < len(self._chunks) else b""
        end = self._at + size
        if end < len(chunk):  # within the chunk: every small field, and most of a chunk's records
            piece = chunk[self._at:end]
            self._at = end
            return piece
        pieces = []
        while size:
            chunk = self._chunks[self._index]
            take = min(size, len(chunk) - self._at)
            pieces.append(memoryview(chunk)[self._at:self._at + take])
            size -= take
            self._at += take
            if self._at == len(chunk):
                self._index, self._at = self._index + 1, 0
        return b"".join(pieces)


class _ResponseIO:
    """Stands in for the ``io`` module inside ``aiokafka.conn``, whose frame handler makes the
    buffer it decodes a response from with ``io.BytesIO(response)`` and uses ``io`` for nothing
    else. Responses to SASL handshakes, passed on undecoded, are small: always bytes."""

    @staticmethod
    def BytesIO(response: bytes | ResponseChunks) -> io.BytesIO | ChunksReader:  # noqa: N802 - io's name
        if isinstance(response, ResponseChunks):
            return ChunksReader(response)
        return io.BytesIO(response)


class WholeResponseReader(asyncio.StreamReader):
    """A StreamReader whose large ``readexactly`` gathers the socket's reads and hands them on
    unjoined, as :class:`ResponseChunks`; smaller reads return bytes as asyncio's do."""

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

    async def readexactly(self, n: int) -> bytes | ResponseChunks:  # type: ignore[override]
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
            self._buffer.extend(memoryview(chunks[-1])[self._missing:])
        self._missing = 0
        self._maybe_resume_transport()
        return ResponseChunks(chunks, n)


def install() -> None:
    """Make every aiokafka connection opened from now on in this process read through
    :class:`WholeResponseReader`, and decode large responses from their chunks. Idempotent."""
    aiokafka.conn.io = _ResponseIO  # type: ignore[assignment]
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
