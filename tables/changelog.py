"""The join window's changelog records, sent straight to the producer.

Faust's ``Table.send_changelog`` wraps each record in its message, buffer and callback objects
and writes the offset marker to RocksDB from a callback per record: together more CPU than the
join's decision on the record. Here a window write's records go to the producer as they are,
in order, and one callback per write, on its last record, checks that they all arrived and
writes the offset marker once (the Kafka producer completes one partition's records in order).
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
        # Under exactly-once the records join the transaction that commits their inputs' offsets.
        sender = app.consumer.transactions if app.in_transaction else app.producer
        topic = self.table.changelog_topic.get_topic_name()
        deliveries = [cast(asyncio.Future, await sender.send(topic, key, value, partition, None, None))
                      for key, value in changes]
        deliveries[-1].add_done_callback(functools.partial(self._delivered, deliveries))

    def _delivered(self, deliveries: list[asyncio.Future], last: asyncio.Future) -> None:
        app = self.table.app
        for delivery in deliveries:
            failed = CancelledError("changelog send cancelled") if delivery.cancelled() else delivery.exception()
            if failed is not None:
                asyncio.ensure_future(app.crash(failed))
                return
        metadata = last.result()
        tp = TP(metadata.topic, metadata.partition)
        store: JoinStore = self.table.data  # type: ignore[assignment]
        if app.in_transaction:
            app.tables.persist_offset_on_commit(store, tp, metadata.offset)
        else:
            store.set_persisted_offset(tp, metadata.offset)
