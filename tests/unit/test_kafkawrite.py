"""A produce request written in pieces is, byte for byte, the request aiokafka would write."""

from __future__ import annotations

import os
import struct

import pytest
from aiokafka.protocol.produce import ProduceRequest

from streamapp.kafka.write import produce_request_pieces

TOPICS = [
    ("joined", [(0, os.urandom(300_000)), (3, bytearray(os.urandom(50)))]),
    ("dead-letters", [(1, b"x")]),
]


def aiokafka_bytes(prepared, header: bytes) -> bytes:
    """What ``AIOKafkaConnection.send`` writes: the size, the header, the request."""
    message = header + prepared.encode()
    return struct.pack(">i", len(message)) + message


@pytest.mark.parametrize("version", range(3, 9))
@pytest.mark.parametrize("transactional_id", [None, "streamapp-join-0"])
def test_pieces_join_to_aiokafkas_request(version, transactional_id):
    prepared = ProduceRequest(transactional_id, -1, 30_000, TOPICS).prepare({0: (0, version)})
    header = prepared.build_request_header(correlation_id=7, client_id="streamapp").encode()
    pieces = produce_request_pieces(header, prepared.transactional_id, prepared.required_acks,
                                    prepared.timeout, prepared.topics)
    assert b"".join(pieces) == aiokafka_bytes(prepared, header)


def test_record_batches_are_handed_over_not_copied():
    pieces = produce_request_pieces(b"header", None, -1, 30_000, TOPICS)
    batches = [records for _, partitions in TOPICS for _, records in partitions]
    assert [piece for piece in pieces if any(piece is batch for batch in batches)] == batches
