"""A join batch's writes: a pair that completes inside the batch is counted and never stored with
its payload. The store here is a dict: the transaction only reads and writes through the functions
it is given."""

import asyncio

from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.transaction import JoinTransaction


class DictWindow:
    def __init__(self) -> None:
        self.stored: dict[int, dict[bytes, bytes | None]] = {}
        self.pairs_completed_in_batch = 0
        self.commits = None  # at least once

    def get(self, partition: int, key: bytes) -> Entry | None:
        value = self.stored.get(partition, {}).get(key)
        return None if value is None else Entry.decode(value)

    async def write(self, partition: int, changes, retry, **transaction) -> bool:
        self.stored.setdefault(partition, {}).update(changes)
        return True

    def count_pair_met(self) -> None:
        self.pairs_completed_in_batch += 1

    def transaction(self, base: JoinTransaction | None = None) -> JoinTransaction:
        return JoinTransaction(self.get, self.write, self.count_pair_met, base)


def commit(transaction: JoinTransaction) -> None:
    async def no_retry(write):
        write()
    asyncio.run(transaction.commit(no_retry))


def test_a_pair_met_inside_one_batch_is_counted_and_only_its_marker_is_stored():
    window = DictWindow()
    transaction = window.transaction()
    writes = transaction.partition(2)
    writes.put(b"cam/1/7", Entry(EntryKind.FRAME, 5_000, b"jpeg" * 1000, 1_000))
    writes.put(b"cam/1/7", Entry(EntryKind.JOINED, 60_000))
    commit(transaction)
    assert window.pairs_completed_in_batch == 1
    assert window.get(2, b"cam/1/7").kind == EntryKind.JOINED
    assert len(window.stored[2][b"cam/1/7"]) < 100


def test_a_pair_whose_first_side_waited_in_an_earlier_batch_is_not_counted():
    window = DictWindow()
    first = window.transaction()
    first.partition(0).put(b"cam/1/8", Entry(EntryKind.RESULT, 5_000, b"{}", 1_000))
    commit(first)
    second = window.transaction()
    assert second.partition(0).get(b"cam/1/8").kind == EntryKind.RESULT
    second.partition(0).put(b"cam/1/8", Entry(EntryKind.JOINED, 60_000))
    second.partition(0).put(b"cam/1/9", Entry(EntryKind.JOINED, 60_000))
    commit(second)
    assert window.pairs_completed_in_batch == 0


def test_a_batch_decided_on_top_of_one_not_yet_committed_reads_its_writes_and_commits_after_it():
    window = DictWindow()
    first = window.transaction()
    first.partition(1).put(b"cam/1/3", Entry(EntryKind.FRAME, 5_000, b"jpeg", 1_000))
    first.partition(1).put(b"cam/1/4", Entry(EntryKind.FRAME, 5_000, b"jpeg", 1_000))
    second = window.transaction(first)
    assert second.partition(1).get(b"cam/1/3").kind == EntryKind.FRAME  # held by the first only
    second.partition(1).put(b"cam/1/3", Entry(EntryKind.JOINED, 60_000))
    assert first.partition(1).get(b"cam/1/3").kind == EntryKind.FRAME  # the first is not changed
    commit(first)
    assert second.partition(1).get(b"cam/1/4").kind == EntryKind.FRAME  # now read from the window
    commit(second)
    assert window.get(1, b"cam/1/3").kind == EntryKind.JOINED
    assert window.get(1, b"cam/1/4").kind == EntryKind.FRAME
