import itertools
import time

import cv2
import numpy as np
import pytest

from streamapp.agents.source import COLOURS, Pacer, SourceError, SyntheticScene, synthetic_frames, video_file_frames
from streamapp.groundtruth import iou
from streamapp.imaging import decode_frame
from streamapp.wire import new_epoch

NOW_MS = 1_700_000_000_000


def test_scene_is_deterministic_for_a_seed():
    first, second = SyntheticScene(seed=7), SyntheticScene(seed=7)
    for index in (0, 1, 250):
        image_a, truth_a = first.render(index)
        image_b, truth_b = second.render(index)
        assert truth_a == truth_b
        assert np.array_equal(image_a, image_b)
    assert SyntheticScene(seed=8).truth(0) != first.truth(0)


@pytest.mark.parametrize("seed", range(6))
def test_truth_is_exactly_the_objects_pixels_inside_the_frame(seed):
    scene = SyntheticScene(320, 240, seed=seed)
    for index in range(0, 400, 37):
        image, truth = scene.render(index)
        assert 2 <= len(truth) <= 4
        assert len({box.label for box in truth}) == len(truth)
        for box in truth:
            assert 0 <= box.x and box.x + box.w <= 320 and 0 <= box.y and box.y + box.h <= 240
            exact = np.all(image == COLOURS[box.label], axis=-1).astype(np.uint8)
            assert cv2.boundingRect(exact) == (box.x, box.y, box.w, box.h)
        assert all(iou(a, b) == 0 for a in truth for b in truth if a is not b)


def test_objects_move():
    scene = SyntheticScene(seed=1)
    assert scene.truth(0) != scene.truth(5)


def test_scene_rejects_bad_arguments():
    with pytest.raises(ValueError):
        SyntheticScene(32, 32)
    with pytest.raises(ValueError):
        SyntheticScene(objects=5)


def test_synthetic_frames_are_jpegs_with_ids_and_capture_clock():
    frames = list(synthetic_frames("cam-1", 42, 4, 320, 240, seed=3, fps=10, now_ms=NOW_MS))
    assert [frame.id.index for frame, _ in frames] == [0, 1, 2, 3]
    assert {(frame.id.stream, frame.id.epoch) for frame, _ in frames} == {("cam-1", 42)}
    assert [frame.timestamp_ms for frame, _ in frames] == [NOW_MS, NOW_MS + 100, NOW_MS + 200, NOW_MS + 300]
    frame, truth = frames[2]
    assert (frame.width, frame.height, frame.source_width) == (320, 240, None)
    assert decode_frame(frame).shape == (240, 320, 3)
    assert truth == SyntheticScene(320, 240, seed=3).truth(2)


def test_synthetic_frames_quality_and_stream_id():
    low = next(synthetic_frames("s", 1, 1, seed=0, quality=30, now_ms=NOW_MS))[0]
    high = next(synthetic_frames("s", 1, 1, seed=0, quality=95, now_ms=NOW_MS))[0]
    assert len(low.jpeg) < len(high.jpeg)
    with pytest.raises(ValueError, match="stream id"):
        synthetic_frames("no spaces", 1, 1)


def test_endless_synthetic_frames():
    frames = synthetic_frames("s", 1, None, 64, 64, now_ms=NOW_MS)
    assert [next(frames)[0].id.index for _ in range(3)] == [0, 1, 2]


def test_new_epoch_strictly_increases_and_is_wall_clock_ms():
    epochs = [new_epoch() for _ in range(2000)]
    assert all(a < b for a, b in itertools.pairwise(epochs))
    assert abs(epochs[0] - time.time() * 1000) < 60_000


@pytest.fixture
def video_file(tmp_path):
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.CAP_OPENCV_MJPEG, cv2.VideoWriter_fourcc(*"MJPG"), 25, (160, 120))
    for level in range(0, 250, 25):  # 10 frames, each brighter than the last
        writer.write(np.full((120, 160, 3), level, np.uint8))
    writer.release()
    return path


def test_video_file_frames(video_file):
    frames = list(video_file_frames(video_file, "file", 9, now_ms=NOW_MS))
    assert [frame.id.index for frame in frames] == list(range(10))
    assert frames[4].timestamp_ms == NOW_MS + 160  # the file's own 25 fps
    assert (frames[0].width, frames[0].height) == (160, 120)
    brightness = [decode_frame(frame).mean() for frame in frames]
    assert brightness == sorted(brightness)


def test_video_file_frames_max_frames_and_fps(video_file):
    frames = list(video_file_frames(video_file, "file", 9, max_frames=3, fps=10, now_ms=NOW_MS))
    assert [frame.timestamp_ms - NOW_MS for frame in frames] == [0, 100, 200]


def test_unreadable_video_raises_source_error_at_call(tmp_path):
    with pytest.raises(SourceError, match="missing.avi"):
        video_file_frames(tmp_path / "missing.avi", "file", 1)
    garbage = tmp_path / "garbage.avi"
    garbage.write_bytes(b"not a video" * 100)
    with pytest.raises(SourceError, match="garbage.avi"):
        list(video_file_frames(garbage, "file", 1))


class FakeTime:
    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds + 0.003  # every sleep overshoots a little


def test_pacer_keeps_a_fixed_schedule_without_drift():
    fake = FakeTime()
    pacer = Pacer(10, clock=fake.clock, sleep=fake.sleep)
    for _ in range(101):
        pacer.wait()
        fake.now += 0.02  # work per frame
    # Frame 100 starts within one overshoot of 10 s after frame 0, not 100 overshoots later.
    assert fake.now - 0.02 == pytest.approx(100.0 + 10.0, abs=0.004)


def test_pacer_restarts_its_schedule_after_a_stall_instead_of_bursting():
    fake = FakeTime()
    pacer = Pacer(10, clock=fake.clock, sleep=fake.sleep)
    pacer.wait()
    fake.now += 5.0  # stalled for 50 intervals
    assert pacer.delay() == 0.0
    assert pacer.delay() == pytest.approx(0.1)


def test_pacer_without_fps_never_sleeps():
    fake = FakeTime()
    pacer = Pacer(None, clock=fake.clock, sleep=fake.sleep)
    for _ in range(5):
        pacer.wait()
    assert fake.sleeps == []
    with pytest.raises(ValueError):
        Pacer(0)
