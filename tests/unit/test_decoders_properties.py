"""Property-based tests of every decoder that sees input from outside (R11).

Whatever bytes arrive, a decoder returns a valid record or raises its own error (WireError,
CorruptFrame, EntryError, RecordingError) with a reason: never another exception, which would
crash the agent on the same record again and again. Valid records round-trip exactly. Kafka
responses read from their chunks decode as they would from their bytes.
"""

import asyncio
import io
import itertools
import json
import math
import struct

import cv2
import entrycraft
import numpy as np
import pytest
from aiokafka.protocol.fetch import FetchResponse_v4
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st

from streamapp import wire
from streamapp.agents.join import Joiner
from streamapp.imaging import CorruptFrame, decode_frame, decode_jpeg, encode_jpeg, jpeg_size
from streamapp.jpeg import check_jpeg
from streamapp.kafka.read import WHOLE_FROM_BYTES, ChunksReader, ResponseChunks, WholeResponseReader, _ResponseIO
from streamapp.tables.entry import FORMAT_VERSION, Entry, EntryError, EntryKind, check, peek_times, upgrade_legacy
from streamapp.tables.store import ChangelogHealth
from streamapp.tools.replay import format as recording_format
from streamapp.tools.replay.format import Record, Recording, RecordingError, RecordingWriter
from streamapp.wire import Box, Detections, Frame, FrameId, Joined, WireError

NOW_MS = 1_700_000_000_000
MAX_FRAME_BYTES = 64 * 1024
DECODERS = {
    "decode": lambda value: wire.decode(value, max_frame_bytes=MAX_FRAME_BYTES),
    "decode viewing the frame": lambda value: wire.decode(value, max_frame_bytes=MAX_FRAME_BYTES, view=True),
    "decode_frame": lambda value: wire.decode_frame(value, max_frame_bytes=MAX_FRAME_BYTES),
    "decode_detections": wire.decode_detections,
    "decode_joined": lambda value: wire.decode_joined(value, max_frame_bytes=MAX_FRAME_BYTES),
    "peek_kind": wire.peek_kind,
    "peek_joined": wire.peek_joined,
}
PREFIX = struct.Struct(">2sBcI")

# Longer than any u64 deadline: no entry is brought forward.
BEYOND_ANY_DEADLINE_MS = 2**64


def _jpeg(width=32, height=24, level=90) -> bytes:
    image = np.full((height, width, 3), level, np.uint8)
    cv2.circle(image, (width // 2, height // 2), min(width, height) // 3, (0, 0, 255), -1)
    return encode_jpeg(image, 80)


JPEG = _jpeg()
PIXELS_JPEG = _jpeg(64, 48)

stream_ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
frame_ids = st.builds(FrameId, stream_ids, st.integers(0, wire.MAX_EPOCH), st.integers(0, wire.MAX_FRAME_INDEX))
frames = st.builds(Frame, frame_ids, st.integers(wire.MIN_TIMESTAMP_MS, wire.MAX_TIMESTAMP_MS),
                   st.just(32), st.just(24), st.just(JPEG))


@st.composite
def detections(draw, width=640, height=480):
    boxes = []
    for _ in range(draw(st.integers(0, 5))):
        x = draw(st.integers(0, width - 1))
        y = draw(st.integers(0, height - 1))
        boxes.append(Box(draw(st.text(max_size=12)), round(draw(st.floats(0, 1)), 4), x, y,
                         draw(st.integers(1, width - x)), draw(st.integers(1, height - y))))
    return Detections(draw(frame_ids), tuple(boxes), draw(st.text(max_size=12)),
                      round(draw(st.floats(0, 1e6)), 3), width, height)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=6),
    max_leaves=20,
)


def _record(kind: bytes, header, body: bytes = b"", version: int = wire.VERSION) -> bytes:
    header_bytes = json.dumps(header).encode()
    return PREFIX.pack(wire.MAGIC, version, kind, len(header_bytes)) + header_bytes + body


def _decodes_or_says_why(decoder, value):
    try:
        decoder(value)
    except WireError as exc:
        assert exc.reason


# --- any input: a record or a WireError -------------------------------------------------------


@pytest.mark.parametrize("name", DECODERS)
@given(value=st.binary(max_size=300))
@example(value=b"")
@example(value=b"SA")
@example(value=b"SA\x02F\x00\x00\x00\x02{}")
def test_arbitrary_bytes_decode_or_raise_wire_error(name, value):
    _decodes_or_says_why(DECODERS[name], value)


