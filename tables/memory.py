"""One RocksDB memory pool per process, shared by every table and partition (standbys included).

Faust opens each partition DB with its own 2 GiB block cache and three 64 MiB memtables, so memory
grows with the number of partitions a worker is given. Here every DB gets the same block cache, and
memtables are charged to that cache through one write-buffer manager, so the whole of RocksDB in
the process stays inside ``cache_bytes`` however many partitions move here.
"""

from __future__ import annotations

import dataclasses

import rocksdict

# Memtables are flushed at this size: small enough that a partition never holds much unflushed
# state, large enough that a 250 KB frame does not force a flush per write.
_MAX_MEMTABLE_BYTES = 16 * 1024**2


@dataclasses.dataclass(frozen=True)
class RocksMemory:
    cache_bytes: int
    cache: rocksdict.Cache
    write_buffers: rocksdict.WriteBufferManager

    @property
    def memtable_bytes(self) -> int:
        return min(_MAX_MEMTABLE_BYTES, max(1024**2, self.cache_bytes // 8))

    def options(self) -> rocksdict.Options:
        """Options for one DB (or column family) drawing on this pool."""
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_write_buffer_size(self.memtable_bytes)
        options.set_max_write_buffer_number(2)
        options.set_write_buffer_manager(self.write_buffers)
        # The WAL is shared by both column families and kept until both have flushed; the small
        # expiry index rarely fills a memtable, so without this limit every frame ever written
        # stays on disk in the WAL. Past it, RocksDB flushes whatever holds the oldest log.
        options.set_max_total_wal_size(self.memtable_bytes)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(self.cache)
        table.set_bloom_filter(10, False)
        options.set_block_based_table_factory(table)
        return options

    def usage_bytes(self) -> int:
        """Block cache plus the memtables charged to it."""
        return self.cache.get_usage()


_shared: RocksMemory | None = None


def shared_rocks_memory(cache_bytes: int) -> RocksMemory:
    """The process-wide pool; the first caller sizes it, later callers must agree."""
    global _shared
    if _shared is None:
        cache = rocksdict.Cache(cache_bytes)
        # allow_stall=False: a stalled write would block the event loop and miss heartbeats;
        # the manager still flushes early and charges memtables to the shared cache.
        manager = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            cache_bytes // 2, False, cache
        )
        _shared = RocksMemory(cache_bytes, cache, manager)
    elif _shared.cache_bytes != cache_bytes:
        raise ValueError(
            f"RocksDB memory pool already sized at {_shared.cache_bytes} bytes; "
            f"a second size ({cache_bytes}) would split the budget"
        )
    return _shared
