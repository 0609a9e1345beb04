"""The join store's partition layer on real RocksDB: entries and both expiry orderings move together."""

import pytest
import rocksdict

from streamapp.tables.entry import HEADER_BYTES, Entry, EntryKind
from streamapp.tables.memory import shared_rocks_memory
from streamapp.tables.store import EXPIRY_FAMILY, JoinPartition

TTL_MS = 5_000


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


def entry(deadline, payload=b"x" * 100, kind=EntryKind.FRAME, event_ms=0):
    return Entry(kind, deadline, payload, event_ms).encode()


def keys(found):
    return [key for key, _ in found]


def test_due_by_deadline_returns_due_entries_of_the_kinds_asked_in_deadline_order(open_partition):
    partition = open_partition()
    partition.write(b"cam:1:2", entry(200))
    partition.write(b"cam:1:1", entry(100))
    partition.write(b"cam:1:3", entry(300))
    partition.write(b"cam:1:4", entry(150, b"", EntryKind.JOINED))
    assert keys(partition.due_by_deadline([EntryKind.FRAME], now_ms=250, limit=10)) == [b"cam:1:1", b"cam:1:2"]
    assert keys(partition.due_by_deadline([EntryKind.FRAME], now_ms=250, limit=1)) == [b"cam:1:1"]
    assert keys(partition.due_by_deadline([EntryKind.RESULT, EntryKind.JOINED], now_ms=250, limit=10)) == [b"cam:1:4"]


def test_due_by_event_follows_each_camera_runs_own_progress(open_partition):
    """Two cameras a minute apart on one partition, and a restarted camera: each run's entries
    leave by its own partner's progress, never by another clock."""
    partition = open_partition()
    for index in range(5):
        partition.write(f"fast:1:{index}".encode(), entry(10**9, event_ms=60_000 + index * 1_000))
        partition.write(f"slow:1:{index}".encode(), entry(10**9, event_ms=index * 1_000))
        partition.write(f"slow:2:{index}".encode(), entry(10**9, event_ms=index * 1_000))
    read_past = {b"fast:1": 60_000 + 2_000 + TTL_MS + 1, b"slow:1": 1_000 + TTL_MS + 1}.get
    due = keys(partition.due_by_event(EntryKind.FRAME, read_past, TTL_MS, limit=100))
    assert sorted(due) == [b"fast:1:0", b"fast:1:1", b"fast:1:2", b"slow:1:0", b"slow:1:1"]
    assert partition.due_by_event(EntryKind.RESULT, read_past, TTL_MS, limit=100) == []
    assert partition.due_by_event(EntryKind.FRAME, {}.get, TTL_MS, limit=100) == []  # nothing read yet


def test_reads_start_past_what_left_a_range_and_still_find_what_is_written_below(open_partition):
    """Each index range is read from where its first key was the last time: what left its head is
    not stepped over again, and an entry written below that point, or into an emptied range, is
    still found."""
    partition = open_partition()
    names = [f"cam:1:{index}".encode() for index in range(10)]
    for index, name in enumerate(names):
        partition.write(name, entry(100 + index, event_ms=10 + index))
    read_past = {b"cam:1": 100 + TTL_MS}.get

    def due():
        return (keys(partition.due_by_deadline([EntryKind.FRAME], now_ms=1_000, limit=100)),
                keys(partition.due_by_event(EntryKind.FRAME, read_past, TTL_MS, limit=100)))

    assert due() == (names, names)
    for name in names[:5]:
        partition.write(name, None)
    assert due() == (names[5:], names[5:])
    partition.write(b"cam:1:early", entry(50, event_ms=5))
    assert due() == ([b"cam:1:early", *names[5:]], [b"cam:1:early", *names[5:]])
    assert partition.oldest_deadline_ms() == 50
    for name in [b"cam:1:early", *names[5:]]:
        partition.write(name, None)
    assert due() == ([], []) and partition.oldest_deadline_ms() is None
    partition.write(b"cam:1:late", entry(900, event_ms=90))
    assert due() == ([b"cam:1:late"], [b"cam:1:late"])
    assert partition.oldest_deadline_ms() == 900


def test_overwrite_moves_the_index_and_delete_removes_it(open_partition):
    partition = open_partition()
    partition.write(b"k", entry(100, event_ms=7))
    partition.write(b"k", Entry(EntryKind.JOINED, 1_000).encode())
    assert partition.due_by_deadline(EntryKind.ALL, now_ms=500, limit=10) == []
    assert partition.due_by_event(EntryKind.FRAME, lambda stream: 10**12, TTL_MS, limit=10) == []
    assert partition.stats.entries == 1 and partition.stats.bytes == HEADER_BYTES
    partition.write(b"k", None)
    assert partition.due_by_deadline(EntryKind.ALL, now_ms=10_000, limit=10) == []
    assert (partition.stats.entries, partition.stats.bytes) == (0, 0)


def test_write_many_applies_changes_in_order_within_one_batch(open_partition):
    partition = open_partition()
    partition.write_many([(b"k", entry(100)), (b"k", entry(400)), (b"j", entry(50)), (b"j", None)])
    assert keys(partition.due_by_deadline(EntryKind.ALL, now_ms=1_000, limit=10)) == [b"k"]
    assert partition.due_by_deadline(EntryKind.ALL, now_ms=399, limit=10) == []
    assert partition.stats.entries == 1


def test_reopening_recounts_pending_state_from_the_index(open_partition):
    partition = open_partition()
    for number in range(10):
        partition.write(f"k{number}".encode(), entry(number, payload=b"y" * 1000))
    partition.close()
    reopened = open_partition()
    assert reopened.stats.entries == 10
    assert reopened.stats.bytes == 10 * (1000 + HEADER_BYTES)
    assert reopened.oldest_deadline_ms() == 0
    assert [deadline for deadline, _ in reopened.by_deadline()] == list(range(10))