@pytest.mark.parametrize("name", DECODERS)
def test_a_missing_value_is_an_empty_payload(name):
    with pytest.raises(WireError, match="empty payload"):
        DECODERS[name](None)


@pytest.mark.parametrize("name", DECODERS)
@given(kind=st.sampled_from([b"F", b"D", b"J"]), header=json_values, body=st.binary(max_size=64))
def test_any_json_header_decodes_or_raises_wire_error(name, kind, header, body):
    _decodes_or_says_why(DECODERS[name], _record(kind, header, body))


@given(data=st.data(), record=st.one_of(
    frames.map(wire.encode_frame),
    detections().map(wire.encode_detections),
    frames.map(lambda frame: wire.encode_joined(Joined(frame, None))),
))
def test_truncated_or_corrupted_records_decode_or_raise_wire_error(data, record):
    cut = data.draw(st.integers(0, len(record)))
    _decodes_or_says_why(DECODERS["decode"], record[:cut])
    position = data.draw(st.integers(0, len(record) - 1))
    flipped = record[:position] + bytes([record[position] ^ data.draw(st.integers(1, 255))]) + record[position + 1:]
    _decodes_or_says_why(DECODERS["decode"], flipped)


# --- valid records round-trip ------------------------------------------------------------------


@given(frame=frames)
def test_frames_round_trip(frame):
    assert wire.decode_frame(wire.encode_frame(frame)) == frame


@given(frame=frames)
def test_frames_decoded_as_views_of_the_record_are_the_frames_encoded(frame):
    decoded = wire.decode(wire.encode_frame(frame), view=True)
    assert isinstance(decoded.jpeg, memoryview) and decoded == frame


@given(result=detections())
def test_detections_round_trip(result):
    assert wire.decode_detections(wire.encode_detections(result)) == result


@given(frame=frames, matched=st.booleans(), data=st.data())
def test_joined_records_round_trip(frame, matched, data):
    found = None
    if matched:
        found = data.draw(detections(frame.width, frame.height))
        found = Detections(frame.id, found.boxes, found.model, found.latency_ms, frame.width, frame.height)
    record = wire.encode_joined(Joined(frame, found))
    assert wire.decode_joined(record) == Joined(frame, found)
    assert wire.peek_joined(record) == (frame.id, matched)


def test_peek_joined_refuses_other_kinds_and_statuses():
    with pytest.raises(WireError, match="expected a J record, got F"):
        wire.peek_joined(_record(b"F", _frame_header(), JPEG))
    with pytest.raises(WireError, match="status must be"):
        wire.peek_joined(_record(b"J", _frame_header(status="lost"), JPEG))


# --- nonsense values are refused with the field's name -----------------------------------------


def _frame_header(**changes):
    header = {"stream": "cam", "epoch": 1, "index": 0, "ts_ms": NOW_MS, "width": 32, "height": 24}
    header.update(changes)
    return {key: value for key, value in header.items() if value is not ...}


@given(field=st.sampled_from(["epoch", "index", "ts_ms", "width", "height"]),
       value=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**53 + 1),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5), st.none(),
                       st.booleans()))
def test_negative_absurd_or_mistyped_frame_fields_are_refused(field, value):
    assume(not (field == "ts_ms" and isinstance(value, int) and not isinstance(value, bool)
                and wire.MIN_TIMESTAMP_MS <= value <= wire.MAX_TIMESTAMP_MS))
    with pytest.raises(WireError, match=field):
        wire.decode_frame(_record(b"F", _frame_header(**{field: value}), JPEG))


# A valid id with one character that no id may hold, anywhere: a line ending at its end is the
# case a "$" anchor lets through.
bad_stream_ids = st.builds(lambda valid, position, bad: valid[:position] + bad + valid[position:],
                           stream_ids.filter(lambda stream: len(stream) < 64), st.integers(0, 64),
                           st.sampled_from(["\n", "\r", "\r\n", "\x00", "/", ":", " ", "\u00e9", "\u2028"]))


@given(stream=st.one_of(bad_stream_ids, st.builds(lambda valid: valid + "\n", stream_ids)))
def test_a_stream_id_with_any_other_character_is_refused(stream):
    with pytest.raises(WireError, match="stream id"):
        wire.decode_frame(_record(b"F", _frame_header(stream=stream), JPEG))


@pytest.mark.parametrize("field", ["stream", "epoch", "index", "ts_ms", "width", "height"])
def test_missing_frame_fields_are_refused(field):
    with pytest.raises(WireError, match=field):
        wire.decode_frame(_record(b"F", _frame_header(**{field: ...}), JPEG))


