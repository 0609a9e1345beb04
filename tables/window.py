"""The join window: a changelogged Faust table whose entries leave when their partner cannot come.

Faust's windowed tables expire from an in-memory heap that restarts empty, delete without writing
tombstones, and judge age by the wall clock at consumption. This window keeps each entry's times
in the entry and in the store's on-disk index, and expires by the data (DESIGN R3): a pending side
leaves once the other side of its partition has been read past its event time + TTL, or once that
side is caught up and the TTL has passed since the join read it. It sends the changelog
record of every change itself (R4), straight to the producer (streamapp.tables.changelog).

One writer at a time: the join's batches and its sweeps both hold :attr:`JoinWindow.lock` from
deciding to writing (a run of batches decided one on top of the other holds it throughout), so
an entry can never be joined by one and expired by the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import faust
from aiokafka import TopicPartition
from faust.stores import STORES

from streamapp.tables.changelog import ChangelogWriter
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.memory import RocksMemory
from streamapp.tables.progress import ReadProgress
from streamapp.tables.transaction import CHANGE_OVERHEAD_BYTES, JoinTransaction, Uncommitted, WriteRetry

if TYPE_CHECKING:
    from streamapp.tables.store import JoinStore

STORE_SCHEME = "streamapp-join"
STORE_URL = f"{STORE_SCHEME}://"

# Expired entries are handled in batches of this many, yielding to the event loop in between, so
# a large backlog (after a long stall or restart) never blocks heartbeats or the agents.
SWEEP_BATCH = 256
# Which input a pending side waits for: frames wait for results (side 1), results for frames (0).
_WAITS_FOR = {EntryKind.FRAME: 1, EntryKind.RESULT: 0}
_MARKERS = (EntryKind.JOINED, EntryKind.EXPIRED)


@dataclasses.dataclass(frozen=True)
class DueOutcome:
    """What replaces a due entry (None deletes it), and the delivery of what it emitted, if any."""

    replacement: Entry | None
    delivery: Awaitable | None = None


DueHandler = Callable[[bytes, Entry, int], Awaitable[DueOutcome]]


class PartitionCommits(Protocol):
    """Under exactly-once, the transactions of the join's input partitions
    (streamapp.kafka.transactions): one open transaction per partition, per generation, spanning
    the batches of a commit interval."""

    generation: int | None
    commit_open: Callable[[], Awaitable[None]]
    on_abort: Callable[[], None]

    def producer_in(self, generation: int | None, partition: int) -> Any:
        """The transactional producer of ``partition``, None unless ``generation`` is current."""

    def sender_in(self, generation: int | None, partition: int) -> Any:
        """``partition``'s open transaction behind Faust's producer ``send``."""

    def add(self, generation: int | None, partition: int, offsets: Mapping[TopicPartition, int] | None) -> bool:
        """``partition``'s open transaction holds changes, and commits ``offsets``; False if
        ``generation`` is past."""

    def take_open(self) -> dict[int, dict[TopicPartition, int]]:
        """The open transactions, with their offsets, to commit now."""

    def due(self) -> bool:
        """Whether the open transactions' interval has passed."""

    async def commit_if_due(self) -> None:
        """Commit the open transactions if their interval has passed."""

    async def commit_partition(self, generation: int | None, partition: int,
                               offsets: dict[TopicPartition, int] | None = None) -> bool:
        """Commit ``partition``'s transaction (with ``offsets``); False if ``generation`` is past."""


