"""Records sent to one partition in as few record batches as they fill.

aiokafka's per-record ``send`` costs a future, a metadata wait, a partitioner call and an
accumulator lookup for each record. The join's changelog records and its outputs are sent in
runs, so each run goes into record batches built here and handed to the producer whole
(``create_batch`` / ``send_batch``): one future per batch, and the same bytes on the wire.

A value may be given as :class:`Pieces` (a joined frame's header and its JPEG, a view of the input
record): the batch joins the pieces once, where a value of its own would copy the JPEG first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, NamedTuple

from aiokafka.producer.message_accumulator import BatchBuilder


class Pieces:
    """A record's value as consecutive buffers, joined only into its record batch. Each piece is
    immutable (bytes, or a view of bytes), so the value cannot change before the batch is built."""

    __slots__ = ("parts", "size")

    def __init__(self, *parts: bytes | memoryview) -> None:
        self.parts = parts
        self.size = sum(len(part) for part in parts)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


Value = bytes | Pieces


class Delivery(NamedTuple):
    """Records sent in one batch: the future of its metadata (the first record's offset), and how many."""

    future: asyncio.Future
    records: int

    def last_offset(self) -> int:
        return self.future.result().offset + self.records - 1


async def send_in_batches(producer: Any, topic: str, partition: int,
                          records: Iterable[tuple[bytes, Value | None]]) -> list[Delivery]:
    """Send ``records`` (key, value) to ``partition`` of ``topic`` with aiokafka's ``producer``, in
    order; one Delivery per batch. A record larger than a batch goes alone in one (an empty batch
    takes any record); the caller refuses records larger than a request beforehand."""
    deliveries = []
    batch = producer.create_batch()
    for key, value in records:
        if batch.append(timestamp=None, key=key, value=value) is None:  # full
            deliveries.append(await _send(producer, batch, topic, partition))
            batch = producer.create_batch()
            batch.append(timestamp=None, key=key, value=value)
    if batch.record_count():
        deliveries.append(await _send(producer, batch, topic, partition))
    return deliveries


async def _send(producer: Any, batch: BatchBuilder, topic: str, partition: int) -> Delivery:
    batch.close()  # queued as it is: the producer's own sends do not join it
    return Delivery(await producer.send_batch(batch, topic, partition=partition), batch.record_count())
