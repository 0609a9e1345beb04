"""Writes of one join batch, held until what they imply has been delivered.

The join decides a whole batch against the store plus the writes of the batch so far, sends its
outputs, and only once they are delivered writes the entries (one atomic RocksDB batch per
partition) and their changelog records. A worker killed in between sees the pending entries
again when the input is redelivered, and emits again instead of finding a "joined" marker for a
record that never left (R12). A pair that completes inside one batch is never written with its
payload: only its marker reaches RocksDB and the changelog.

While one batch's outputs are on their way, the next is decided on top of it: a transaction reads
through the writes its ``base`` still holds, and commits after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from aiokafka import TopicPartition
from faust.types import EventT

from streamapp.tables.entry import HEADER_BYTES, OTHER_SIDE, Entry, EntryKind

# Runs a store write until the disk takes it (DiskGuard.written): a full disk, or RocksDB refusing
# writes while its flushes catch up.
WriteRetry = Callable[[Callable[[], None]], Awaitable[None]]
# Reads a partition's entry as stored (JoinWindow.get).
Reader = Callable[[int, bytes], Entry | None]


class Writer(Protocol):
    """Stores one partition's changes in one atomic batch through the retry, then sends their
    changelog records; under exactly-once in the partition's transaction of ``generation``, which
    commits with ``offsets`` (JoinWindow.write)."""

    def __call__(self, partition: int, changes: list[tuple[bytes, bytes | None]], retry: WriteRetry, *,
                 generation: int | None = None, offsets: dict[TopicPartition, int] | None = None) -> Awaitable[bool]:
        ...


_NOTHING_HELD: dict[bytes, Entry | None] = {}  # never written: what a partition without writes holds


class JoinTransaction:
    """``pair_met`` is called for each pair whose two sides meet inside this transaction;
    ``transactional`` under exactly-once, where each partition's writes commit with its offsets."""

    def __init__(self, read: Reader, write: Writer, pair_met: Callable[[], None],
                 base: JoinTransaction | None = None, *, transactional: bool = False) -> None:
        self.read, self.write, self.pair_met, self.base = read, write, pair_met, base
        self.transactional = transactional
        self.held: dict[int, dict[bytes, Entry | None]] = {}

    def partition(self, number: int) -> PartitionWrites:
        return PartitionWrites(self, number)

    async def commit(self, retry: WriteRetry, events: Sequence[EventT] = ()) -> None:
        """Write each partition's changes (through ``retry``) and send their changelog records.
        Under exactly-once each partition of ``events`` (the batch decided, all of one
        generation) commits them with its input offsets, changes or not."""
        offsets: dict[int, dict[TopicPartition, int]] = {}
        generation = events[0].message.generation_id if events else None
        if self.transactional:
            for event in events:
                message = event.message
                ends, tp = offsets.setdefault(message.partition, {}), TopicPartition(message.topic, message.partition)
                ends[tp] = max(ends.get(tp, 0), message.offset + 1)
        async def write(number: int) -> None:
            changes = [(key, None if entry is None else entry.encode())
                       for key, entry in self.held.get(number, _NOTHING_HELD).items()]
            await self.write(number, changes, retry, generation=generation, offsets=offsets.get(number))
            self.held.pop(number, None)  # written: a retry of the commit does not send it again

        numbers = sorted(set(self.held) | set(offsets))
        if not self.transactional:
            for number in numbers:
                await write(number)
        else:  # each partition's commit waits for the broker: all at once
            await asyncio.gather(*(write(number) for number in numbers))
        self.base = None

    def get(self, number: int, key: bytes) -> Entry | None:
        """The entry as this transaction sees it: its own writes, then its base's, then the store.
        A base's own base has committed before this transaction was begun (a run finishes each
        batch before it decides the one after next), so its writes are stored."""
        for transaction in (self, self.base):
            if transaction is not None and key in (held := transaction.held.get(number, _NOTHING_HELD)):
                return held[key]
        return self.read(number, key)


class PartitionWrites:
    """The JoinState of one partition inside a transaction."""

    __slots__ = ("transaction", "number")

    def __init__(self, transaction: JoinTransaction, number: int) -> None:
        self.transaction, self.number = transaction, number

    def get(self, key: bytes) -> Entry | None:
        return self.transaction.get(self.number, key)

    def put(self, key: bytes, entry: Entry | None) -> None:
        held = self.transaction.held.setdefault(self.number, {})
        waiting = held.get(key)
        if entry is not None and entry.kind == EntryKind.JOINED and waiting is not None and waiting.kind in OTHER_SIDE:
            self.transaction.pair_met()
        held[key] = entry


class Uncommitted:
    """Under exactly-once, the store changes of the open transactions, by partition: the store
    takes them only once their transaction has committed (an aborted one leaves nothing behind),
    and until then every batch and sweep reads through them. Bounded in bytes: before a batch
    or a sweep round whose changes could pass ``max_bytes``, the open transactions commit
    (:meth:`JoinWindow.make_room`), and :attr:`commits_at_bound` counts it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held: dict[int, dict[bytes, bytes | None]] = {}
        self.bytes = 0
        self.commits_at_bound = 0

    def add(self, partition: int, changes: Sequence[tuple[bytes, bytes | None]]) -> None:
        held = self.held.setdefault(partition, {})
        for key, value in changes:
            if key in held:
                self.bytes -= _size(key, held[key])
            held[key] = value
            self.bytes += _size(key, value)

    def holds(self, partition: int, key: bytes) -> bool:
        return key in self.held.get(partition, _NOTHING_ENCODED)

    def holds_any(self, partition: int) -> bool:
        return bool(self.held.get(partition))

    def changes(self, partition: int) -> list[tuple[bytes, bytes | None]]:
        return list(self.held.get(partition, _NOTHING_ENCODED).items())

    def has_room(self, change_bytes: int) -> bool:
        """Whether ``change_bytes`` more stay within the bound (nothing held always has room)."""
        return self.bytes == 0 or self.bytes + change_bytes <= self.max_bytes

    def forget(self, partition: int) -> None:
        """``partition``'s changes are stored (or aborted)."""
        for key, value in self.held.pop(partition, _NOTHING_ENCODED).items():
            self.bytes -= _size(key, value)

    def clear(self) -> None:
        self.held.clear()
        self.bytes = 0

    def as_metrics(self) -> dict[str, float]:
        return {"join_uncommitted_bytes": self.bytes,
                "join_uncommitted_commits_at_bound_total": self.commits_at_bound}


# What an entry change adds to the bytes of the input it comes from, at most: the entry header,
# and the digits by which a join key (its frame index) is longer than the Kafka (bucket) key.
CHANGE_OVERHEAD_BYTES = HEADER_BYTES + 20

_NOTHING_ENCODED: dict[bytes, bytes | None] = {}


def _size(key: bytes, value: bytes | None) -> int:
    return len(key) + (0 if value is None else len(value))
