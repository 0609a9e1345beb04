"""The join window's changelog records, sent straight to the producer.

Faust's ``Table.send_changelog`` wraps each record in its message, buffer and callback objects
and writes the offset marker to RocksDB from a callback per record: together more CPU than the
join's decision on the record. Here a window write's records go to the producer as they are,
in order, in as few record batches as they fill, and one callback per write, on its last batch,
checks that they all arrived and writes the offset marker once (the Kafka producer completes one
partition's records in order).
Faust still flushes this producer before it commits input offsets, so offsets never commit
ahead of the changelog records of their events (R4). A record that cannot be delivered stops
the worker: committing past it would lose state.

Under exactly-once the records go to the transaction of their partition instead, and the offset
marker moves only once that transaction has committed and the store holds the changes
(streamapp.tables.window).
"""

from __future__ import annotations

import asyncio
import functools
from asyncio import CancelledError
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from faust.types import TP, TableT

from streamapp.kafka.producer import kafka_producer_of
from streamapp.recordbatches import Delivery, send_in_batches

if TYPE_CHECKING:
    from streamapp.tables.store import JoinStore


class ChangelogWriter:
    def __init__(self, table: TableT) -> None:
        self.table = table

    @property
    def topic(self) -> str:
        return self.table.changelog_topic.get_topic_name()

    async def send(self, partition: int, changes: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Send the changelog record of each change to ``partition``, in order, through Faust's
        producer; the offset marker moves once they have all arrived."""
        if not changes:
            return
        # aiokafka's per-record send was a twentieth of the join's loop for these records alone.
        producer = kafka_producer_of(self.table.app.producer)
        deliveries = await send_in_batches(producer, self.topic, partition, changes)
        deliveries[-1].future.add_done_callback(functools.partial(self._delivered, deliveries))

    async def send_in_transaction(self, producer: Any, partition: int,
                                  changes: Sequence[tuple[bytes, bytes | None]]) -> list[Delivery]:
        """Send the records through ``producer``, a transactional one with its transaction open;
        the caller moves the offset marker (:meth:`persisted`) once the transaction committed and
        the store has the changes."""
        if not changes:
            return []
        return await send_in_batches(producer, self.topic, partition, changes)

    def persisted(self, partition: int, deliveries: Sequence[Delivery]) -> None:
        """The store holds every change of ``deliveries``, all delivered: recovery reads on after them."""
        if deliveries:
            self._store().set_persisted_offset(TP(self.topic, partition), deliveries[-1].last_offset())

    def _delivered(self, deliveries: list[Delivery], last: asyncio.Future) -> None:
        app = self.table.app
        for delivery in deliveries:
            future = delivery.future
            failed = CancelledError("changelog send cancelled") if future.cancelled() else future.exception()
            if failed is not None:
                asyncio.ensure_future(app.crash(failed))
                return
        metadata = last.result()
        self._store().set_persisted_offset(TP(metadata.topic, metadata.partition), deliveries[-1].last_offset())

    def _store(self) -> JoinStore:
        return self.table.data  # type: ignore[return-value]
