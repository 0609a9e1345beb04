"""The join store: Faust's RocksDB table store with a durable expiry index.

Each partition is one RocksDB database with two column families:

* ``default``: join key -> :class:`~streamapp.tables.entry.Entry` (plus Faust's offset marker);
* ``expiry``: two orderings of the same entries, so that each expiry rule finds its due entries
  by reading the head of a sorted range, never by scanning the partition:

  - ``W | kind | deadline_ms | join key`` -> ``kind | value length``: every entry by its
    worker-clock deadline, one range per kind (markers always expire by it; a pending side only
    while the other side is caught up);
  - ``E | kind | run length | run | event_ms | join key`` -> empty: pending sides by their event
    time, one range per kind and camera run (``stream:epoch``), since cameras' clocks need not
    agree, and a restarted camera's clock need not continue where it was.

Every write path keeps the families in step in one atomic write batch: agent writes
(``write_in_event``), changelog recovery and standby replay (``apply_changelog_batch``), and the
join's own batches and sweeps (``write``). Recovery reads records this worker did not write: one it cannot
read (malformed, or of an unknown format version) is counted, logged once per partition and
skipped, so it never stops the join (:class:`ChangelogHealth`).

Because the times live in the entry, an index restored from the changelog alone, or opened after
a rebalance, is complete: nothing is kept in memory that a restart could lose (R4).
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import heapq
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import rocksdict
from faust.streams import current_event
from faust.types import TP, EventT

from streamapp.diskspace import is_disk_full, is_write_stall
from streamapp.errors import StreamappError, one_line
from streamapp.kafka.store import HookedStore
from streamapp.tables.entry import (
    FORMAT_VERSION,
    EntryError,
    EntryKind,
    check,
    peek_times,
    upgrade_legacy,
    with_deadline,
)
from streamapp.tables.memory import RocksMemory
from streamapp.wire import run_of

EXPIRY_FAMILY = "expiry"
_BY_DEADLINE = b"W"
_BY_EVENT = b"E"
_TIME = struct.Struct(">Q")
_INDEX_VALUE = struct.Struct(">cI")
_LAST_TIME = b"\xff" * _TIME.size
_PAST_ALL = b"\xff"  # above every index key (they start with W or E)
_NO_SLOWDOWN = rocksdict.WriteOptions()
_NO_SLOWDOWN.no_slowdown = True
# In each partition directory, written before RocksDB creates the database there: the entry
# format version of the store. A database without it was written before entries had one.
FORMAT_FILE = "STREAMAPP_JOIN_FORMAT"
# How long a stopping worker waits for the join's batch or sweep in progress before it closes the store.
STOP_WAIT_S = 10.0

log = logging.getLogger(__name__)


def _event_prefix(kind: bytes, run: bytes) -> bytes:
    return _BY_EVENT + kind + bytes((len(run),)) + run


@dataclasses.dataclass
class PartitionStats:
    """Running totals of all entries, and of the pending ones (frames and results, not markers)."""

    entries: int = 0
    bytes: int = 0
    pending_entries: int = 0
    pending_bytes: int = 0

    def add(self, kind: builtins.bytes, value_length: int, sign: int) -> None:  # the field shadows bytes
        self.entries += sign
        self.bytes += sign * value_length
        if kind in EntryKind.PENDING:
            self.pending_entries += sign
            self.pending_bytes += sign * value_length


class HeadFloors:
    """Where to start reading a range of the expiry index rather than at its first possible key:
    the first key read there the last time, lowered by any write below it.

    Entries leave each range from its head (earliest deadline or event time first), and RocksDB
    keeps each deleted key as a tombstone until a compaction drops it, so a read from the first
    possible key steps over every entry deleted since, at every expiry (docs/benchmarks.md,
    "Expiry over tombstones").
    A floor is never above a live key of its range, so a read from it finds the same keys and
    steps over only what was deleted since the last read."""

    def __init__(self) -> None:
        self._floors: dict[bytes, bytes] = {}

    def start(self, head: bytes) -> bytes:
        return self._floors.get(head, head)

    def found(self, head: bytes, first: bytes | None) -> None:
        """``first``: the first key at or after :meth:`start` (past the range if it is empty),
        None when there is none."""
        self._floors[head] = _PAST_ALL if first is None else first

    def written(self, head: bytes, key: bytes) -> None:
        floor = self._floors.get(head)
        if floor is not None and key < floor:
            self._floors[head] = key


# (kind, deadline, event time, length) of a stored value: all the index needs to find and count it.
_Described = tuple[bytes, int, int, int]


class JoinPartition:
    """One partition's database: entries, their expiry index and running totals."""

    def __init__(self, db: rocksdict.Rdict) -> None:
        self.db = db
        self._index = db.get_column_family(EXPIRY_FAMILY)
        self._index_handle = db.get_column_family_handle(EXPIRY_FAMILY)
        self._floors = HeadFloors()
        self.stats = self._count()

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def close(self) -> None:
        # The column-family handles share the database; all must go for its LOCK to be released.
        del self._index, self._index_handle
        self.db.close()

    def write(self, key: bytes, value: bytes | None) -> None:
        """Put (or delete, when ``value`` is None) an entry and move its index keys with it."""
        self.write_many([(key, value)])

    def write_many(self, changes: Iterable[tuple[bytes, bytes | None]], *, wait: bool = True) -> None:
        """Apply puts and deletes in order as one atomic batch (a join batch, recovery, standbys).

        With ``wait=False`` a write RocksDB would hold back (its flushes are behind, or failing on
        a full disk) raises "Write stall" at once instead of blocking the thread."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        staged: dict[bytes, _Described | None] = {}
        counted: list[tuple[bytes, int, int]] = []
        for key, value in changes:
            old = staged[key] if key in staged else _describe(self.db.get(key))
            self._stage(batch, key, old, value, counted)
            staged[key] = _describe(value)
        # A write that fails (a full disk) changed nothing, so the totals change only after it.
        self.db.write(batch, None if wait else _NO_SLOWDOWN)
        for kind, length, sign in counted:
            self.stats.add(kind, length, sign)


    def due_by_deadline(self, kinds: Iterable[bytes], now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, value) pairs of these kinds whose deadline is at or before ``now_ms``."""
        found: list[tuple[bytes, bytes]] = []
        for kind in kinds:
            prefix = _BY_DEADLINE + kind
            for index_key, _ in self._read(prefix):
                if len(found) >= limit or not index_key.startswith(prefix):
                    break
                (deadline,) = _TIME.unpack_from(index_key, len(prefix))
                if deadline > now_ms:
                    break
                self._found(found, bytes(index_key[len(prefix) + _TIME.size:]))
        return found

    def due_by_event(self, kind: bytes, read_past: Callable[[bytes], int | None], ttl_ms: int,
                     limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` pending entries of ``kind`` whose partner can no longer arrive: the
        other side has read their camera run past their event time + TTL (``read_past`` gives
        that side's latest event time per run, None if it has read nothing of it)."""
        found: list[tuple[bytes, bytes]] = []
        head = _BY_EVENT + kind
        cursor = self._index.iter()
        cursor.seek(self._floors.start(head))
        self._floors.found(head, bytes(cursor.key()) if cursor.valid() else None)
        while cursor.valid() and len(found) < limit:
            index_key = cursor.key()
            if not index_key.startswith(head):
                break
            length = index_key[len(head)]
            run = bytes(index_key[len(head) + 1:len(head) + 1 + length])
            prefix = len(head) + 1 + length
            (event_ms,) = _TIME.unpack_from(index_key, prefix)
            progress = read_past(run)
            if progress is not None and event_ms + ttl_ms < progress:
                self._found(found, bytes(index_key[prefix + _TIME.size:]))
                cursor.next()
            else:  # this run's later entries are later still: on to the next run
                cursor.seek(_event_prefix(kind, run) + _LAST_TIME)
        return found

    def by_deadline(self) -> Iterator[tuple[int, int]]:
        """(deadline, value length) of every entry, earliest deadline first."""
        return heapq.merge(*(self._deadlines(kind) for kind in EntryKind.ALL))

    def compact(self) -> None:
        """Rewrite the files without deleted entries, so their disk space comes back now."""
        self.db.compact_range(None, None)
        self._index.compact_range(None, None)

    def oldest_deadline_ms(self) -> int | None:
        return self._first_deadline(EntryKind.ALL)

    def oldest_pending_deadline_ms(self) -> int | None:
        """The earliest deadline of a frame or result."""
        return self._first_deadline(EntryKind.PENDING)

    def _first_deadline(self, kinds: Iterable[bytes]) -> int | None:
        return min((deadline for kind in kinds for deadline, _ in self._deadlines(kind, first_only=True)),
                   default=None)

    def _deadlines(self, kind: bytes, *, first_only: bool = False) -> Iterator[tuple[int, int]]:
        prefix = _BY_DEADLINE + kind
        for index_key, value in self._read(prefix):
            if not index_key.startswith(prefix):
                return
            yield _TIME.unpack_from(index_key, len(prefix))[0], _INDEX_VALUE.unpack(value)[1]
            if first_only:
                return

    def _read(self, head: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Index items in order from where ``head``'s range starts (its floor), on past its end."""
        items = _raw_items(self._index, self._floors.start(head))
        first = next(items, None)
        self._floors.found(head, None if first is None else first[0])
        if first is not None:
            yield first
            yield from items

    def _found(self, found: list, key: bytes) -> None:
        value = self.db.get(key)
        if value is not None:
            found.append((key, value))

    def _stage(self, batch, key: bytes, old: _Described | None, new: bytes | None,
               counted: list[tuple[bytes, int, int]]) -> None:
        if old is not None:
            old_kind, old_deadline, old_event, old_length = old
            batch.delete(_BY_DEADLINE + old_kind + _TIME.pack(old_deadline) + key, self._index_handle)
            if old_kind in EntryKind.PENDING:
                batch.delete(_event_prefix(old_kind, run_of(key)) + _TIME.pack(old_event) + key,
                             self._index_handle)
            counted.append((old_kind, old_length, -1))
        if new is None:
            batch.delete(key)
            return
        kind, deadline, event_ms = peek_times(new)
        batch.put(key, new)
        by_deadline = _BY_DEADLINE + kind + _TIME.pack(deadline) + key
        batch.put(by_deadline, _INDEX_VALUE.pack(kind, len(new)), self._index_handle)
        self._floors.written(_BY_DEADLINE + kind, by_deadline)
        if kind in EntryKind.PENDING:
            by_event = _event_prefix(kind, run_of(key)) + _TIME.pack(event_ms) + key
            batch.put(by_event, b"", self._index_handle)
            self._floors.written(_BY_EVENT + kind, by_event)
        counted.append((kind, len(new), +1))

    def _count(self) -> PartitionStats:
        # Bounded by what is pending (fps x TTL) plus markers, so a scan at open is cheap.
        stats = PartitionStats()
        for index_key, value in _raw_items(self._index, _BY_DEADLINE):
            if not index_key.startswith(_BY_DEADLINE):
                break
            kind, length = _INDEX_VALUE.unpack(value)
            stats.add(kind, length, +1)
        return stats


def _raw_items(family: rocksdict.Rdict, from_key: bytes) -> Iterator[tuple[bytes, bytes]]:
    # Opened in raw mode (RocksMemory.options), every key is bytes; rocksdict types keys as any
    # of the types its other modes store.
    return cast(Iterator[tuple[bytes, bytes]], family.items(from_key=from_key))


def _describe(value: bytes | None) -> _Described | None:
    if value is None:
        return None
    return (*peek_times(value), len(value))


class OldStoreFormat(StreamappError, RuntimeError):
    """A join store on disk in an entry format this version does not read."""


def check_store_format(paths: Iterable[Path]) -> None:
    """Refuse, before the worker starts, a join store written in another entry format: its
    entries would fail at the first read. Its changelog can restore it in this one (old records
    are upgraded as they are read), so the fix is to delete it."""
    for path in paths:
        if not (path / "CURRENT").exists():
            continue  # no database yet
        marker = path / FORMAT_FILE
        found = marker.read_text().strip() if marker.exists() else "none (written before entries had a version)"
        if found != str(FORMAT_VERSION):
            raise OldStoreFormat(
                f"join store {path} has entry format {found}; this streamapp reads format {FORMAT_VERSION}",
                f"stop the worker, delete {path.parent} and start it again: it restores the store from the "
                "changelog (see docs/operations.md, Upgrading)")


def mark_store_format(path: Path) -> None:
    """Mark a partition directory as holding this format, unless a database is there already
    (check_store_format has judged that one)."""
    if not (path / "CURRENT").exists():
        path.mkdir(parents=True, exist_ok=True)
        (path / FORMAT_FILE).write_text(f"{FORMAT_VERSION}\n")


@dataclasses.dataclass
class ChangelogHealth:
    """What recovery and standby replay met in the changelog.

    A record the store cannot read is skipped, counted, and logged for the first one of each
    partition only (a corrupt partition would log as often as records arrive). A batch the store
    cannot write is kept by Faust and tried again with the next records, or within 5 s: while it
    fails, :attr:`failing` says why (readiness), every failure is counted and each new reason
    logged, so a recovery that cannot finish is never silent.

    No entry waits longer than ``longest_wait_ms`` (the longer of the join's TTL and the markers')
    from when it is restored: one this project wrote was stored before now, so only a crafted
    deadline (or one from a longer TTL than today's) is brought forward, and counted."""

    longest_wait_ms: int
    clock: Callable[[], float] = time.time
    skipped: int = 0
    upgraded: int = 0
    deadlines_cut: int = 0
    failures: int = 0
    failing: str | None = None
    _logged: set[TP] = dataclasses.field(default_factory=set)

    def readable(self, message) -> tuple[bytes, bytes | None]:
        """The key and value to store for a changelog record (value None: a deletion); raises
        EntryError for one to skip."""
        key, value = message.key, message.value
        if key is None:  # never from our writer: a compacted topic refuses records without a key
            raise EntryError("a changelog record without a key")
        if value is None:
            return key, None
        try:
            check(value, key)
        except EntryError:
            upgraded = upgrade_legacy(value)
            if upgraded is None:
                raise
            check(upgraded, key)  # raises the error of the record as this layout reads it
            self.upgraded += 1
            value = upgraded
        return key, self._within_longest_wait(value)

    def _within_longest_wait(self, value: bytes) -> bytes:
        latest_ms = int(self.clock() * 1000) + self.longest_wait_ms
        if peek_times(value)[1] <= latest_ms:
            return value
        self.deadlines_cut += 1
        return with_deadline(value, latest_ms)

    def skip(self, message, error: EntryError) -> None:
        self.skipped += 1
        if message.tp not in self._logged:
            self._logged.add(message.tp)
            log.warning("join changelog %s partition %d offset %d: %s; skipped, and so is every further record "
                        "of this partition the store cannot read (counted in join_changelog_records_skipped_total, "
                        "not logged)", message.topic, message.partition, message.offset, one_line(error))

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        reason = f"join changelog recovery cannot write to the store: {one_line(error)}"
        if reason != self.failing:
            log.error("%s; Faust tries again with the next records", reason)
        self.failing = reason

    def succeeded(self) -> None:
        if self.failing is not None:
            log.info("join changelog recovery writes to the store again")
        self.failing = None

    def as_metrics(self) -> dict[str, float]:
        return {
            "join_changelog_records_skipped_total": self.skipped,
            "join_changelog_records_upgraded_total": self.upgraded,
            "join_changelog_deadlines_cut_total": self.deadlines_cut,
            "join_recovery_failures_total": self.failures,
            "join_recovery_failure_active": 0 if self.failing is None else 1,
        }


class JoinStore(HookedStore):
    """Faust store for the join table. Table options: ``memory`` (a RocksMemory), ``lock`` (the
    join window's: its batches and sweeps write while they hold it) and ``longest_wait_ms`` (see
    :class:`ChangelogHealth`)."""

    def __init__(self, url, app, table, *, options=None, **kwargs: Any) -> None:
        options = dict(options or {})
        self.memory: RocksMemory = options.pop("memory")
        self.writers: asyncio.Lock = options.pop("lock")
        longest_wait_ms: int = options.pop("longest_wait_ms")
        super().__init__(url, app, table, options=options, driver="rocksdict", **kwargs)
        self._partitions: dict[int, JoinPartition] = {}
        self.changelog_health = ChangelogHealth(longest_wait_ms)

    # --- partitions ---------------------------------------------------------------------------

    def open_partition(self, partition: int) -> rocksdict.Rdict:
        path = self.partition_path(partition)
        mark_store_format(path)
        db = rocksdict.Rdict(
            str(path),
            options=self.memory.options(),
            column_families={EXPIRY_FAMILY: self.memory.options()},
        )
        self._partitions[partition] = JoinPartition(db)
        return db

    def check_format(self, partitions: int) -> None:
        check_store_format(Path(self.partition_path(number)) for number in range(partitions))

    def partition(self, partition: int) -> JoinPartition:
        self.db_for_partition(partition)  # opens it on first use, like Faust does
        return self._partitions[partition]

    def revoke_partitions(self, table, tps) -> None:
        super().revoke_partitions(table, tps)
        for tp in tps:
            if tp.topic in table.changelog_topic.topics and not self.is_open(tp.partition):
                closing = self._partitions.pop(tp.partition, None)
                if closing is not None:
                    closing.close()

    async def stop(self) -> None:
        """Close the databases once the batch or sweep writing to them is done, and let none
        begin after. A stopping worker closes its tables before its agents (Faust's order): a
        batch still deciding would write to a closed database, and its crash stalled the stop."""
        try:
            await asyncio.wait_for(self.writers.acquire(), STOP_WAIT_S)  # never given back: the worker stops
        except TimeoutError:
            log.warning("the join's writes did not finish in %.0f s; its store is closed under them", STOP_WAIT_S)
        for partition in self._partitions.values():
            partition.close()
        self._partitions.clear()
        await super().stop()

    def active_partitions(self) -> Iterator[tuple[int, JoinPartition]]:
        """Partitions this worker owns (not standbys): the only ones it may expire."""
        actives = self.app.assignor.assigned_actives()
        topic = self.table.changelog_topic.get_topic_name()
        for number in sorted(self._partitions):
            if TP(topic, number) in actives:
                yield number, self._partitions[number]

    def still_owns(self, number: int, partition: JoinPartition) -> bool:
        """True while ``partition`` is open here and active: a rebalance may revoke or reopen it
        while a caller awaits something."""
        actives = self.app.assignor.assigned_actives()
        return (self._partitions.get(number) is partition
                and TP(self.table.changelog_topic.get_topic_name(), number) in actives)

    def all_partitions(self) -> Iterator[tuple[int, JoinPartition]]:
        return iter(sorted(self._partitions.items()))

    # --- Faust's write paths ------------------------------------------------------------------

    def write_in_event(self, key: bytes, value: bytes | None) -> None:
        self.partition(self._event_partition()).write(key, value)

    def apply_changelog_batch(
        self,
        batch: Iterable[EventT],
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        health = self.changelog_health
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}
        offsets: dict[TP, int] = {}
        for event in batch:
            message = event.message
            offsets[message.tp] = max(message.offset, offsets.get(message.tp, -1))
            try:
                change = health.readable(message)
            except EntryError as exc:
                health.skip(message, exc)
                continue
            by_partition.setdefault(message.partition, []).append(change)
        try:
            for number, changes in by_partition.items():
                self.partition(number).write_many(changes)
            for tp, offset in offsets.items():
                self.set_persisted_offset(tp, offset)
        except Exception as exc:
            health.failed(exc)
            raise
        health.succeeded()

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        """Faust writes this marker from a producer callback on the event loop, so it must never
        wait for RocksDB. One refused (a stall or a full disk) is left to the next changelog
        record's; until then recovery would only read a little more of the changelog."""
        try:
            self.db_for_partition(tp.partition).put(self.offset_key, str(offset).encode(), _NO_SLOWDOWN)
        except Exception as exc:  # noqa: BLE001 - RocksDB raises plain Exception
            if not (is_disk_full(exc) or is_write_stall(exc)):
                raise

    def write_many(self, partition: int, changes: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Writes outside any event (the join's batches and sweeps); the caller sends the
        changelog records, and retries a write refused as a stall (streamapp.diskspace)."""
        self.partition(partition).write_many(changes, wait=False)

    def _event_partition(self) -> int:
        event = current_event()
        if event is None:
            raise RuntimeError("join store written outside an event; use write_many(partition, ...)")
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
