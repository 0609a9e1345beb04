import gc
import random

import cv2
import numpy as np
import pytest

from streamapp.agents.infer import ColorContourDetector, infer_frame
from streamapp.agents.resize import resize_frame
from streamapp.agents.sink import (
    FrameFileSink,
    VideoAssembler,
    VideoAssemblers,
    annotate,
    contact_sheet,
    frame_path,
    label_colour,
    save_contact_sheet,
)
from streamapp.agents.source import SyntheticScene, to_frame
from streamapp.imaging import CorruptFrame, decode_jpeg
from streamapp.wire import Box, Detections, Frame, FrameId, Joined

NOW_MS = 1_700_000_000_000
GREY = 90


def _grey_frame(index=0, level=GREY, size=(320, 240), stream="cam", epoch=1) -> Frame:
    image = np.full((size[1], size[0], 3), level, np.uint8)
    return to_frame(FrameId(stream, epoch, index), NOW_MS + index, image)


def _joined(frame: Frame, *boxes: Box) -> Joined:
    return Joined(frame, Detections(frame.id, boxes, "test", 1.0, frame.width, frame.height))


def _difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(int) - b.astype(int)).max(axis=-1)


def test_annotate_draws_boxes_with_their_label_colour():
    frame = _grey_frame()
    box = Box("red", 0.9, 100, 80, 60, 50)
    annotated = decode_jpeg(annotate(_joined(frame, box)))
    plain = decode_jpeg(frame.jpeg)
    changed = _difference(annotated, plain) > 60
    # All four edges of the box are drawn...
    assert changed[130, 100:160].mean() > 0.9 and changed[80:130, 100].mean() > 0.9
    assert changed[80:130, 159].mean() > 0.9
    # ...the inside and the far corner stay as they were...
    assert not changed[95:125, 110:150].any() and not changed[200:, 250:].any()
    # ...in the label's colour.
    edge = annotated[129, 110:150].mean(axis=0)
    assert np.abs(edge - label_colour("red")).max() < 40


def test_annotate_writes_label_text():
    frame = _grey_frame()
    annotated = decode_jpeg(annotate(_joined(frame, Box("red", 0.9, 100, 80, 60, 50))))
    label_area = _difference(annotated, decode_jpeg(frame.jpeg))[60:79, 100:160]
    assert (label_area > 60).mean() > 0.3  # a filled tag with text above the box


def test_unmatched_frames_get_a_banner():
    frame = _grey_frame()
    banner = decode_jpeg(annotate(Joined(frame, None)))[:3].mean(axis=(0, 1))
    assert banner[2] > 150 and banner[0] < 60  # red
    matched_without_boxes = decode_jpeg(annotate(_joined(frame)))
    assert _difference(matched_without_boxes, decode_jpeg(frame.jpeg)).max() < 10


def test_annotate_rejects_a_corrupt_frame():
    frame = _grey_frame()
    with pytest.raises(CorruptFrame):
        annotate(Joined(Frame(frame.id, frame.timestamp_ms, 320, 240, frame.jpeg[:50]), None))


def test_frame_file_sink_writes_each_frame_once_across_instances(tmp_path):
    frame = _grey_frame(index=7, stream="cam-2", epoch=99)
    first = FrameFileSink(tmp_path)
    assert first.write(_joined(frame, Box("a", 1.0, 1, 1, 5, 5))) is True
    path = tmp_path / "cam-2" / "99" / "frames" / "00000007.jpg"
    assert first.path_for(frame.id) == path == frame_path(tmp_path, frame.id)
    written = path.read_bytes()

    second = FrameFileSink(tmp_path)  # e.g. after a restart, replaying the same record
    assert second.write(Joined(frame, None)) is False
    assert path.read_bytes() == written
    assert first.counters == {"written": 1, "duplicates": 0}
    assert second.counters == {"written": 0, "duplicates": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["00000007.jpg"]  # no temporary files


def test_frame_file_sink_refuses_stream_ids_that_leave_the_output_directory(tmp_path):
    with pytest.raises(ValueError):
        FrameFileSink(tmp_path).write(Joined(_grey_frame(stream=".."), None))


def _video_levels(path) -> list[float]:
    capture = cv2.VideoCapture(str(path))
    levels = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        levels.append(float(image[100:, :, :].mean()))
    capture.release()
    return levels


def _write_frames(sink: FrameFileSink, indices, epoch=1):
    for index in indices:
        # Each frame's brightness encodes its index; unmatched ones have a banner only at the top.
        sink.write(Joined(_grey_frame(index, level=10 + 20 * index, epoch=epoch), None))


def test_video_is_assembled_in_index_order_from_frames_arriving_out_of_order(tmp_path):
    sink = FrameFileSink(tmp_path)
    assembler = VideoAssembler(tmp_path, "cam", 1, fps=10)
    order = list(range(12))
    random.Random(5).shuffle(order)
    for index in order:
        _write_frames(sink, [index])
        assembler.advance()
        assert assembler.next_index == min(set(range(13)) - set(order[: order.index(index) + 1]))
    assert assembler.finish() == tmp_path / "cam" / "1" / "video.avi"
    levels = _video_levels(assembler.video_path)
    assert len(levels) == 12
    assert levels == sorted(levels) and levels[0] < levels[-1] - 150
    assert assembler.counters == {"appended": 12, "gaps": 0, "unreadable": 0}
    assert not (tmp_path / "cam" / "1" / "video.partial.avi").exists()


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_missing_frame_is_skipped_after_the_gap_timeout(tmp_path):
    clock = FakeClock()
    sink = FrameFileSink(tmp_path)
    assembler = VideoAssembler(tmp_path, "cam", 1, gap_timeout_s=5, clock=clock)
    _write_frames(sink, [0, 1, 2, 5, 6])
    assert assembler.advance() == 3
    clock.now = 4.9
    assert assembler.advance() == 0 and assembler.next_index == 3
    clock.now = 5.0
    assert assembler.advance() == 2
    assert (assembler.next_index, assembler.gaps) == (7, 2)
    _write_frames(sink, [3])  # too late: already given up on
    clock.now = 20.0
    assert assembler.advance() == 0
    assert len(_video_levels(assembler.finish())) == 5


def test_finish_skips_missing_frames_and_counts_them(tmp_path):
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, [1, 2, 4, 9])
    assembler = VideoAssembler(tmp_path, "cam", 1)
    assert assembler.advance() == 0  # waiting for frame 0
    assert len(_video_levels(assembler.finish())) == 4
    assert assembler.gaps == 6


