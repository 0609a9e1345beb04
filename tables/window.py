"""The join window: a changelogged Faust table whose entries expire by their own deadline.

Faust's windowed tables expire from an in-memory heap that restarts empty, delete without writing
tombstones, and judge age by record timestamps. This window instead keeps each entry's deadline
in the entry and in the store's on-disk index, and expires from that index on a timer, writing the
changelog record for every expiry itself (R3, R4). Reads and writes from agents go through the
Faust table, so they are changelogged and partitioned exactly as Faust does it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional

import faust
from faust.stores import STORES

from streamapp.tables.entry import Entry
from streamapp.tables.memory import RocksMemory

STORE_SCHEME = "streamapp-join"
STORES.aliases.setdefault(STORE_SCHEME, "streamapp.tables.store:JoinStore")
STORE_URL = f"{STORE_SCHEME}://"

# Expired entries are handled in batches of this many, yielding to the event loop in between, so
# a large backlog (after a long stall or restart) never blocks heartbeats or the agents.
SWEEP_BATCH = 64


@dataclasses.dataclass(frozen=True)
class DueOutcome:
    """What replaces a due entry (None deletes it), and the delivery of what it emitted, if any."""

    replacement: Optional[Entry]
    delivery: Optional[Awaitable] = None


DueHandler = Callable[[bytes, Entry, int], Awaitable[DueOutcome]]


class JoinWindow:
    """Entries keyed by join key, each living until its deadline, durable through the changelog."""

    def __init__(
        self,
        app: faust.App,
        *,
        name: str,
        partitions: int,
        memory: RocksMemory,
        changelog_config: Mapping[str, Any],
        recovery_buffer_size: int,
    ) -> None:
        self.table = app.Table(
            name,
            key_type=bytes,
            value_type=bytes,
            partitions=partitions,
            options={"memory": memory},
            extra_topic_configs=dict(changelog_config),
            recovery_buffer_size=recovery_buffer_size,
            standby_buffer_size=recovery_buffer_size,
        )
        self.memory = memory

    # Inside an agent's event: partition and changelog come from the event, as Faust does it.
    def get(self, key: bytes) -> Optional[Entry]:
        value = self.table.get(key)
        return None if value is None else Entry.decode(value)

    def put(self, key: bytes, entry: Entry) -> None:
        self.table[key] = entry.encode()

    async def sweep(self, now_ms: int, on_due: DueHandler) -> int:
        """Expire every entry due at ``now_ms`` in the partitions this worker owns.

        ``on_due(key, entry, partition)`` decides what replaces the entry (a marker, or None to
        delete it) and may emit output. Entries change only once what they emitted is delivered:
        a worker killed in between emits it again after restart instead of losing it (R12).
        """
        store = self.table.data
        expired = 0
        for number, partition in list(store.active_partitions()):
            while True:
                due = partition.expired(now_ms, SWEEP_BATCH)
                outcomes = [await on_due(key, Entry.decode(value), number) for key, value in due]
                await asyncio.gather(*(outcome.delivery for outcome in outcomes if outcome.delivery))
                if not store.still_owns(number, partition):
                    break  # revoked while delivering: its new owner expires these entries
                for (key, value), outcome in zip(due, outcomes):
                    if partition.get(key) != value:
                        continue  # the agent completed or replaced the entry while we waited
                    encoded = None if outcome.replacement is None else outcome.replacement.encode()
                    partition.write(key, encoded)
                    self.table.send_changelog(number, key, encoded)
                expired += len(due)
                if len(due) < SWEEP_BATCH:
                    break
                await asyncio.sleep(0)
        return expired

    def gauges(self, now_ms: int, ttl_ms: int) -> dict[str, float]:
        """State of the owned partitions (standbys excluded), for metrics and reports.

        A pending entry was stored at its deadline minus the TTL: its age survives restarts and
        rebalances because the deadline travels with the entry.
        """
        store = self.table.data
        owned = [partition for _, partition in store.active_partitions()]
        next_due = _earliest(partition.oldest_deadline_ms() for partition in owned)
        oldest_pending = _earliest(partition.oldest_pending_deadline_ms() for partition in owned)
        return {
            "join_state_entries": sum(partition.stats.entries for partition in owned),
            "join_state_bytes": sum(partition.stats.bytes for partition in owned),
            "join_pending_entries": sum(partition.stats.pending_entries for partition in owned),
            "join_pending_bytes": sum(partition.stats.pending_bytes for partition in owned),
            "join_oldest_pending_age_seconds":
                0.0 if oldest_pending is None else max(0.0, (now_ms - oldest_pending + ttl_ms) / 1000),
            "join_next_expiry_seconds": 0.0 if next_due is None else max(0.0, (next_due - now_ms) / 1000),
            "rocksdb_disk_bytes": store.disk_bytes(),
            "rocksdb_memory_bytes": self.memory.usage_bytes(),
        }


def _earliest(deadlines: Iterable[Optional[int]]) -> Optional[int]:
    return min((deadline for deadline in deadlines if deadline is not None), default=None)
