"""WholeResponseReader hands aiokafka exactly the bytes asyncio's reader would, over a real socket,
and a large response decodes from its chunks as it would from the joined bytes."""

from __future__ import annotations

import asyncio
import io
import itertools
import random
import struct

import pytest
from aiokafka.protocol.fetch import FetchResponse_v4

from streamapp.kafka.read import WHOLE_FROM_BYTES, ChunksReader, ResponseChunks, WholeResponseReader, _ResponseIO

MIB = 1024**2


def framed(payload: bytes) -> bytes:
    """A Kafka response on the wire: its size, then its bytes."""
    return struct.pack(">i", len(payload)) + payload


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """As aiokafka reads one: the size, then exactly that many bytes (a lost byte fails, not hangs);
    then all of it read as aiokafka's decoders would."""
    async with asyncio.timeout(30):
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        response = await reader.readexactly(size)
        assert isinstance(response, ResponseChunks) == (size >= WHOLE_FROM_BYTES)
        return _ResponseIO.BytesIO(response).read()


async def connected_reader(wire: bytes, *, piece: int, close: bool = True) -> WholeResponseReader:
    """A reader on a loopback connection whose server writes ``wire`` in ``piece``-byte writes."""

    async def serve(_, writer: asyncio.StreamWriter) -> None:
        for start in range(0, len(wire), piece):
            writer.write(wire[start:start + piece])
            await writer.drain()
            await asyncio.sleep(0)  # so the client reads in many pieces, not one
        if close:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader = WholeResponseReader(limit=2**16)  # aiokafka's limit: asyncio pauses the socket at 128 KiB
    await asyncio.get_running_loop().create_connection(
        lambda: asyncio.StreamReaderProtocol(reader), "127.0.0.1", port)
    return reader


@pytest.mark.parametrize("piece", [1000, 100_003, 4 * MIB])
def test_responses_large_and_small_arrive_whole_and_in_order(piece):
    rng = random.Random(piece)
    payloads = [rng.randbytes(3 * MIB), rng.randbytes(100), rng.randbytes(WHOLE_FROM_BYTES), rng.randbytes(MIB + 7)]

    async def scenario():
        reader = await connected_reader(b"".join(framed(payload) for payload in payloads), piece=piece)
        return [await read_response(reader) for _ in payloads]

    assert asyncio.run(scenario()) == payloads


def test_the_start_of_the_next_response_in_the_same_read_is_kept():
    first, second = b"a" * WHOLE_FROM_BYTES, b"b" * 10

    async def scenario():
        reader = WholeResponseReader(limit=2**16)
        reading = asyncio.ensure_future(read_response(reader))
        wire = framed(first) + framed(second)
        reader.feed_data(wire[:1000])
        await asyncio.sleep(0)
        reader.feed_data(wire[1000:])  # the rest of the first response and all of the second
        return await reading, await read_response(reader)

    assert asyncio.run(scenario()) == (first, second)


def test_a_connection_closed_inside_a_large_response_raises_with_what_came():
    async def scenario():
        reader = await connected_reader(struct.pack(">i", 2 * MIB) + b"x" * MIB, piece=64 * 1024)
        await read_response(reader)

    with pytest.raises(asyncio.IncompleteReadError) as raised:
        asyncio.run(scenario())
    assert (len(raised.value.partial), raised.value.expected) == (MIB, 2 * MIB)


def chunked(data: bytes, rng: random.Random, extra: bytes = b"") -> ResponseChunks:
    """``data`` cut at random places (some cuts empty), the last chunk running on into ``extra``."""
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(8)))
    bounds = [0, *cuts, len(data)]
    pieces = [data[start:end] for start, end in itertools.pairwise(bounds)]
    pieces[-1] += extra
    return ResponseChunks(pieces, len(data))


@pytest.mark.parametrize("seed", range(200))
def test_reads_from_chunks_match_reads_from_the_joined_bytes(seed):
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(1, 3000))
    chunks, joined = ChunksReader(chunked(data, rng, extra=b"next response")), io.BytesIO(data)
    for _ in range(40):
        size = rng.choice([-1, 0, 1, 2, 4, 8, rng.randrange(len(data) + 10)])
        expected = joined.read(size)
        got = chunks.read(size)
        assert type(got) is bytes and got == expected, (size, len(expected))


def test_a_fetch_response_decodes_from_chunks_as_from_its_bytes():
    rng = random.Random(7)
    records = [rng.randbytes(rng.randrange(10, 200_000)) for _ in range(6)]
    response = FetchResponse_v4(throttle_time_ms=0, topics=[
        ("frames", [(number, 0, 1000 + number, 1000 + number, [], records[number]) for number in range(3)]),
        ("results", [(number, 0, 5, 5, [(1, 2)], records[3 + number]) for number in range(3)])]).encode()
    from_chunks = FetchResponse_v4.decode(_ResponseIO.BytesIO(chunked(response, rng, extra=b"\0" * 9)))
    assert from_chunks.to_object() == FetchResponse_v4.decode(io.BytesIO(response)).to_object()
    assert [partition[-1] for _, partitions in from_chunks.topics for partition in partitions] == records
