"""Pending entries, their bytes and the oldest pending deadline, per join-store partition and summed
by the join window: markers are state but not pending, whatever order the index holds them in."""

from types import SimpleNamespace

import pytest
import rocksdict

from streamapp.tables.entry import HEADER_BYTES, Entry, EntryKind
from streamapp.tables.memory import shared_rocks_memory
from streamapp.tables.store import EXPIRY_FAMILY, ChangelogHealth, JoinPartition
from streamapp.tables.window import JoinWindow


def open_partition(path) -> JoinPartition:
    memory = shared_rocks_memory(64 * 1024**2)
    return JoinPartition(rocksdict.Rdict(str(path), options=memory.options(),
                                         column_families={EXPIRY_FAMILY: memory.options()}))


@pytest.fixture
def partition(tmp_path):
    opened = open_partition(tmp_path / "p0.db")
    yield opened
    opened.close()


def put(partition, key, kind, deadline, payload=b""):
    partition.write(key, Entry(kind, deadline, payload).encode())


def test_pending_totals_count_frames_and_results_but_not_markers(partition):
    put(partition, b"a", EntryKind.FRAME, 5_000, b"f" * 100)
    put(partition, b"b", EntryKind.RESULT, 5_100, b"r" * 10)
    put(partition, b"c", EntryKind.JOINED, 60_000)
    stats = partition.stats
    assert (stats.entries, stats.pending_entries, stats.pending_bytes) == (3, 2, 100 + 10 + 2 * HEADER_BYTES)
    put(partition, b"a", EntryKind.JOINED, 61_000)  # the frame's result came
    partition.write(b"b", None)                      # the result expired as an orphan
    assert (stats.entries, stats.pending_entries, stats.pending_bytes) == (2, 0, 0)


def test_oldest_pending_deadline_skips_markers_that_are_due_earlier(partition):
    put(partition, b"old-marker", EntryKind.EXPIRED, 1_000)
    put(partition, b"frame", EntryKind.FRAME, 4_000, b"f")
    put(partition, b"result", EntryKind.RESULT, 3_000, b"r")
    assert partition.oldest_deadline_ms() == 1_000
    assert partition.oldest_pending_deadline_ms() == 3_000
    partition.write(b"result", None)
    partition.write(b"frame", None)
    assert partition.oldest_pending_deadline_ms() is None


def test_reopened_partition_recounts_pending_totals(tmp_path):
    first = open_partition(tmp_path / "p0.db")
    put(first, b"a", EntryKind.FRAME, 5_000, b"f" * 100)
    put(first, b"b", EntryKind.JOINED, 60_000)
    first.close()
    reopened = open_partition(tmp_path / "p0.db")
    try:
        assert (reopened.stats.pending_entries, reopened.stats.pending_bytes) == (1, 100 + HEADER_BYTES)
        assert reopened.oldest_pending_deadline_ms() == 5_000
    finally:
        reopened.close()


class _Store:
    """The store side JoinWindow.gauges reads: owned partitions, disk bytes, changelog health."""

    def __init__(self, partitions) -> None:
        self.partitions = partitions
        self.changelog_health = ChangelogHealth(longest_wait_ms=60_000, skipped=2)

    def active_partitions(self):
        return iter(enumerate(self.partitions))

    def disk_bytes(self) -> int:
        return 4096


def test_window_gauges_sum_owned_partitions_and_age_the_oldest_pending_entry(tmp_path):
    first, second = open_partition(tmp_path / "p0.db"), open_partition(tmp_path / "p1.db")
    try:
        put(first, b"frame", EntryKind.FRAME, 10_000, b"f" * 100)   # stored at 5 s with a 5 s TTL
        put(first, b"marker", EntryKind.JOINED, 8_000)
        put(second, b"result", EntryKind.RESULT, 12_000, b"r" * 10)
        window = JoinWindow.__new__(JoinWindow)  # the gauges need only the store, the memory pool and the counter
        window.table = SimpleNamespace(data=_Store([first, second]))
        window.memory = SimpleNamespace(usage_bytes=lambda: 2048)
        window.pairs_completed_in_batch = 3
        assert window.gauges(now_ms=7_000, ttl_ms=5_000) == {
            "join_state_entries": 3,
            "join_state_bytes": 100 + 10 + 3 * HEADER_BYTES,
            "join_pending_entries": 2,
            "join_pending_bytes": 100 + 10 + 2 * HEADER_BYTES,
            "join_pairs_completed_in_batch_total": 3,
            "join_oldest_pending_age_seconds": 2.0,
            "join_next_expiry_seconds": 1.0,
            "join_changelog_records_skipped_total": 2,
            "join_changelog_records_upgraded_total": 0,
            "join_changelog_deadlines_cut_total": 0,
            "join_recovery_failures_total": 0,
            "join_recovery_failure_active": 0,
            "rocksdb_disk_bytes": 4096,
            "rocksdb_memory_bytes": 2048,
        }
    finally:
        first.close()
        second.close()


def test_the_oldest_pending_age_counts_records_held_back_from_their_batch(tmp_path):
    """A record held back for its partner waits as one in the window does, read but undecided."""
    partition = open_partition(tmp_path / "p0.db")
    try:
        put(partition, b"frame", EntryKind.FRAME, 10_000, b"f" * 100)  # read at 5 s with a 5 s TTL
        window = JoinWindow.__new__(JoinWindow)
        window.table = SimpleNamespace(data=_Store([partition]))
        window.memory = SimpleNamespace(usage_bytes=lambda: 0)
        window.pairs_completed_in_batch = 0

        def age(held_since_ms):
            return window.gauges(now_ms=9_000, ttl_ms=5_000, held_since_ms=held_since_ms)[
                "join_oldest_pending_age_seconds"]

        assert (age(None), age(6_000), age(1_000)) == (4.0, 4.0, 8.0)
    finally:
        partition.close()
