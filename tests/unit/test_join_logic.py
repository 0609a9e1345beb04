"""The join decision (R1, R2) over a plain dict state: no broker, no store."""

import pytest

from streamapp import wire
from streamapp.agents.join import CHANGELOG_ROOM_BYTES, Joiner, check_fits
from streamapp.settings import Settings
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tools.replay.format import Record
from streamapp.tools.replay.predict import predict

TTL_MS = 5_000
MARKER_MS = 60_000
JPEG = b"\xff\xd8jpeg\xff\xd9"


class DictState(dict):
    def put(self, key, entry):
        self[key] = entry


def frame(index, stream="cam", epoch=1):
    fid = wire.FrameId(stream, epoch, index)
    value = wire.Frame(fid, 1_700_000_000_000, 640, 480, JPEG)
    return value, wire.encode_frame(value)


def result(index, stream="cam", epoch=1, boxes=()):
    fid = wire.FrameId(stream, epoch, index)
    value = wire.Detections(fid, tuple(boxes), "color", 2.0, 640, 480)
    return value, wire.encode_detections(value)


def joiner():
    return Joiner(ttl_ms=TTL_MS, marker_ttl_ms=MARKER_MS)


def test_frame_then_result_joins_once_and_leaves_a_marker():
    state, join = DictState(), joiner()
    assert join.arrive(state, *frame(7), event_ms=0, now_ms=0) is None
    box = wire.Box("red", 0.9, 1, 2, 3, 4)
    joined = join.arrive(state, *result(7, boxes=[box]), event_ms=0, now_ms=10)
    assert joined.frame.id == wire.FrameId("cam", 1, 7)
    assert joined.detections.boxes == (box,)
    assert state[b"cam:1:7"] == Entry(EntryKind.JOINED, 10 + MARKER_MS)
    assert join.counts.joined == 1


def test_a_ttl_of_1001ms_is_1001ms_to_the_worker_and_to_the_replay_prediction():
    """1.001 s is 1.000999... as a float: truncated, the worker held a frame 1000 ms where the
    prediction, rounding, held it 1001 ms and expected a join 1000 ms later that the worker missed."""
    settings = Settings.from_env({"STREAMAPP_JOIN_TTL": "1.001s"})
    state = DictState()
    Joiner.for_settings(settings).arrive(state, *frame(7), event_ms=0, now_ms=0)
    assert state[b"cam:1:7"].deadline_ms == 1001
    sent = [Record("frames", 0, 0, 0, b"cam", frame(7)[1]), Record("detections", 0, 0, 1000, b"cam", result(7)[1])]
    assert predict(sent, settings, speed=1.0).joined == {wire.FrameId("cam", 1, 7)}


def test_result_first_then_frame_joins():
    state, join = DictState(), joiner()
    assert join.arrive(state, *result(3), event_ms=0, now_ms=0) is None
    joined = join.arrive(state, *frame(3), event_ms=0, now_ms=4_999)
    assert joined.matched and joined.frame.jpeg == JPEG


def test_a_result_waiting_in_the_same_batch_is_not_parsed_again(monkeypatch):
    state, join = DictState(), joiner()
    box = wire.Box("red", 0.9, 1, 2, 3, 4)
    join.arrive(state, *result(3, boxes=[box]), event_ms=0, now_ms=0)
    stored = Entry.decode(state[b"cam:1:3"].encode())  # as a later batch reads it from the store
    monkeypatch.setattr(wire, "decode_detections", lambda value: pytest.fail("parsed again"))
    assert join.arrive(state, *frame(3), event_ms=0, now_ms=1).detections.boxes == (box,)
    monkeypatch.undo()
    state[b"cam:1:3"] = stored
    assert join.arrive(state, *frame(3), event_ms=0, now_ms=1).detections.boxes == (box,)


def test_duplicates_on_both_sides_are_counted_and_never_emitted():
    state, join = DictState(), joiner()
    join.arrive(state, *frame(1), event_ms=0, now_ms=0)
    assert join.arrive(state, *frame(1), event_ms=0, now_ms=1) is None
    assert join.arrive(state, *result(1), event_ms=0, now_ms=2) is not None
    assert join.arrive(state, *result(1), event_ms=0, now_ms=3) is None
    assert join.arrive(state, *frame(1), event_ms=0, now_ms=4) is None
    assert (join.counts.joined, join.counts.duplicates) == (1, 3)


def test_expired_frame_leaves_unmatched_and_a_late_result_is_counted_late():
    state, join = DictState(), joiner()
    join.arrive(state, *frame(5), event_ms=0, now_ms=0)
    replacement, unmatched = join.on_due(state[b"cam:1:5"], now_ms=TTL_MS)
    assert unmatched.frame.id.index == 5 and not unmatched.matched
    state.put(b"cam:1:5", replacement)
    assert join.arrive(state, *result(5), event_ms=0, now_ms=TTL_MS + 1) is None
    assert (join.counts.unmatched_frames, join.counts.late_results) == (1, 1)


def test_expired_result_is_an_orphan_and_is_deleted():
    state, join = DictState(), joiner()
    join.arrive(state, *result(9), event_ms=0, now_ms=0)
    replacement, unmatched = join.on_due(state[b"cam:1:9"], now_ms=TTL_MS)
    assert replacement is None and unmatched is None
    assert join.counts.orphan_results == 1


def test_markers_expire_silently():
    join = joiner()
    assert join.on_due(Entry(EntryKind.JOINED, 0), now_ms=1) == (None, None)
    assert join.on_due(Entry(EntryKind.EXPIRED, 0), now_ms=1) == (None, None)


def test_epochs_and_streams_never_join_each_other():
    state, join = DictState(), joiner()
    join.arrive(state, *frame(0, epoch=1), event_ms=0, now_ms=0)
    join.arrive(state, *frame(0, stream="other", epoch=1), event_ms=0, now_ms=0)
    assert join.arrive(state, *result(0, epoch=2), event_ms=0, now_ms=1) is None
    assert join.arrive(state, *result(0, stream="third", epoch=1), event_ms=0, now_ms=1) is None
    assert join.counts.joined == 0
    assert len(state) == 4


def test_a_waiting_side_keeps_its_event_time_and_its_deadline_on_the_workers_clock():
    state, join = DictState(), joiner()
    join.arrive(state, *frame(2), event_ms=1_700_000_000_123, now_ms=50)
    assert state[b"cam:1:2"] == Entry(EntryKind.FRAME, 50 + TTL_MS, frame(2)[1], 1_700_000_000_123)


def test_records_the_changelog_would_refuse_are_wire_errors():
    limit = 10_000
    check_fits(b"x" * (limit - CHANGELOG_ROOM_BYTES), limit)
    with pytest.raises(wire.WireError, match="changelog"):
        check_fits(b"x" * (limit - CHANGELOG_ROOM_BYTES + 1), limit)
