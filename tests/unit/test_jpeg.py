"""The marker checks the join runs on every frame: a frame the sink could not draw never waits
in the join window, and the check needs no OpenCV."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from streamapp.imaging import encode_jpeg
from streamapp.jpeg import CorruptFrame, check_jpeg

JPEG = encode_jpeg(np.full((120, 160, 3), 90, np.uint8), 90)


def test_a_whole_jpeg_of_the_claimed_size_passes():
    check_jpeg(JPEG, (160, 120))
    check_jpeg(JPEG)


@pytest.mark.parametrize("jpeg, reason", [
    (JPEG[:len(JPEG) // 2], "truncated: no end-of-image marker"),
    (JPEG[:-1], "truncated: no end-of-image marker"),
    (b"\xff\xd8\xff\xd9", "no start-of-frame header"),
    (b"GIF89a" + JPEG, "no start-of-image marker"),
    (b"", "no start-of-image marker"),
])
def test_a_cut_or_headerless_jpeg_is_corrupt(jpeg, reason):
    with pytest.raises(CorruptFrame, match=reason):
        check_jpeg(jpeg, (160, 120))


def test_a_jpeg_of_another_size_than_its_frame_says_is_corrupt():
    with pytest.raises(CorruptFrame, match="JPEG is 160x120, the frame says 320x240"):
        check_jpeg(JPEG, (320, 240))


def test_a_join_worker_never_loads_opencv():
    code = "import sys, streamapp.agents.join, streamapp.jpeg; print('cv2' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
