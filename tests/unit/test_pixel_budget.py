"""The pixel budget (R20): a JPEG's own header says what decoding it costs, and every stage that
decodes refuses what its budget cannot hold before OpenCV allocates anything; OpenCV's own limit
is the same number. The header reader is fuzzed: whatever the bytes, it raises CorruptFrame or
answers, and reads nothing past them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import jpegcraft
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings as hypothesis_settings, strategies as st

from streamapp.agents.infer import ColorContourDetector, infer_frames, pixel_batches
from streamapp.agents.resize import resize_frame
from streamapp.agents.sink import annotate
from streamapp.imaging import decode_jpeg, encode_jpeg
from streamapp.jpeg import (
    MAX_SCANS,
    CorruptFrame,
    OverPixelBudget,
    check_jpeg,
    count_scans,
    first_scan_components,
    read_header,
)
from streamapp.settings import Settings, SettingsError
from streamapp.wire import Frame, FrameId, Joined

REPO = Path(__file__).resolve().parents[2]
LIMIT = Settings().frame_pixel_limit
BASELINE = encode_jpeg(np.full((48, 64, 3), 90, np.uint8), 90)


def test_the_limit_is_a_sixteenth_of_the_memory_budget_at_six_bytes_a_pixel():
    assert Settings().frame_pixel_limit == 1024**3 // 16 // 6 == 11_184_810
    assert Settings(memory_budget_bytes=4 * 1024**3).frame_pixel_limit > 7680 * 4320  # 8K
    assert Settings(max_frame_pixels=640 * 480).frame_pixel_limit == 640 * 480
    assert Settings.from_env({"STREAMAPP_MAX_FRAME_PIXELS": "1000000"}).frame_pixel_limit == 1_000_000
    with pytest.raises(SettingsError, match="STREAMAPP_MAX_FRAME_PIXELS can only lower the 11184810 pixels"):
        Settings(max_frame_pixels=LIMIT + 1)


def test_the_header_says_size_components_and_scans():
    assert read_header(BASELINE) == read_header(memoryview(BASELINE))
    header = read_header(BASELINE)
    assert (header.width, header.height, header.components, count_scans(BASELINE)) == (64, 48, 3, 1)
    progressive = read_header(jpegcraft.progressive())
    assert (progressive.width, progressive.height, progressive.components) == (64, 48, 3)
    scans = count_scans(jpegcraft.progressive())
    assert scans > 1 and count_scans(memoryview(jpegcraft.progressive())) == scans
    assert progressive.decode_bytes(scans, 3) == 64 * 48 * (6 + 3 * 2)  # the coefficients of every component
    assert header.decode_bytes(1, first_scan_components(BASELINE)) == 64 * 48 * 6
    bomb = jpegcraft.flat_grey(16384, 16384)
    grey = read_header(bomb)
    assert (grey.width, grey.height, count_scans(bomb), grey.decode_bytes(1, 3)) == (16384, 16384, 1, 16384**2 * 6)


@pytest.mark.parametrize("jpeg", [jpegcraft.one_scan_progressive(), jpegcraft.non_interleaved()],
                         ids=["progressive cut to one scan", "non-interleaved first scan"])
def test_one_scan_that_libjpeg_buffers_is_counted_with_every_coefficient(jpeg):
    """libjpeg keeps the whole image's coefficients for a progressive JPEG, or one whose first
    scan lacks a component, however few scans follow (at 2048x2048 a progressive JPEG cut to one
    scan peaked at 1.35 times the 6 bytes a pixel counted without them)."""
    header = read_header(jpeg)
    assert count_scans(jpeg) == 1 and header.components == 3
    assert header.decode_bytes(1, first_scan_components(jpeg)) == 64 * 48 * (6 + 3 * 2)
    with pytest.raises(OverPixelBudget, match="takes 36.0KiB to decode"):
        decode_jpeg(jpeg, max_pixels=64 * 48 * 2 - 1)
    assert decode_jpeg(jpegcraft.one_scan_progressive(), max_pixels=64 * 48 * 2).shape == (48, 64, 3)


def test_the_crafted_bomb_is_a_whole_jpeg_of_the_size_it_claims():
    # Decoded small enough to afford: the same bytes, as one unit of 16x16 repeated.
    jpeg = jpegcraft.flat_grey(256, 128)
    image = decode_jpeg(jpeg, size=(256, 128))
    assert image.shape == (128, 256, 3) and abs(int(image.mean()) - 128) <= 1
    assert len(jpegcraft.flat_grey(16384, 16384)) < 5 * 1024**2


@pytest.mark.parametrize("case", jpegcraft.corpus(LIMIT))
def test_every_crafted_frame_is_refused_by_every_decoding_stage_before_it_is_decoded(case):
    jpeg, expected = jpegcraft.corpus(LIMIT)[case]
    try:
        header = read_header(jpeg)
        width, height = header.width, header.height
    except CorruptFrame:
        width, height = 64, 48
    frame = Frame(FrameId("cam", 1, 0), 1_700_000_000_000, width, height, jpeg)
    refusals = []
    with pytest.raises(CorruptFrame) as resized:
        resize_frame(frame, 320, 240)
    refusals.append(resized.value)
    result, = infer_frames([frame], ColorContourDetector())
    assert isinstance(result, CorruptFrame)
    refusals.append(result)
    with pytest.raises(CorruptFrame) as drawn:
        annotate(Joined(frame, None))
    refusals.append(drawn.value)
    assert all(type(error) is expected for error in refusals), (case, refusals)
    assert len({str(error) for error in refusals}) == 1, "each stage says the same, in one line"
    assert "\n" not in str(refusals[0])


def test_an_exif_orientation_is_ignored_so_every_stage_sees_the_size_the_header_says():
    """A turned image would pass the size check as the header's and decode as another shape:
    resize distorts it, and the sink draws its boxes on it."""
    image = np.zeros((32, 96, 3), np.uint8)
    image[:, :48] = 255  # white on the left, black on the right: a turn shows
    plain = encode_jpeg(image, 95)
    turned = jpegcraft.with_orientation(plain, 6)
    assert read_header(turned) == read_header(plain)
    decoded = decode_jpeg(turned, size=(96, 32))
    assert decoded.shape == (32, 96, 3) and (decoded == decode_jpeg(plain)).all()
    frame = Frame(FrameId("cam", 1, 0), 1_700_000_000_000, 96, 32, turned)
    assert decode_jpeg(resize_frame(frame, 48, 16).jpeg, size=(48, 16)).shape == (16, 48, 3)
    drawn = decode_jpeg(annotate(Joined(frame, None)))
    assert drawn.shape == (32, 96, 3) and drawn[-1, 0].mean() > 200 and drawn[-1, -1].mean() < 50


def test_a_frame_with_too_many_scans_is_refused_and_one_with_few_is_not():
    assert count_scans(jpegcraft.many_scans(MAX_SCANS + 1)) > MAX_SCANS
    with pytest.raises(OverPixelBudget, match="scans, over the 100"):
        decode_jpeg(jpegcraft.many_scans(MAX_SCANS + 1))
    assert decode_jpeg(jpegcraft.progressive()).shape == (48, 64, 3)


def test_a_lower_setting_refuses_what_the_budget_would_take():
    jpeg = encode_jpeg(np.full((480, 640, 3), 90, np.uint8), 90)
    assert decode_jpeg(jpeg, max_pixels=640 * 480).shape == (480, 640, 3)
    with pytest.raises(OverPixelBudget, match=r"JPEG of 640x480 takes 1\.8MiB to decode, over the 1\.8MiB"):
        decode_jpeg(jpeg, max_pixels=640 * 480 - 1)


def test_infer_hands_its_detector_at_most_one_frame_s_pixels_at_once():
    def frame(width, height):
        return Frame(FrameId("cam", 1, 0), 1_700_000_000_000, width, height, b"")

    frames = [(n, frame(*size)) for n, size in enumerate([(320, 240)] * 5 + [(4000, 3000), (320, 240)])]
    batches = pixel_batches(frames, 3 * 320 * 240)
    assert [[n for n, _ in batch] for batch in batches] == [[0, 1, 2], [3, 4], [5], [6]]
    assert pixel_batches([], 100) == []


# --- the header reader, fuzzed ----------------------------------------------------------------


class Bounded(bytes):
    """Bytes that fail a test when read past their end, which a slice would silently allow."""

    def __getitem__(self, index):
        if isinstance(index, slice):
            assert index.stop is None or index.stop <= len(self), f"read up to {index.stop} of {len(self)} bytes"
        else:
            assert -len(self) <= index < len(self), f"read byte {index} of {len(self)}"
        return super().__getitem__(index)


def _header_or_corrupt(value: bytes) -> None:
    try:
        header = read_header(Bounded(value))
    except CorruptFrame as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert 1 <= header.width <= 65535 and 1 <= header.height <= 65535
    assert 0 <= header.components <= 255


@given(value=st.binary(max_size=300))
@example(value=b"\xff\xd8\xff\xc0\x00\x11\x08\x00")
@example(value=b"\xff\xd8\xff\xe0\x00\x00\xff\xc0")
@example(value=b"\xff\xd8" + b"\xff" * 20)
def test_arbitrary_bytes_give_a_header_or_corrupt_frame(value):
    _header_or_corrupt(b"\xff\xd8" + value)
    _header_or_corrupt(value)


@hypothesis_settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), base=st.sampled_from([BASELINE, jpegcraft.progressive(), jpegcraft.many_scans(120)]))
def test_cut_or_corrupted_jpeg_headers_give_a_header_or_corrupt_frame(data, base):
    cut = data.draw(st.integers(0, len(base)))
    _header_or_corrupt(base[:cut])
    header_end = base.index(b"\xff\xda")
    changed = bytearray(base[:header_end + 16])
    for _ in range(data.draw(st.integers(1, 4))):
        changed[data.draw(st.integers(0, len(changed) - 1))] = data.draw(st.integers(0, 255))
    _header_or_corrupt(bytes(changed))
    try:
        check_jpeg(bytes(changed) + base[header_end + 16:])
    except CorruptFrame:
        pass


# --- OpenCV's own limit -------------------------------------------------------------------------


def test_opencv_s_own_limit_is_the_frame_pixel_limit_of_the_settings_the_worker_runs(tmp_path):
    """Set before cv2 loads (it reads the variable once, then), from the Settings handed to
    create_app or read from the environment: a frame one pixel over the limit is refused by OpenCV
    itself, called directly, past our own check. Importing the module reads no environment."""
    code = ("import sys, numpy as np; from pathlib import Path\n"
            "from streamapp.settings import Settings\n"
            "from streamapp.worker.factory import create_app\n"
            "limit, data = int(sys.argv[2]), Path(sys.argv[3])\n"
            "given = {'env': None, 'settings': Settings(max_frame_pixels=limit, data_dir=data)}\n"
            "if sys.argv[1] != 'import':\n    create_app(given[sys.argv[1]])\n"
            "from streamapp.opencv import cv2, pixel_limit\n"
            "jpeg = cv2.imencode('.jpg', np.zeros((100, 100, 3), np.uint8))[1]\n"
            "try:\n    print(pixel_limit(), cv2.imdecode(jpeg, cv2.IMREAD_COLOR).shape)\n"
            "except cv2.error as exc:\n    print(pixel_limit(), 'refused', 'CV_IO_MAX_IMAGE_PIXELS' in str(exc))\n")

    def run(given: str, limit: str, env: dict[str, str]) -> str:
        env = {"PATH": "/usr/bin:/bin", "STREAMAPP_DATA_DIR": str(tmp_path), **env}
        return subprocess.run([sys.executable, "-c", code, given, limit, str(tmp_path)], env=env, capture_output=True,
                              text=True, check=True, timeout=60).stdout.strip()

    assert run("settings", "10000", {}) == "10000 (100, 100, 3)"
    assert run("settings", "9999", {}) == "9999 refused True"
    assert run("env", "0", {"STREAMAPP_MAX_FRAME_PIXELS": "9999"}) == "9999 refused True"
    assert run("import", "0", {"STREAMAPP_MAX_FRAME_PIXELS": "9999"}) == f"{LIMIT} (100, 100, 3)"


def test_the_project_imports_cv2_only_through_streamapp_opencv():
    importers = []
    for folder in ("streamapp", "agents", "tables"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                if any(name == "cv2" or (name or "").startswith("cv2.") for name in names):
                    importers.append(str(path.relative_to(REPO)))
    assert importers == ["streamapp/opencv.py"]


def test_an_opencv_error_in_decoding_costs_infer_the_frame_not_the_agent():
    """What slips past our check and OpenCV refuses (here: our limit asked above OpenCV's) is a
    CorruptFrame with OpenCV's reason on one line, which infer dead-letters like resize and sink."""
    code = ("import numpy as np, streamapp.opencv\n"
            "streamapp.opencv.use_pixel_limit(10000)\n"
            "from streamapp.agents.infer import ColorContourDetector, infer_frames\n"
            "from streamapp.imaging import decode_jpeg, encode_jpeg\n"
            "from streamapp.wire import Frame, FrameId\n"
            "jpeg = encode_jpeg(np.zeros((100, 101, 3), np.uint8))\n"
            "frame = Frame(FrameId('cam', 1, 0), 1_700_000_000_000, 101, 100, jpeg)\n"
            "import streamapp.opencv; streamapp.opencv.use_pixel_limit(20000)\n"
            "result, = infer_frames([frame], ColorContourDetector())\n"
            "print(type(result).__name__, str(result))\n")
    env = {"PATH": "/usr/bin:/bin"}
    said = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()
    assert said.startswith("CorruptFrame JPEG data cannot be decoded: OpenCV") and "MAX_IMAGE_PIXELS" in said
    assert "\n" not in said
