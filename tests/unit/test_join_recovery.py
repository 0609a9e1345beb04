"""The join store restoring its changelog, on real RocksDB: records it cannot read are counted,
logged once per partition and skipped, never stopping recovery; a batch it cannot write is a
failure the worker reports; a store in another entry format is refused at start."""

import logging
import shutil

import entrycraft
import faust
import jpegcraft
import pytest
from faust.types import TP
from rocksdict import DbClosedError

from streamapp import wire
from streamapp.tables import store as store_module
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.memory import shared_rocks_memory
from streamapp.tables.store import FORMAT_FILE, OldStoreFormat
from streamapp.tables.window import STORE_URL, JoinWindow

TOPIC = "app-join-changelog"
CAPTURED_MS = 1_700_000_000_000
NOW_MS = CAPTURED_MS + 1_000
JPEG = jpegcraft.flat_grey(16, 16)



class Message:
    def __init__(self, partition, offset, key, value):
        self.topic, self.partition, self.offset, self.key, self.value = TOPIC, partition, offset, key, value
        self.tp = TP(TOPIC, partition)


class Event:
    def __init__(self, *args):
        self.message = Message(*args)


LONGEST_WAIT_MS = 60_000


def open_window(data_dir) -> JoinWindow:
    app = faust.App("recovery-test", store=STORE_URL, datadir=str(data_dir))
    window = JoinWindow(app, name="join", partitions=2, memory=shared_rocks_memory(64 * 1024**2),
                        changelog_config={}, recovery_buffer_size=10, longest_wait_ms=LONGEST_WAIT_MS)
    window.store.changelog_health.clock = lambda: NOW_MS / 1000
    return window


@pytest.fixture
def window(tmp_path):
    window = open_window(tmp_path)
    yield window
    for _, partition in window.store.all_partitions():
        partition.close()


def frame_entry(deadline=NOW_MS + 5_000, index=0):
    """The entry of frame cam:1:<index>, stored under that join key."""
    frame = wire.Frame(wire.FrameId("cam", 1, index), CAPTURED_MS, 16, 16, JPEG)
    return Entry(EntryKind.FRAME, deadline, wire.encode_frame(frame), 5).encode()


BAD = {
    "short": b"\x01F",
    "garbage": b"\x00" * 40,
    "future version": b"\x02" + frame_entry()[1:],
    "unknown kind": b"\x01Q" + frame_entry()[2:],
    "frame without a wire record": Entry(EntryKind.FRAME, 1, b"not a record").encode(),
    "result holding a frame": Entry(EntryKind.RESULT, 1, Entry.decode(frame_entry()).payload).encode(),
    "marker with a payload": Entry(EntryKind.JOINED, 1, b"x").encode(),
    "empty": b"",
}


def test_records_it_cannot_read_are_skipped_counted_and_logged_once_per_partition(window, caplog):
    events = [Event(0, 0, b"cam:1:0", frame_entry())]
    for offset, value in enumerate(BAD.values(), start=1):
        events += [Event(0, offset, b"bad:1:%d" % offset, value), Event(1, offset, b"bad:1:%d" % offset, value)]
    events += [Event(1, 20, None, frame_entry()), Event(1, 21, b"cam:1:1", frame_entry(index=1)),
               Event(1, 22, b"cam:1:1", None)]
    with caplog.at_level(logging.WARNING, logger=store_module.__name__):
        window.store.apply_changelog_batch(events, None, None)

    health = window.store.changelog_health
    assert health.skipped == 2 * len(BAD) + 1 and health.failing is None
    assert window.get(0, b"cam:1:0") == Entry.decode(frame_entry())
    assert window.get(1, b"cam:1:1") is None  # deleted by the tombstone after it
    assert all(window.store.partition(number).get(b"bad:1:%d" % offset) is None
               for number in (0, 1) for offset in range(1, len(BAD) + 1))
    logged = [record.getMessage() for record in caplog.records]
    assert len(logged) == 2
    assert f"join changelog {TOPIC} partition 0 offset 1: join entry of 2 bytes is shorter" in logged[0]
    assert "partition 1 offset 1" in logged[1]
    # Recovery resumes after the last record read, skipped or not.
    assert window.store.persisted_offset(TP(TOPIC, 0)) == len(BAD)
    assert window.store.persisted_offset(TP(TOPIC, 1)) == 22


