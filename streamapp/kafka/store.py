"""Faust's RocksDB table store with the private hooks the join store needs under names of ours:
Faust opens a partition's database, and writes an agent's table changes, through methods it
calls privately; the join store opens its databases with an expiry column family and keeps that
index in step with every write (streamapp.tables.store)."""

from __future__ import annotations

import rocksdict
from faust.stores import rocksdb as faust_rocksdb


class HookedStore(faust_rocksdb.Store):
    """Faust's RocksDB store; a subclass opens databases and writes an event's changes."""

    def open_partition(self, partition: int) -> rocksdict.Rdict:
        """A partition's database, opened when Faust first needs it."""
        raise NotImplementedError

    def write_in_event(self, key: bytes, value: bytes | None) -> None:
        """An agent's change to the table while it handles an event (value None: a deletion)."""
        raise NotImplementedError

    def db_for_partition(self, partition: int) -> rocksdict.Rdict:
        """The partition's database, opened on first use as Faust opens it."""
        return self._db_for_partition(partition)

    def is_open(self, partition: int) -> bool:
        """Whether Faust holds the partition's database open."""
        return partition in self._dbs

    def _open_for_partition(self, partition: int) -> rocksdict.Rdict:
        return self.open_partition(partition)

    def _set(self, key: bytes, value: bytes | None) -> None:
        self.write_in_event(key, value)

    def _del(self, key: bytes) -> None:
        self.write_in_event(key, None)