class JoinWindow:
    """Entries keyed by join key, each living until its partner cannot come, durable through the changelog."""

    # Under exactly-once (commit_in); None at least once.
    commits: PartitionCommits | None = None
    sweep_generation: int | None = None  # the generation a sweep began in, under exactly-once
    retry: WriteRetry | None = None  # how the store takes what committed, under exactly-once

    def __init__(
        self,
        app: faust.App,
        *,
        name: str,
        partitions: int,
        memory: RocksMemory,
        changelog_config: Mapping[str, Any],
        recovery_buffer_size: int,
        longest_wait_ms: int,
    ) -> None:
        self.lock = asyncio.Lock()
        STORES.aliases.setdefault(STORE_SCHEME, "streamapp.tables.store:JoinStore")  # as one is built, not on import
        self.table = app.Table(
            name,
            key_type=bytes,
            value_type=bytes,
            partitions=partitions,
            options={"memory": memory, "lock": self.lock, "longest_wait_ms": longest_wait_ms},
            extra_topic_configs=dict(changelog_config),
            recovery_buffer_size=recovery_buffer_size,
            standby_buffer_size=recovery_buffer_size,
        )
        self.memory = memory
        self.store.check_format(partitions)
        self.changelog = ChangelogWriter(self.table)
        # Pairs whose two sides met inside one batch: neither was written with its payload.
        self.pairs_completed_in_batch = 0
        self.uncommitted = Uncommitted(0)

    def commit_in(self, commits: PartitionCommits, retry: WriteRetry, max_bytes: int) -> None:
        """Under exactly-once: changes go into the open transactions of ``commits``, held up to
        ``max_bytes`` until they commit, then stored through ``retry``."""
        self.commits, self.retry, self.uncommitted = commits, retry, Uncommitted(max_bytes)
        commits.commit_open, commits.on_abort = self.commit_open, self.uncommitted.clear

    @property
    def store(self) -> JoinStore:
        """The table's store: the app's store URL is STORE_URL, so always a JoinStore."""
        return cast("JoinStore", self.table.data)

    def get(self, partition: int, key: bytes) -> Entry | None:
        """The entry as the open transactions left it (under exactly-once), else as stored."""
        held = self.uncommitted.held.get(partition)
        value = held[key] if held is not None and key in held else self.store.partition(partition).get(key)
        return None if value is None else Entry.decode(value)

    def transaction(self, base: JoinTransaction | None = None) -> JoinTransaction:
        """Writes held until committed; decided on top of ``base``'s, if it has not committed yet."""
        return JoinTransaction(self.get, self.write, self._count_pair_met, base,
                               transactional=self.commits is not None)

    def _count_pair_met(self) -> None:
        self.pairs_completed_in_batch += 1

    async def write(self, partition: int, changes: list[tuple[bytes, bytes | None]], retry: WriteRetry, *,
                    generation: int | None = None, offsets: dict[TopicPartition, int] | None = None) -> bool:
        """Store ``changes`` in one atomic batch through ``retry``, then send their changelog records.

        Under exactly-once they join ``partition``'s open transaction (which holds the outputs
        that imply them, and commits with ``offsets``), held in :attr:`uncommitted` until it
        commits (:meth:`commit_open`). False, and nothing written, when ``generation`` is past:
        the partition moved meanwhile."""
        if self.commits is None:
            await retry(functools.partial(self.store.write_many, partition, changes))
            await self.changelog.send(partition, changes)
            return True
        if not self.commits.add(generation, partition, offsets):
            return False
        self.uncommitted.add(partition, changes)
        return True

    def commit_due(self) -> bool:
        """Under exactly-once, whether the open transactions' interval has passed."""
        return self.commits is not None and self.commits.due()

    async def commit_if_due(self) -> None:
        """After a batch, under exactly-once: commit the open transactions if their interval has
        passed. Call it holding :attr:`lock`."""
        if self.commits is not None:
            await self.commits.commit_if_due()

    async def make_room(self, change_bytes: int) -> None:
        """Before a batch or a sweep round sends into the open transactions, under exactly-once:
        commit them first if their changes and ``change_bytes`` more (what it may change, at
        most) would pass the bound, counted. Call it holding :attr:`lock`."""
        if self.commits is not None and not self.uncommitted.has_room(change_bytes):
            self.uncommitted.commits_at_bound += 1
            await self.commit_open()

    async def commit_open(self) -> None:
        """Commit the open transactions, each with its changes' changelog records (the net change
        of its interval) and its offsets; only then does the store take the changes, so it never
        holds what an aborted transaction took back (a killed worker's store lacks at most the
        last commit, which recovery reads from the changelog). Call it holding :attr:`lock`."""
        commits, retry = cast(PartitionCommits, self.commits), cast(WriteRetry, self.retry)
        generation = commits.generation

        async def commit(partition: int, offsets: dict[TopicPartition, int]) -> None:
            producer, changes = commits.producer_in(generation, partition), self.uncommitted.changes(partition)
            if producer is None:
                return
            deliveries = await self.changelog.send_in_transaction(producer, partition, changes)
            if await commits.commit_partition(generation, partition, offsets) and changes:
                await retry(functools.partial(self.store.write_many, partition, changes))
                self.changelog.persisted(partition, deliveries)
            self.uncommitted.forget(partition)

        await asyncio.gather(*(commit(partition, offsets) for partition, offsets in commits.take_open().items()))

    def output_sender(self, partition: int, producer: Any) -> Any:
        """Where an expiry sends what it emits for ``partition``: ``producer`` (Faust's) at least
        once, the partition's transaction of the sweep's generation under exactly-once."""
        if self.commits is None:
            return producer
        return self.commits.sender_in(self.sweep_generation, partition)

    async def expire(self, now_ms: int, ttl_ms: int, progress: ReadProgress, on_due: DueHandler,
                     retry: WriteRetry) -> int:
        """Expire, in the partitions this worker owns, every entry whose partner can no longer
        arrive, and every marker past its deadline. Call it holding :attr:`lock`."""

        def due(number: int, partition) -> list[tuple[bytes, bytes]]:
            kinds = [*_MARKERS, *(kind for kind, side in _WAITS_FOR.items() if progress.caught_up(side, number))]
            found = partition.due_by_deadline(kinds, now_ms, SWEEP_BATCH)
            for kind, side in _WAITS_FOR.items():
                found += partition.due_by_event(kind, progress.side(side, number).read_past, ttl_ms, SWEEP_BATCH)
            return list(dict(found).items())  # an entry due by both rules leaves once

        return await self._expire_each(due, on_due, retry)

    async def shed(self, deadline_ms: int, on_due: DueHandler, retry: WriteRetry) -> int:
        """Expire early every entry with a deadline at or before ``deadline_ms`` (disk budget)."""
        return await self._expire_each(
            lambda number, partition: partition.due_by_deadline(EntryKind.ALL, deadline_ms, SWEEP_BATCH), on_due,
            retry)

    async def _expire_each(self, due: Callable[[int, Any], list[tuple[bytes, bytes]]], on_due: DueHandler,
                           retry: WriteRetry) -> int:
        """Entries change only once what they emitted is delivered: a worker killed in between
        emits it again after restart instead of losing it (R12). Once delivered, the write is
        retried until the disk takes it: an entry left as it was would be emitted again by the
        next sweep, with no crash at all."""
        store = self.store
        expired = 0
        if self.commits is not None:
            self.sweep_generation = self.commits.generation
        for number, partition in list(store.active_partitions()):
            while found := due(number, partition):
                # An entry the open transactions changed is due as they left it, once they commit.
                batch = [(key, value) for key, value in found if not self.uncommitted.holds(number, key)]
                if not batch:  # every entry found is held: a round before this one changed them
                    await self.commit_open()
                    if self.uncommitted.holds_any(number):
                        break  # nothing committed: the partition moved
                    continue
                await self.make_room(sum(len(key) + CHANGE_OVERHEAD_BYTES for key, _ in batch))
                outcomes = [await on_due(key, Entry.decode(value), number) for key, value in batch]
                await asyncio.gather(*(outcome.delivery for outcome in outcomes if outcome.delivery))
                if not store.still_owns(number, partition):
                    break  # revoked while delivering: its new owner expires these entries
                replacements = [(key, None if outcome.replacement is None else outcome.replacement.encode())
                                for (key, _), outcome in zip(batch, outcomes, strict=True)]
                if not await self.write(number, replacements, retry, generation=self.sweep_generation):
                    break  # the partition moved: its new owner expires these entries
                expired += len(batch)
                await asyncio.sleep(0)
        return expired

    def gauges(self, now_ms: int, ttl_ms: int, *, held_since_ms: int | None = None) -> dict[str, float]:
        """State of the owned partitions (standbys excluded), for metrics and reports.

        A pending entry was read at its deadline minus the TTL: its age survives restarts and
        rebalances because the deadline travels with the entry. ``held_since_ms``: when the
        oldest record the join holds back from the window was read; the oldest pending age is
        the older of the two.
        """
        store = self.store
        owned = [partition for _, partition in store.active_partitions()]
        next_due = _earliest(partition.oldest_deadline_ms() for partition in owned)
        oldest_deadline = _earliest(partition.oldest_pending_deadline_ms() for partition in owned)
        oldest_pending = _earliest([None if oldest_deadline is None else oldest_deadline - ttl_ms, held_since_ms])
        return {
            "join_state_entries": sum(partition.stats.entries for partition in owned),
            "join_state_bytes": sum(partition.stats.bytes for partition in owned),
            "join_pending_entries": sum(partition.stats.pending_entries for partition in owned),
            "join_pending_bytes": sum(partition.stats.pending_bytes for partition in owned),
            "join_oldest_pending_age_seconds":
                0.0 if oldest_pending is None else max(0.0, (now_ms - oldest_pending) / 1000),
            "join_next_expiry_seconds": 0.0 if next_due is None else max(0.0, (next_due - now_ms) / 1000),
            "join_pairs_completed_in_batch_total": self.pairs_completed_in_batch,
            **store.changelog_health.as_metrics(),
            "rocksdb_disk_bytes": store.disk_bytes(),
            "rocksdb_memory_bytes": self.memory.usage_bytes(),
        }


def _earliest(deadlines: Iterable[int | None]) -> int | None:
    return min((deadline for deadline in deadlines if deadline is not None), default=None)
