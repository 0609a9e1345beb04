"""A stored entry the join cannot read (one restored before the changelog check read whole
records) is dropped, counted, where the join reads it: the sweep and the batch go on with the
rest, and its partner is decided as if nothing waited."""

import asyncio

import entrycraft
import jpegcraft
from test_join_logic import DictState, joiner, result
from test_join_window_expiry import StallingStore, _window
from test_metrics_store import open_partition

from streamapp import wire
from streamapp.diskspace import SpacePause
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.window import DueOutcome

NOW_MS = 1_700_000_000_000
JPEG = jpegcraft.flat_grey(16, 16)


def _frame(index: int) -> wire.Frame:
    return wire.Frame(wire.FrameId("cam", 1, index), NOW_MS, 16, 16, JPEG)


def _unreadable(kind: bytes, index: int) -> Entry:
    return Entry.decode(entrycraft.entry(kind, "an empty header", _frame(index), deadline_ms=0, event_ms=0))


def test_a_frame_due_whose_record_cannot_be_read_is_dropped_and_counted():
    join = joiner()
    assert join.on_due(_unreadable(EntryKind.FRAME, 1), NOW_MS) == (None, None)
    assert (join.counts.unreadable_entries, join.counts.unmatched_frames) == (1, 0)


def test_a_frame_arriving_for_an_unreadable_result_waits_in_its_place_for_the_real_one():
    state, join = DictState({b"cam:1:2": _unreadable(EntryKind.RESULT, 2)}), joiner()
    frame = _frame(2)
    assert join.arrive(state, frame, wire.encode_frame(frame), event_ms=0, now_ms=0) is None
    assert state[b"cam:1:2"].kind == EntryKind.FRAME and join.counts.unreadable_entries == 1
    joined = join.arrive(state, *result(2), event_ms=0, now_ms=1)
    assert joined.matched and joined.frame.id == frame.id and join.counts.joined == 1


def test_a_result_arriving_for_an_unreadable_frame_waits_in_its_place():
    state, join = DictState({b"cam:1:3": _unreadable(EntryKind.FRAME, 3)}), joiner()
    assert join.arrive(state, *result(3), event_ms=0, now_ms=0) is None
    assert state[b"cam:1:3"].kind == EntryKind.RESULT and join.counts.unreadable_entries == 1


def test_a_sweep_drops_an_unreadable_frame_with_a_tombstone_and_expires_the_rest(tmp_path):
    partition = open_partition(tmp_path / "p0.db")
    store, changelog, emitted = StallingStore(partition), [], []
    store.refusals = 0
    window, join = _window(store, changelog), joiner()
    readable = [wire.FrameId("cam", 1, index) for index in (1, 3)]
    for frame_id in readable:
        partition.write(frame_id.join_key(), Entry(EntryKind.FRAME, 5_000, wire.encode_frame(_frame(frame_id.index)),
                                                   1_000).encode())
    partition.write(b"cam:1:2", entrycraft.entry(EntryKind.FRAME, "index a string", _frame(2), deadline_ms=5_000,
                                                 event_ms=1_000))
    space = SpacePause("the join", lambda: 10**12, resume_bytes=0, poll_s=0.01)

    async def on_due(key, entry, number):
        replacement, unmatched = join.on_due(entry, 6_000)
        if unmatched is not None:
            emitted.append(unmatched.frame.id)
        return DueOutcome(replacement)

    try:
        assert asyncio.run(window.shed(10_000, on_due, space.retry)) == 3
        assert emitted == readable and join.counts.unreadable_entries == 1
        assert partition.get(b"cam:1:2") is None
        assert (b"cam:1:2", None) in changelog  # so that recovery does not bring it back
        assert all(Entry.decode(partition.get(frame_id.join_key())).kind == EntryKind.EXPIRED for frame_id in readable)
    finally:
        partition.close()