def test_unknown_version_is_refused():
    with pytest.raises(WireError, match="version 2"):
        wire.decode(_record(b"F", _frame_header(), JPEG, version=2))


def test_frames_over_the_size_limit_are_refused():
    with pytest.raises(WireError, match="exceeds the limit"):
        wire.decode_frame(_record(b"F", _frame_header(), JPEG + b"\0" * MAX_FRAME_BYTES),
                          max_frame_bytes=MAX_FRAME_BYTES)


def _detections_header(*boxes, **changes):
    header = {"stream": "cam", "epoch": 1, "index": 0, "model": "m", "latency_ms": 1.0,
              "width": 640, "height": 480, "boxes": list(boxes)}
    header.update(changes)
    return header


def _box(**changes):
    return {"label": "red", "score": 0.5, "x": 10, "y": 10, "w": 20, "h": 20, **changes}


@pytest.mark.parametrize("box", [
    _box(score=math.nan), _box(score=math.inf), _box(score=1.5), _box(score=-0.1),
    _box(x=-1), _box(x=640), _box(w=0), _box(w=631), _box(y=480), _box(h=471),
    _box(x=math.nan), _box(w=2.5), _box(label=None), "not a box",
])
def test_nan_or_out_of_frame_boxes_are_refused(box):
    with pytest.raises(WireError):
        wire.decode_detections(_record(b"D", _detections_header(box)))


@pytest.mark.parametrize("latency", [-1.0, "1", None])
def test_nonsense_latency_is_refused(latency):
    with pytest.raises(WireError, match="latency_ms"):
        wire.decode_detections(_record(b"D", _detections_header(latency_ms=latency)))


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("field", ["latency_ms", "score"])
def test_a_header_with_nan_or_infinity_is_not_json_and_says_where(field, number):
    # Python's json writes NaN and Infinity, which JSON has no literal for; 1e999 overflows a double.
    header = _detections_header(latency_ms=0.0) if field == "latency_ms" else _detections_header(_box(score=0.0))
    text = json.dumps(header).replace(f'"{field}": 0.0', f'"{field}": {number}').encode()
    assert number.encode() in text
    value = PREFIX.pack(wire.MAGIC, wire.VERSION, b"D", len(text)) + text
    with pytest.raises(WireError, match=r"header is not UTF-8 JSON: .*char \d+"):
        wire.decode(value)


# --- JPEG bytes: an image or CorruptFrame -----------------------------------------------------


def _decodes_or_is_corrupt(jpeg: bytes, size=None):
    try:
        image = decode_jpeg(jpeg, size=size)
    except CorruptFrame as exc:
        assert str(exc)
        return
    assert image.ndim == 3 and image.shape[2] == 3
    assert (image.shape[1], image.shape[0]) == jpeg_size(jpeg)


