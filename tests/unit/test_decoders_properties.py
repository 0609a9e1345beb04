"""Property-based tests of every decoder that sees input from outside (R11).

Whatever bytes arrive, a decoder returns a valid record or raises its own error (WireError,
CorruptFrame) with a reason: never another exception, which would crash the agent on the same
record again and again. Valid records round-trip exactly.
"""

import json
import math
import struct

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st

from streamapp import wire
from streamapp.imaging import CorruptFrame, decode_frame, decode_jpeg, encode_jpeg, jpeg_size
from streamapp.jpeg import check_jpeg
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
