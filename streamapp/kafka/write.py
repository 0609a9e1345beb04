"""Produce requests written to the socket without joining their record batches into one bytes.

aiokafka encodes a request by joining bytes at every level of its schema (each partition's record
batch with its length, the partitions, the topics, the request, then the request with its size),
so a produce request's record batches, each up to a MiB, are copied about five times while the
output thread holds the interpreter lock: half of an aiokafka producer's CPU for ~50 KB records.
Here a produce request's small fields are encoded into one prefix and each record batch is handed
to the socket as it is, after its length. The bytes on the wire are the same.

Only produce requests of versions 3 to 8 (one schema) are written so; any other request goes
through aiokafka unchanged.
"""

from __future__ import annotations

import functools
import struct

from aiokafka import errors
from aiokafka.conn import AIOKafkaConnection, CloseReason
from aiokafka.protocol.produce import ProduceRequest_v3
from aiokafka.protocol.types import Int16, String
from aiokafka.util import wait_for

_PRODUCE_SCHEMA = ProduceRequest_v3.SCHEMA  # versions 4 to 8 share it
_STRING = String("utf-8")
_INT32 = struct.Struct(">i").pack


def produce_request_pieces(header: bytes, transactional_id: str | None, acks: int, timeout_ms: int,
                           topics) -> list[bytes]:
    """The request as it goes on the wire, size first: small fields joined, record batches as given."""
    pieces: list = []
    small = [header, _STRING.encode(transactional_id), Int16.encode(acks), _INT32(timeout_ms),
             _INT32(len(topics))]
    for topic, partitions in topics:
        small += (_STRING.encode(topic), _INT32(len(partitions)))
        for partition, records in partitions:
            small += (_INT32(partition), _INT32(len(records)))
            pieces += (b"".join(small), records)  # the batch as built, not copied
            small = []
    if small:
        pieces.append(b"".join(small))
    return [_INT32(sum(map(len, pieces))), *pieces]


def _send_produce(conn: AIOKafkaConnection, prepared, expect_response: bool):
    """aiokafka's ``AIOKafkaConnection.send`` for a prepared produce request, written in pieces."""
    correlation_id = conn._next_correlation_id()
    header = prepared.build_request_header(correlation_id=correlation_id, client_id=conn._client_id)
    pieces = produce_request_pieces(header.encode(), prepared.transactional_id, prepared.required_acks,
                                    prepared.timeout, prepared.topics)
    try:
        for piece in pieces:  # no await in between: nothing else is written into the request
            conn._writer.write(piece)
    except OSError as err:
        conn.close(reason=CloseReason.CONNECTION_BROKEN)
        raise errors.KafkaConnectionError(f"Connection at {conn._host}:{conn._port} broken: {err}") from err
    if not expect_response:
        return conn._writer.drain()
    future = conn._loop.create_future()
    conn._requests.append((correlation_id, prepared, future))
    return wait_for(future, conn._request_timeout)


def install() -> None:
    """Make every aiokafka connection in this process write produce requests so. Idempotent."""
    send = AIOKafkaConnection.send
    if getattr(send, "writes_batches_unjoined", False):
        return

    @functools.wraps(send)
    def send_batches_unjoined(self, request, expect_response=True):
        if self._writer is None or request.API_KEY != 0:
            return send(self, request, expect_response)
        prepared = request.prepare(self._versions)
        if prepared.SCHEMA is not _PRODUCE_SCHEMA:
            return send(self, request, expect_response)
        return _send_produce(self, prepared, expect_response)

    send_batches_unjoined.writes_batches_unjoined = True  # type: ignore[attr-defined]
    AIOKafkaConnection.send = send_batches_unjoined  # type: ignore[method-assign]