def test_finish_without_frames_writes_no_video(tmp_path):
    assembler = VideoAssembler(tmp_path, "cam", 1)
    assert assembler.finish() is None
    assert not (tmp_path / "cam").exists()


def test_a_restarted_assembler_rebuilds_the_video_from_the_frame_files(tmp_path):
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, range(5))
    crashed = VideoAssembler(tmp_path, "cam", 1)
    assert crashed.advance() == 5
    del crashed  # never finished, as if the process had been killed

    _write_frames(FrameFileSink(tmp_path), range(3, 10))  # replayed and new records
    restarted = VideoAssembler(tmp_path, "cam", 1)
    assert restarted.advance(limit=4) == 4  # catching up in bounded steps
    assert restarted.advance() == 6
    levels = _video_levels(restarted.finish())
    assert len(levels) == 10 and levels == sorted(levels)

    again = VideoAssembler(tmp_path, "cam", 1)  # rebuilding a finished run gives the same video
    again.advance()
    assert _video_levels(again.finish()) == levels


def test_assemblers_per_run_finish_when_idle(tmp_path):
    clock = FakeClock()
    sink = FrameFileSink(tmp_path)
    assemblers = VideoAssemblers(tmp_path, idle_finish_s=30, clock=clock)
    for epoch in (1, 2):
        _write_frames(sink, range(3), epoch=epoch)
        assemblers.advance(FrameId("cam", epoch, 0))
    assert assemblers.active == 2
    clock.now = 20.0
    _write_frames(sink, [3], epoch=2)
    assert assemblers.advance_all() == 1
    clock.now = 35.0
    assert assemblers.finish_idle() == [tmp_path / "cam" / "1" / "video.avi"]
    assert assemblers.active == 1
    assert assemblers.finish_all() == [tmp_path / "cam" / "2" / "video.avi"]
    assert len(_video_levels(tmp_path / "cam" / "2" / "video.avi")) == 4


def test_contact_sheet(tmp_path):
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, range(5))
    paths = [sink.path_for(FrameId("cam", 1, index)) for index in range(5)]
    sheet = contact_sheet(paths, columns=2, tile_width=100)
    assert sheet.shape == (3 * 75, 2 * 100, 3)
    assert sheet[-75:, 100:].max() == 0  # the sixth tile is empty
    written = save_contact_sheet(tmp_path / "contact_sheet.png", paths, columns=3, tile_width=64)
    assert cv2.imread(str(written)).shape == (2 * 48, 3 * 64, 3)
    with pytest.raises(ValueError):
        contact_sheet([])


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_pixel_stages_keep_memory_flat_without_the_cyclic_gc():
    """R7: 300 frames of 1280x720, a tenth of them corrupt, through resize -> infer -> annotate."""
    scene = SyntheticScene(1280, 720, seed=11)
    jpegs = [to_frame(FrameId("mem", 1, index), NOW_MS, scene.render(index)[0]).jpeg for index in range(9)]
    corrupt = [jpegs[0][: len(jpegs[0]) // 2], jpegs[1][:-2], b"\xff\xd8\xff\xd9"]
    detector = ColorContourDetector()

    def run(count: int) -> int:
        failures = 0
        for index in range(count):
            jpeg = corrupt[index // 10 % 3] if index % 10 == 9 else jpegs[index % 10]
            frame = Frame(FrameId("mem", 1, index), NOW_MS + index, 1280, 720, jpeg)
            try:
                detections = infer_frame(resize_frame(frame, 320, 240), detector)
                annotate(Joined(frame, detections))
            except CorruptFrame:
                failures += 1
        return failures

    gc.collect()
    gc.disable()
    try:
        run(20)  # allocator and OpenCV buffers reach their steady state
        before = _rss_bytes()
        assert run(300) == 30
        growth = _rss_bytes() - before
        assert gc.collect() == 0  # nothing was left for the cyclic collector to free
    finally:
        gc.enable()
    assert growth < 50 * 1024**2, f"RSS grew by {growth / 1024**2:.1f} MiB"
