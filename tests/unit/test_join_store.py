"""The join store's partition layer on real RocksDB: entries and the expiry index move together."""

import pytest

from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.memory import shared_rocks_memory
from streamapp.tables.store import EXPIRY_FAMILY, JoinPartition

import rocksdict


@pytest.fixture
def open_partition(tmp_path):
    memory = shared_rocks_memory(64 * 1024**2)
    opened = []

    def open_():
        db = rocksdict.Rdict(str(tmp_path / "p0.db"), options=memory.options(),
                             column_families={EXPIRY_FAMILY: memory.options()})
        opened.append(JoinPartition(db))
        return opened[-1]

    yield open_
    opened[-1].close()


def entry(deadline, payload=b"x" * 100, kind=EntryKind.FRAME):
    return Entry(kind, deadline, payload).encode()


def test_expired_returns_due_entries_in_deadline_order(open_partition):
    partition = open_partition()
    partition.write(b"b", entry(200))
    partition.write(b"a", entry(100))
    partition.write(b"c", entry(300))
    assert [key for key, _ in partition.expired(now_ms=250, limit=10)] == [b"a", b"b"]
    assert [key for key, _ in partition.expired(now_ms=250, limit=1)] == [b"a"]


def test_overwrite_moves_the_index_and_delete_removes_it(open_partition):
    partition = open_partition()
    partition.write(b"k", entry(100))
    partition.write(b"k", Entry(EntryKind.JOINED, 1_000).encode())
    assert partition.expired(now_ms=500, limit=10) == []
    assert partition.stats.entries == 1 and partition.stats.bytes == 9
    partition.write(b"k", None)
    assert partition.expired(now_ms=10_000, limit=10) == []
    assert (partition.stats.entries, partition.stats.bytes) == (0, 0)


def test_replay_applies_changelog_order_within_one_batch(open_partition):
    partition = open_partition()
    partition.replay([(b"k", entry(100)), (b"k", entry(400)), (b"j", entry(50)), (b"j", None)])
    assert [key for key, _ in partition.expired(now_ms=1_000, limit=10)] == [b"k"]
    assert partition.expired(now_ms=399, limit=10) == []
    assert partition.stats.entries == 1


def test_reopening_recounts_pending_state_from_the_index(open_partition):
    partition = open_partition()
    for number in range(10):
        partition.write(f"k{number}".encode(), entry(number, payload=b"y" * 1000))
    partition.close()
    reopened = open_partition()
    assert reopened.stats.entries == 10
    assert reopened.stats.bytes == 10 * (1000 + 9)
    assert reopened.oldest_deadline_ms() == 0
