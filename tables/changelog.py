"""The join window's changelog records, sent straight to the producer.

Faust's ``Table.send_changelog`` wraps each record in its message, buffer and callback objects
and writes the offset marker to RocksDB from a callback per record: together more CPU than the
join's decision on the record. Here a window write's records go to the producer as they are,
in order, in as few record batches as they fill (one per record under exactly-once, where they
join Faust's transaction), and one callback per write, on its last batch, checks that they all
arrived and writes the offset marker once (the Kafka producer completes one partition's records
in order).
Faust still flushes this producer before it commits input offsets, so offsets never commit
ahead of the changelog records of their events (R4). A record that cannot be delivered stops
the worker: committing past it would lose state.
"""

from __future__ import annotations

import asyncio
import functools
from asyncio import CancelledError
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from faust.types import TP, TableT

from streamapp.kafka.producer import kafka_producer_of
from streamapp.recordbatches import Delivery, send_in_batches

if TYPE_CHECKING:
    from streamapp.tables.store import JoinStore


class ChangelogWriter:
    def __init__(self, table: TableT) -> None:
        self.table = table

    async def send(self, partition: int, changes: Sequence[tuple[bytes, bytes | None]]) -> None:
        """Send the changelog record of each change to ``partition``, in order."""
        if not changes:
            return
        app = self.table.app
        topic = self.table.changelog_topic.get_topic_name()
        if app.in_transaction:  # the records join the transaction that commits their inputs' offsets
            transactions = app.consumer.transactions
            deliveries = [
                Delivery(cast(asyncio.Future, await transactions.send(topic, key, value, partition, None, None)), 1)
                for key, value in changes]
        else:  # aiokafka's per-record send was a twentieth of the join's loop for these records alone
            deliveries = await send_in_batches(kafka_producer_of(app.producer), topic, partition, changes)
        deliveries[-1].future.add_done_callback(functools.partial(self._delivered, deliveries))

    def _delivered(self, deliveries: list[Delivery], last: asyncio.Future) -> None:
        app = self.table.app
        for delivery in deliveries:
            future = delivery.future
            failed = CancelledError("changelog send cancelled") if future.cancelled() else future.exception()
            if failed is not None:
                asyncio.ensure_future(app.crash(failed))
                return
        metadata = last.result()
        tp = TP(metadata.topic, metadata.partition)
        offset = deliveries[-1].last_offset()
        store: JoinStore = self.table.data  # type: ignore[assignment]
        if app.in_transaction:
            app.tables.persist_offset_on_commit(store, tp, offset)
        else:
            store.set_persisted_offset(tp, offset)