def test_entries_holding_a_record_the_join_cannot_use_are_skipped(window):
    """Well-formed up to their record's JSON header, each under the join key of its own frame."""
    events = []
    for offset, (kind, fault) in enumerate(entrycraft.ALL_CASES):
        frame = wire.Frame(wire.FrameId("crafted", 1, 2 * offset), CAPTURED_MS, 16, 16, JPEG)  # index + 1 is free
        value = entrycraft.entry(kind, fault, frame, deadline_ms=10**13, event_ms=5)
        events.append(Event(offset % 2, offset, frame.id.join_key(), value))
    events.append(Event(0, len(events), b"cam:1:0", frame_entry()))
    window.store.apply_changelog_batch(events, None, None)

    assert window.store.changelog_health.skipped == len(entrycraft.ALL_CASES)
    assert window.get(0, b"cam:1:0") == Entry.decode(frame_entry())
    assert all(window.get(event.message.partition, event.message.key) is None for event in events[:-1])


def test_no_restored_entry_waits_longer_than_the_markers_ttl(window):
    """A deadline anyone may write to the changelog (here the latest a u64 holds) would keep its
    entry, and its disk, for good: restored, it is due by the longest wait from now at the latest."""
    forever = 2**64 - 1
    window.store.apply_changelog_batch([Event(0, 0, b"cam:1:0", frame_entry(deadline=forever)),
                                        Event(0, 1, b"cam:1:1", frame_entry(index=1))], None, None)

    assert window.get(0, b"cam:1:0") == Entry.decode(frame_entry(deadline=NOW_MS + LONGEST_WAIT_MS))
    assert window.get(0, b"cam:1:1") == Entry.decode(frame_entry(index=1))  # within it: as written
    assert window.store.changelog_health.as_metrics()["join_changelog_deadlines_cut_total"] == 1
    due = window.store.partition(0).due_by_deadline(EntryKind.PENDING, NOW_MS + LONGEST_WAIT_MS, 10)
    assert [key for key, _ in due] == [b"cam:1:1", b"cam:1:0"]


def test_a_future_version_says_which(window, caplog):
    with caplog.at_level(logging.WARNING, logger=store_module.__name__):
        window.store.apply_changelog_batch([Event(0, 7, b"cam:1:0", BAD["future version"])], None, None)
    assert "offset 7: join entry of format version 2; this streamapp reads version 1" in caplog.text


def test_records_written_before_the_version_byte_are_read_as_the_current_format(window):
    legacy = frame_entry()[1:]  # kind | deadline | event time | payload
    legacy_marker = Entry(EntryKind.JOINED, 99).encode()[1:]
    window.store.apply_changelog_batch([Event(0, 0, b"cam:1:0", legacy), Event(0, 1, b"cam:1:1", legacy_marker)],
                                       None, None)
    assert window.get(0, b"cam:1:0") == Entry.decode(frame_entry())
    assert window.get(0, b"cam:1:1") == Entry(EntryKind.JOINED, 99)
    assert window.store.changelog_health.upgraded == 2 and window.store.changelog_health.skipped == 0


def test_a_batch_the_store_cannot_write_is_a_failure_until_one_succeeds(window, caplog):
    store = window.store
    store.partition(0).close()  # a database that can no longer be written, as after a fatal RocksDB error
    with caplog.at_level(logging.ERROR, logger=store_module.__name__), pytest.raises(DbClosedError):
        store.apply_changelog_batch([Event(0, 0, b"cam:1:0", frame_entry())], None, None)
    health = store.changelog_health
    assert health.failures == 1 and health.as_metrics()["join_recovery_failure_active"] == 1
    assert health.failing.startswith("join changelog recovery cannot write to the store")
    assert "join changelog recovery cannot write to the store" in caplog.text

    store._partitions.pop(0)
    store._dbs.pop(0)
    store.apply_changelog_batch([Event(0, 0, b"cam:1:0", frame_entry())], None, None)
    assert health.failing is None and health.as_metrics()["join_recovery_failure_active"] == 0


def test_a_store_without_a_format_version_is_refused_at_start(tmp_path):
    window = open_window(tmp_path)
    window.store.partition(1)
    path = window.store.partition_path(1)
    window.store.partition(1).close()
    assert (path / FORMAT_FILE).read_text() == "1\n"
    assert open_window(tmp_path) is not None  # its own format opens

    (path / FORMAT_FILE).unlink()  # as every store written before entries had a version
    with pytest.raises(OldStoreFormat, match=f"join store {path} has entry format none .* delete {path.parent}"):
        open_window(tmp_path)
    (path / FORMAT_FILE).write_text("2\n")
    with pytest.raises(OldStoreFormat, match="has entry format 2; this streamapp reads format 1"):
        open_window(tmp_path)
    shutil.rmtree(path.parent)  # what the error says to do
    assert open_window(tmp_path) is not None
