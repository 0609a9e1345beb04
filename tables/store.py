"""The join store: Faust's RocksDB table store with a durable expiry index.

Each partition is one RocksDB database with two column families:

* ``default``: join key -> :class:`~streamapp.tables.entry.Entry` (plus Faust's offset marker);
* ``expiry``: ``deadline_ms (u64 BE) | join key`` -> ``kind | value length``, ordered by deadline.

Every write path keeps the two in step in one atomic write batch: agent writes (``_set``/``_del``),
changelog recovery and standby replay (``apply_changelog_batch``) and the sweeper (``write``).
Because the deadline lives in the entry, an index restored from the changelog alone, or opened
after a rebalance, is complete: nothing is kept in memory that a restart could lose (R4).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import rocksdict
from faust.stores import rocksdb as faust_rocksdb
from faust.streams import current_event
from faust.types import TP, EventT

from streamapp.tables.entry import EntryKind, peek_deadline
from streamapp.tables.memory import RocksMemory

EXPIRY_FAMILY = "expiry"
_DEADLINE = struct.Struct(">Q")
_INDEX_VALUE = struct.Struct(">cI")


@dataclasses.dataclass
class PartitionStats:
    """Running totals of all entries, and of the pending ones (frames and results, not markers)."""

    entries: int = 0
    bytes: int = 0
    pending_entries: int = 0
    pending_bytes: int = 0

    def add(self, kind: bytes, value_length: int, sign: int) -> None:
        self.entries += sign
        self.bytes += sign * value_length
        if kind in EntryKind.PENDING:
            self.pending_entries += sign
            self.pending_bytes += sign * value_length


class JoinPartition:
    """One partition's database: entries, their expiry index and running totals."""

    def __init__(self, db: rocksdict.Rdict) -> None:
        self.db = db
        self._index = db.get_column_family(EXPIRY_FAMILY)
        self._index_handle = db.get_column_family_handle(EXPIRY_FAMILY)
        self.stats = self._count()

    def get(self, key: bytes) -> Optional[bytes]:
        return self.db.get(key)

    def close(self) -> None:
        # The column-family handles share the database; all must go for its LOCK to be released.
        del self._index, self._index_handle
        self.db.close()

    def write(self, key: bytes, value: Optional[bytes]) -> None:
        """Put (or delete, when ``value`` is None) an entry and move its index key with it."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        self._stage(batch, key, _describe(self.db.get(key)), value)
        self.db.write(batch)

    def replay(self, changes: Iterable[tuple[bytes, Optional[bytes]]]) -> None:
        """Apply changelog records in order as one batch (recovery and standbys)."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        staged: dict[bytes, Optional[tuple[bytes, int, int]]] = {}
        for key, value in changes:
            old = staged[key] if key in staged else _describe(self.db.get(key))
            self._stage(batch, key, old, value)
            staged[key] = _describe(value)
        self.db.write(batch)

    def expired(self, now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, value) pairs whose deadline is at or before ``now_ms``."""
        found = []
        for index_key in self._index.keys():
            (deadline,) = _DEADLINE.unpack_from(index_key)
            if deadline > now_ms or len(found) >= limit:
                break
            key = bytes(index_key[_DEADLINE.size:])
            value = self.db.get(key)
            if value is not None:
                found.append((key, value))
        return found

    def by_deadline(self) -> Iterator[tuple[int, int]]:
        """(deadline, value length) of every entry, earliest deadline first."""
        for index_key, value in self._index.items():
            yield _DEADLINE.unpack_from(index_key)[0], _INDEX_VALUE.unpack(value)[1]

    def compact(self) -> None:
        """Rewrite the files without deleted entries, so their disk space comes back now."""
        self.db.compact_range(None, None)
        self._index.compact_range(None, None)

    def oldest_deadline_ms(self) -> Optional[int]:
        for index_key in self._index.keys():
            return _DEADLINE.unpack_from(index_key)[0]
        return None

    def oldest_pending_deadline_ms(self) -> Optional[int]:
        """The earliest deadline of a frame or result. Markers outlive pending entries, so the
        scan passes only the markers stored more than (marker TTL - TTL) before that entry."""
        for index_key, index_value in self._index.items():
            kind, _ = _INDEX_VALUE.unpack(index_value)
            if kind in EntryKind.PENDING:
                return _DEADLINE.unpack_from(index_key)[0]
        return None

    def _stage(self, batch, key: bytes, old: Optional[tuple[bytes, int, int]], new: Optional[bytes]) -> None:
        if old is not None:
            old_kind, old_deadline, old_length = old
            batch.delete(_DEADLINE.pack(old_deadline) + key, self._index_handle)
            self.stats.add(old_kind, old_length, -1)
        if new is None:
            batch.delete(key)
            return
        kind, deadline = peek_deadline(new)
        batch.put(key, new)
        batch.put(_DEADLINE.pack(deadline) + key, _INDEX_VALUE.pack(kind, len(new)), self._index_handle)
        self.stats.add(kind, len(new), +1)

    def _count(self) -> PartitionStats:
        # Bounded by what is pending (fps x TTL) plus markers, so a scan at open is cheap.
        stats = PartitionStats()
        for value in self._index.values():
            kind, length = _INDEX_VALUE.unpack(value)
            stats.add(kind, length, +1)
        return stats


def _describe(value: Optional[bytes]) -> Optional[tuple[bytes, int, int]]:
    """(kind, deadline, length) of a stored value: all the index needs to find and count it."""
    if value is None:
        return None
    return (*peek_deadline(value), len(value))


class JoinStore(faust_rocksdb.Store):
    """Faust store for the join table. Table options: ``memory`` (a RocksMemory)."""

    def __init__(self, url, app, table, *, options=None, **kwargs: Any) -> None:
        options = dict(options or {})
        self.memory: RocksMemory = options.pop("memory")
        super().__init__(url, app, table, options=options, driver="rocksdict", **kwargs)
        self._partitions: dict[int, JoinPartition] = {}

    # --- partitions ---------------------------------------------------------------------------

    def _open_for_partition(self, partition: int) -> rocksdict.Rdict:
        path = str(self.partition_path(partition))
        db = rocksdict.Rdict(
            path,
            options=self.memory.options(),
            column_families={EXPIRY_FAMILY: self.memory.options()},
        )
        self._partitions[partition] = JoinPartition(db)
        return db

    def partition(self, partition: int) -> JoinPartition:
        self._db_for_partition(partition)  # opens it on first use, like Faust does
        return self._partitions[partition]

    def revoke_partitions(self, table, tps) -> None:
        super().revoke_partitions(table, tps)
        for tp in tps:
            if tp.topic in table.changelog_topic.topics and tp.partition not in self._dbs:
                closing = self._partitions.pop(tp.partition, None)
                if closing is not None:
                    closing.close()

    async def stop(self) -> None:
        for partition in self._partitions.values():
            partition.close()
        self._partitions.clear()
        await super().stop()

    def active_partitions(self) -> Iterator[tuple[int, JoinPartition]]:
        """Partitions this worker owns (not standbys): the only ones it may expire."""
        actives = self.app.assignor.assigned_actives()
        topic = self.table.changelog_topic_name
        for number in sorted(self._partitions):
            if TP(topic, number) in actives:
                yield number, self._partitions[number]

    def still_owns(self, number: int, partition: JoinPartition) -> bool:
        """True while ``partition`` is open here and active: a rebalance may revoke or reopen it
        while a caller awaits something."""
        actives = self.app.assignor.assigned_actives()
        return (self._partitions.get(number) is partition
                and TP(self.table.changelog_topic_name, number) in actives)

    def all_partitions(self) -> Iterator[tuple[int, JoinPartition]]:
        return iter(sorted(self._partitions.items()))

    # --- Faust's write paths ------------------------------------------------------------------

    def _set(self, key: bytes, value: Optional[bytes]) -> None:
        self.partition(self._event_partition()).write(key, value)

    def _del(self, key: bytes) -> None:
        self.partition(self._event_partition()).write(key, None)

    def apply_changelog_batch(
        self,
        batch: Iterable[EventT],
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        by_partition: dict[int, list[tuple[bytes, Optional[bytes]]]] = {}
        offsets: dict[TP, int] = {}
        for event in batch:
            message = event.message
            by_partition.setdefault(message.partition, []).append((message.key, message.value))
            offsets[message.tp] = max(message.offset, offsets.get(message.tp, -1))
        for number, changes in by_partition.items():
            self.partition(number).replay(changes)
        for tp, offset in offsets.items():
            self.set_persisted_offset(tp, offset)

    def write(self, partition: int, key: bytes, value: Optional[bytes]) -> None:
        """A write outside any event (the sweeper); the caller sends the changelog record."""
        self.partition(partition).write(key, value)

    def _event_partition(self) -> int:
        event = current_event()
        if event is None:
            raise RuntimeError("join store written outside an event; use write(partition, ...)")
        return event.message.partition

    def disk_bytes(self) -> int:
        """Bytes of every partition directory on disk (SST files, WAL, manifests)."""
        total = 0
        for number in list(self._partitions):
            path = Path(self.partition_path(number))
            for root, _, files in os.walk(path):
                for name in files:
                    try:
                        total += os.path.getsize(os.path.join(root, name))
                    except OSError:
                        pass  # compaction removed it between listing and stat
        return total
