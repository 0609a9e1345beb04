import cv2
import numpy as np
import pytest

from streamapp.agents.resize import resize_frame
from streamapp.agents.source import synthetic_frames
from streamapp.imaging import CorruptFrame, decode_frame, decode_jpeg, encode_jpeg, jpeg_size
from streamapp.wire import Frame

NOW_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def frame():
    return next(synthetic_frames("cam", 5, 1, 640, 480, seed=2, now_ms=NOW_MS))[0]


def test_resize_keeps_id_and_timestamp_and_records_source_size(frame):
    scaled = resize_frame(frame, 320, 240, quality=80)
    assert (scaled.id, scaled.timestamp_ms) == (frame.id, frame.timestamp_ms)
    assert (scaled.width, scaled.height) == (320, 240)
    assert (scaled.source_width, scaled.source_height) == (640, 480)
    assert decode_frame(scaled).shape == (240, 320, 3)


def test_resize_is_exact_not_aspect_preserving(frame):
    scaled = resize_frame(frame, 200, 200)
    assert jpeg_size(scaled.jpeg) == (200, 200)


def test_resizing_a_scaled_frame_keeps_the_original_size(frame):
    twice = resize_frame(resize_frame(frame, 320, 240), 160, 120)
    assert (twice.source_width, twice.source_height) == (640, 480)


def test_a_frame_of_the_target_size_keeps_its_bytes(frame):
    same = resize_frame(frame, 640, 480)
    assert same.jpeg is frame.jpeg
    assert (same.source_width, same.source_height) == (640, 480)


def _with_jpeg(frame: Frame, jpeg: bytes) -> Frame:
    return Frame(frame.id, frame.timestamp_ms, frame.width, frame.height, jpeg)


@pytest.mark.parametrize("damage", [
    pytest.param(lambda jpeg: b"", id="empty"),
    pytest.param(lambda jpeg: jpeg[: len(jpeg) // 2], id="truncated"),
    pytest.param(lambda jpeg: jpeg[:-1], id="last-byte-missing"),
    pytest.param(lambda jpeg: jpeg + b"\x00\x00", id="trailing-padding"),
    pytest.param(lambda jpeg: b"\x89PNG\r\n" + jpeg[6:], id="not-a-jpeg"),
    pytest.param(lambda jpeg: b"\xff\xd8" + b"\x00" * 500 + b"\xff\xd9", id="garbage-between-markers"),
    pytest.param(lambda jpeg: b"\xff\xd8\xff\xd9", id="markers-only"),
])
def test_corrupt_jpegs_raise_corrupt_frame(frame, damage):
    with pytest.raises(CorruptFrame):
        resize_frame(_with_jpeg(frame, damage(frame.jpeg)), 320, 240)


def test_a_jpeg_of_another_size_than_its_header_says_is_corrupt(frame):
    other = encode_jpeg(np.zeros((100, 100, 3), np.uint8))
    with pytest.raises(CorruptFrame, match="100x100"):
        resize_frame(_with_jpeg(frame, other), 320, 240)


def test_undecodable_scan_data_is_corrupt():
    jpeg = encode_jpeg(np.zeros((64, 64, 3), np.uint8))
    header_end = jpeg.index(b"\xff\xda")  # keep the headers, drop the scan header and pixels
    with pytest.raises(CorruptFrame):
        decode_jpeg(jpeg[:header_end] + b"\xff\xd9")


def test_corrupt_frame_is_a_value_error():
    assert issubclass(CorruptFrame, ValueError)


def test_jpeg_size_reads_baseline_and_progressive_headers():
    image = np.zeros((37, 53, 3), np.uint8)
    assert jpeg_size(encode_jpeg(image)) == (53, 37)
    ok, progressive = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert jpeg_size(progressive.tobytes()) == (53, 37)


def test_encode_rejects_bad_quality():
    with pytest.raises(ValueError):
        encode_jpeg(np.zeros((8, 8, 3), np.uint8), quality=0)