@given(value=st.binary(max_size=400))
@example(value=b"\xff\xd8\xff\xd9")
@example(value=b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x00\x00\x00")
def test_arbitrary_bytes_decode_as_jpeg_or_raise_corrupt_frame(value):
    _decodes_or_is_corrupt(value)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_truncated_or_corrupted_jpegs_decode_or_raise_corrupt_frame(data):
    cut = data.draw(st.integers(0, len(PIXELS_JPEG)))
    _decodes_or_is_corrupt(PIXELS_JPEG[:cut], size=(64, 48))
    position = data.draw(st.integers(0, len(PIXELS_JPEG) - 1))
    flipped = bytearray(PIXELS_JPEG)
    flipped[position] ^= data.draw(st.integers(1, 255))
    _decodes_or_is_corrupt(bytes(flipped), size=(64, 48))


@given(value=st.one_of(st.binary(max_size=400), st.just(PIXELS_JPEG),
                       st.integers(0, len(PIXELS_JPEG)).map(lambda cut: PIXELS_JPEG[:cut])))
def test_a_jpeg_checks_the_same_as_bytes_or_as_a_view(value):
    def outcome(jpeg):
        try:
            check_jpeg(jpeg, (64, 48))
        except CorruptFrame as exc:
            return str(exc)
        return "ok"

    assert outcome(memoryview(value)) == outcome(value)


def test_a_frame_whose_jpeg_is_not_the_size_it_claims_is_corrupt():
    frame = Frame(FrameId("cam", 1, 0), NOW_MS, 640, 480, JPEG)
    with pytest.raises(CorruptFrame, match="32x24"):
        decode_frame(frame)


# --- join entries and changelog records: an entry or EntryError ---------------------------------

KEY = b"cam:1:0"
DETECTIONS = wire.encode_detections(Detections(FrameId("cam", 1, 0), (), "m", 1.0, 32, 24))
PAYLOADS = {EntryKind.FRAME: wire.encode_frame(Frame(FrameId("cam", 1, 0), NOW_MS, 32, 24, JPEG)),
            EntryKind.RESULT: DETECTIONS, EntryKind.JOINED: b"", EntryKind.EXPIRED: b""}
entries = st.builds(lambda kind, deadline, event: Entry(kind, deadline, PAYLOADS[kind], event),
                    st.sampled_from(EntryKind.ALL), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
ENTRY_DECODERS = {"Entry.decode": Entry.decode, "peek_times": peek_times, "check": lambda value: check(value, KEY)}


class ChangelogMessage:
    def __init__(self, key, value):
        self.key, self.value = key, value


def _reads_or_raises_entry_error(decoder, value):
    try:
        decoder(value)
    except EntryError as exc:
        assert str(exc)


@pytest.mark.parametrize("name", ENTRY_DECODERS)
@given(value=st.binary(max_size=80))
@example(value=b"")
@example(value=b"\x01F")
@example(value=b"\x02F" + bytes(16))
def test_arbitrary_bytes_decode_as_an_entry_or_raise_entry_error(name, value):
    _reads_or_raises_entry_error(ENTRY_DECODERS[name], value)


@given(key=st.none() | st.binary(max_size=8), value=st.none() | st.binary(max_size=80), data=st.data())
def test_any_changelog_record_is_read_or_raises_entry_error(key, value, data):
    if value is not None and data.draw(st.booleans()):  # also values that pass the header, or are old
        value = data.draw(entries).encode()[data.draw(st.integers(0, 1)):] + value
    health = ChangelogHealth(longest_wait_ms=BEYOND_ANY_DEADLINE_MS)
    try:
        stored_key, stored = health.readable(ChangelogMessage(key, value))
    except EntryError as exc:
        assert str(exc)
        return
    assert stored_key == key
    assert stored is None if value is None else check(stored, key) is not None


@given(entry=entries)
def test_entries_round_trip_and_carry_their_version_first(entry):
    value = entry.encode()
    assert value[0] == FORMAT_VERSION
    assert Entry.decode(value) == entry
    assert check(value, KEY) == peek_times(value) == (entry.kind, entry.deadline_ms, entry.event_ms)
    assert upgrade_legacy(value) is None


@given(entry=entries)
def test_entries_written_before_the_version_byte_upgrade_to_the_same_entry(entry):
    legacy = entry.encode()[1:]
    assert upgrade_legacy(legacy) == entry.encode()
    health = ChangelogHealth(longest_wait_ms=BEYOND_ANY_DEADLINE_MS)
    assert health.readable(ChangelogMessage(KEY, legacy)) == (KEY, entry.encode())


@given(entry=entries, version=st.integers(0, 255).filter(lambda version: version != FORMAT_VERSION))
def test_an_entry_of_another_version_is_refused_with_its_version(entry, version):
    value = bytes((version,)) + entry.encode()[1:]
    with pytest.raises(EntryError, match=f"format version {version};"):
        peek_times(value)


@given(data=st.data(), entry=entries)
def test_truncated_or_corrupted_entries_read_or_raise_entry_error(data, entry):
    value = entry.encode()
    _reads_or_raises_entry_error(ENTRY_DECODERS["check"], value[:data.draw(st.integers(0, len(value)))])
    position = data.draw(st.integers(0, len(value) - 1))
    flipped = value[:position] + bytes([value[position] ^ data.draw(st.integers(1, 255))]) + value[position + 1:]
    _reads_or_raises_entry_error(ENTRY_DECODERS["check"], flipped)


CRAFTED_FRAME = Frame(FrameId("cam", 1, 0), NOW_MS, 32, 24, JPEG)


@pytest.mark.parametrize(("kind", "fault"), entrycraft.ALL_CASES)
def test_the_check_refuses_a_pending_entry_whose_record_the_join_cannot_use(kind, fault):
    value = entrycraft.entry(kind, fault, CRAFTED_FRAME, deadline_ms=NOW_MS, event_ms=NOW_MS)
    with pytest.raises(EntryError, match=f"join entry (of kind {kind.decode()}|under key) "):
        check(value, KEY)
    with pytest.raises(EntryError):
        ChangelogHealth(longest_wait_ms=BEYOND_ANY_DEADLINE_MS).readable(ChangelogMessage(KEY, value))
    assert check(Entry(kind, NOW_MS, PAYLOADS[kind], NOW_MS).encode(), KEY)  # the same entry, unspoiled


def _spoiled(header: dict, draw) -> dict:
    """``header`` with a few fields dropped, replaced by any JSON value, or added."""
    spoiled = dict(header)
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(header)) | st.text(max_size=8))
        if draw(st.booleans()):
            spoiled.pop(name, None)
        else:
            spoiled[name] = draw(json_values | st.integers(-1, 3) | stream_ids)
    return spoiled


