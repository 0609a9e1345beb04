"""Large buffers never wait for the cyclic garbage collector (R7), and its work is exported (R14).

CPython starts a full collection after enough *objects* are allocated, not bytes: a few hundred
decoded 1280x720 frames (2.7 MB each) kept alive by reference cycles would never trigger one. So
the pixel path is run with the collector off: whatever it leaks would show in RSS.
"""

from __future__ import annotations

import gc
import os

import pytest

from streamapp.agents.sink import annotate
from streamapp.agents.source import SyntheticScene, to_frame
from streamapp.imaging import CorruptFrame
from streamapp.tools.bench.sampler import rss_of
from streamapp.wire import Box, Detections, Frame, FrameId, Joined
from streamapp.worker.metrics import Metrics

FRAMES = 2000
WIDTH, HEIGHT = 1280, 720


def _inputs() -> tuple[list[bytes], list[bytes]]:
    scene = SyntheticScene(WIDTH, HEIGHT, seed=3)
    jpegs = [to_frame(FrameId("gc", 1, index), 0, scene.render(index)[0]).jpeg for index in range(5)]
    corrupt = [jpegs[0][: len(jpegs[0]) // 3],           # truncated
               jpegs[1][:600] + b"\x00" * 5000 + b"\xff\xd9",  # garbage after the header
               b"\xff\xd8\xff\xd9"]                        # no image at all
    return jpegs, corrupt


def _decode_and_draw(count: int, jpegs: list[bytes], corrupt: list[bytes]) -> int:
    """Every tenth frame is corrupt and raises; returns how many did."""
    failures = 0
    box = Box("person", 0.9, 100, 100, 300, 400)
    for index in range(count):
        frame_id = FrameId("gc", 1, index)
        jpeg = corrupt[index % 3] if index % 10 == 9 else jpegs[index % len(jpegs)]
        frame = Frame(frame_id, index, WIDTH, HEIGHT, jpeg)
        try:
            annotate(Joined(frame, Detections(frame_id, (box,), "test", 1.0, WIDTH, HEIGHT)))
        except CorruptFrame:
            failures += 1
    return failures


@pytest.mark.slow
def test_decode_and_draw_2000_hd_frames_without_the_cyclic_gc_keeps_rss_flat():
    jpegs, corrupt = _inputs()
    gc.collect()
    gc.disable()
    try:
        _decode_and_draw(50, jpegs, corrupt)  # allocator and OpenCV reach their steady state
        before = rss_of(os.getpid())
        assert _decode_and_draw(FRAMES, jpegs, corrupt) == FRAMES // 10
        growth = rss_of(os.getpid()) - before
        assert gc.collect() == 0  # nothing was left for the cyclic collector to free
    finally:
        gc.enable()
    assert growth < 50 * 1024**2, f"RSS grew by {growth / 1024**2:.1f} MiB over {FRAMES} frames"


def test_gc_collections_and_time_are_exported():
    metrics = Metrics()
    before = metrics.snapshot()
    gc.collect()
    after = metrics.snapshot()
    assert after["gc_collections_total"] > before["gc_collections_total"]
    assert after["gc_seconds_total"] > before["gc_seconds_total"]
