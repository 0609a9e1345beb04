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

from collections.abc import Awaitable, Callable

from streamapp.tables.entry import OTHER_SIDE, Entry, EntryKind

# Runs a store write until the disk takes it (DiskGuard.written): a full disk, or RocksDB refusing
# writes while its flushes catch up.
WriteRetry = Callable[[Callable[[], None]], Awaitable[None]]
# Reads a partition's entry as stored (JoinWindow.get).
Reader = Callable[[int, bytes], Entry | None]
# Stores one partition's changes in one atomic batch through the retry, then sends their changelog
# records (JoinWindow.write).
Writer = Callable[[int, list[tuple[bytes, bytes | None]], WriteRetry], Awaitable[None]]

_NOTHING_HELD: dict[bytes, Entry | None] = {}  # never written: what a partition without writes holds


class JoinTransaction:
    """``pair_met`` is called for each pair whose two sides meet inside this transaction."""

    def __init__(self, read: Reader, write: Writer, pair_met: Callable[[], None],
                 base: JoinTransaction | None = None) -> None:
        self.read, self.write, self.pair_met, self.base = read, write, pair_met, base
        self.held: dict[int, dict[bytes, Entry | None]] = {}

    def partition(self, number: int) -> PartitionWrites:
        return PartitionWrites(self, number)

    async def commit(self, retry: WriteRetry) -> None:
        """Write each partition's changes (through ``retry``) and send their changelog records."""
        for number in list(self.held):
            changes = [(key, None if entry is None else entry.encode()) for key, entry in self.held[number].items()]
            await self.write(number, changes, retry)
            del self.held[number]  # written: a retry of the commit does not send it again
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