@st.composite
def well_formed_pending_entries(draw):
    """A pending entry, well-formed up to and including its record's prefix and JSON header: the
    header of the record a frame or result holds, spoiled, or any JSON object; any body."""
    kind = draw(st.sampled_from(EntryKind.PENDING))
    good = wire.decode(PAYLOADS[kind])
    header = json.loads(PAYLOADS[kind][PREFIX.size:PREFIX.size + PREFIX.unpack_from(PAYLOADS[kind])[3]])
    if draw(st.booleans()):
        header = _spoiled(header, draw)
    else:
        header = draw(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
    body = draw(st.sampled_from([b"", JPEG, PIXELS_JPEG, b"x", b"\xff\xd8", JPEG[:-2]])
                if kind == EntryKind.FRAME else st.sampled_from([b"", b"x"]))
    payload = _record(entrycraft.WIRE_KIND[kind], header, body)
    return Entry(kind, NOW_MS, payload, NOW_MS).encode(), good


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(crafted=well_formed_pending_entries())
@example(crafted=(entrycraft.entry(EntryKind.FRAME, "an empty header", CRAFTED_FRAME, deadline_ms=NOW_MS,
                                   event_ms=NOW_MS), CRAFTED_FRAME))
def test_a_changelog_entry_the_check_passes_the_join_can_expire_and_complete(crafted):
    """What the check lets into the store the join must be able to read when the entry expires
    and when its partner arrives, or the sweep or the batch fails on it at every restart."""
    value, good = crafted
    try:
        check(value, KEY)
    except EntryError:
        return
    entry = Entry.decode(value)
    join = Joiner(ttl_ms=5_000, marker_ttl_ms=60_000)
    _, unmatched = join.on_due(entry, NOW_MS)
    assert unmatched is None or wire.decode_joined(wire.encode_joined(unmatched)).frame.id == good.id
    partner = DETECTIONS if entry.kind == EntryKind.FRAME else PAYLOADS[EntryKind.FRAME]
    joined = join.arrive(_DictState({KEY: entry}), wire.decode(partner), partner, event_ms=NOW_MS, now_ms=NOW_MS)
    assert joined is not None and wire.decode_joined(wire.encode_joined(joined)).frame.id == good.id
    assert join.counts.unreadable_entries == 0


class _DictState(dict):
    def put(self, key, entry):
        self[key] = entry


# --- recordings: records or RecordingError ------------------------------------------------------

names = st.text(max_size=12)
blobs = st.none() | st.binary(max_size=40)
recorded = st.builds(Record, names, st.none() | st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1),
                     st.integers(-2**63, 2**63 - 1), blobs, blobs,
                     st.lists(st.tuples(names, blobs), max_size=3).map(tuple))


def _recording(path, records, topics=None) -> bytes:
    with RecordingWriter(path, topics or {"frames": 2}) as writer:
        writer.write_all(records)
    return path.read_bytes()


def _reads_or_raises_recording_error(path, content: bytes) -> list[Record] | None:
    path.write_bytes(content)
    try:
        return list(Recording(path))
    except RecordingError as exc:
        assert str(exc).startswith(str(path))
        return None


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50)
@given(records=st.lists(recorded, max_size=4))
def test_recordings_round_trip(tmp_path, records):
    path = tmp_path / "round-trip.rec"
    _recording(path, records)
    assert list(Recording(path)) == records


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50)
@given(content=st.binary(max_size=200), prefixed=st.booleans())
def test_arbitrary_bytes_read_as_a_recording_or_raise_recording_error(tmp_path, content, prefixed):
    if prefixed:  # past the magic, into the header and records
        content = recording_format.MAGIC + bytes((recording_format.VERSION,)) + content
    _reads_or_raises_recording_error(tmp_path / "arbitrary.rec", content)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50)
@given(header=json_values, topics=json_values)
@example(header={"created_ms": 1}, topics={"frames": math.inf})  # json writes Infinity; int() of it overflows
@example(header={"created_ms": math.inf}, topics={})
def test_any_json_header_reads_or_raises_recording_error(tmp_path, header, topics):
    if isinstance(header, dict):
        header = {**header, "topics": topics}
    encoded = json.dumps(header).encode()
    prefix = struct.pack(">5sBI", recording_format.MAGIC, recording_format.VERSION, len(encoded))
    _reads_or_raises_recording_error(tmp_path / "header.rec", prefix + encoded + b"E" + bytes(8))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50)
@given(records=st.lists(recorded, min_size=1, max_size=3), data=st.data())
def test_truncated_or_corrupted_recordings_read_or_raise_recording_error(tmp_path, records, data):
    content = _recording(tmp_path / "written.rec", records)
    cut = data.draw(st.integers(0, len(content) - 1))
    assert _reads_or_raises_recording_error(tmp_path / "cut.rec", content[:cut]) is None
    position = data.draw(st.integers(0, len(content) - 1))
    flipped = content[:position] + bytes([content[position] ^ data.draw(st.integers(1, 255))]) + content[position + 1:]
    _reads_or_raises_recording_error(tmp_path / "flipped.rec", flipped)


# --- Kafka responses: read from their chunks as from their bytes --------------------------------


@st.composite
def chunked_responses(draw, max_size=2000):
    data = draw(st.binary(min_size=1, max_size=max_size))
    cuts = sorted(draw(st.lists(st.integers(1, len(data)), max_size=8, unique=True)))
    bounds = [0, *cuts] if cuts and cuts[-1] == len(data) else [0, *cuts, len(data)]
    pieces = [data[start:end] for start, end in itertools.pairwise(bounds)]
    pieces[-1] += draw(st.binary(max_size=8))  # the start of the next response, in the same read
    return data, ResponseChunks(pieces, len(data))


@given(response=chunked_responses(), sizes=st.lists(st.integers(-1, 2100), max_size=12))
def test_reads_from_a_responses_chunks_are_reads_from_its_bytes(response, sizes):
    data, chunks = response
    reader, joined = ChunksReader(chunks), io.BytesIO(data)
    for size in sizes:
        got = reader.read(size)
        assert type(got) is bytes and got == joined.read(size)


def _decoded(read):
    try:
        return FetchResponse_v4.decode(read).to_object()
    except Exception as exc:  # noqa: BLE001 - aiokafka's own, the same either way
        return type(exc)


@given(response=chunked_responses(max_size=400))
@example(response=(b"\0" * 12, ResponseChunks([b"\0" * 5, b"\0" * 7], 12)))
def test_any_fetch_response_decodes_from_its_chunks_as_from_its_bytes(response):
    data, chunks = response
    assert _decoded(ChunksReader(chunks)) == _decoded(io.BytesIO(data))


@settings(max_examples=30, deadline=None)
@given(size=st.integers(WHOLE_FROM_BYTES, WHOLE_FROM_BYTES + 4096), extra=st.integers(0, 300),
       feeds=st.lists(st.integers(500, 200_000), min_size=1, max_size=6),
       closes=st.booleans())
def test_a_large_response_fed_in_any_pieces_is_read_exactly(size, extra, feeds, closes):
    """Whatever pieces the socket delivers, readexactly gives the response's bytes and keeps what
    follows it for the next read; a connection closed early raises IncompleteReadError only."""
    data = bytes(range(256)) * ((size + extra) // 256 + 1)
    sent = data[:size + extra] if not closes else data[:size - 1]

    async def read() -> tuple[bytes, bytes]:
        reader = WholeResponseReader(limit=2**16)
        reader.set_transport(_NoTransport())

        async def feed():
            at, pieces = 0, itertools.cycle(feeds)
            while at < len(sent):
                piece = next(pieces)
                reader.feed_data(sent[at:at + piece])
                at += piece
                await asyncio.sleep(0)
            reader.feed_eof()

        feeding = asyncio.ensure_future(feed())
        response = await reader.readexactly(size)
        rest = await reader.read()
        await feeding
        return _ResponseIO.BytesIO(response).read(), rest

    if closes:
        with pytest.raises(asyncio.IncompleteReadError):
            asyncio.run(read())
    else:
        assert asyncio.run(read()) == (data[:size], data[size:size + extra])


class _NoTransport:
    """What asyncio's reader asks of its transport when it pauses and resumes reading."""

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass
