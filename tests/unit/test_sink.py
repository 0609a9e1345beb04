import gc
import logging
import os
import random
import stat

import cv2
import numpy as np
import pytest

from streamapp.agents.infer import ColorContourDetector, infer_frame
from streamapp.agents.resize import resize_frame
from streamapp.agents.sink import (
    FrameFileSink,
    SinkRetention,
    VideoAssembler,
    VideoAssemblers,
    annotate,
    check_sink_disk,
    label_colour,
    sink_disk_needed,
)
from streamapp.agents.source import SyntheticScene, to_frame
from streamapp.diskspace import DiskFull
from streamapp.imaging import CorruptFrame, decode_jpeg
from streamapp.settings import Settings, SettingsError
from streamapp.sinkfiles import frame_id_of, frame_path, video_segments
from streamapp.wire import Box, Detections, Frame, FrameId, Joined

NOW_MS = 1_700_000_000_000
MIB = 1024**2
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


def _levels_of(paths) -> list[float]:
    return [level for path in paths for level in _video_levels(path)]


def test_video_is_assembled_in_index_order_from_frames_arriving_out_of_order(tmp_path):
    sink = FrameFileSink(tmp_path)
    assembler = VideoAssembler(tmp_path, "cam", 1, fps=10)
    order = list(range(12))
    random.Random(5).shuffle(order)
    for index in order:
        _write_frames(sink, [index])
        assembler.advance()
        assert assembler.next_index == min(set(range(13)) - set(order[: order.index(index) + 1]))
    assert assembler.finish() == [tmp_path / "cam" / "1" / "video" / "00000000-00000011.avi"]
    levels = _levels_of(video_segments(tmp_path, "cam", 1))
    assert len(levels) == 12
    assert levels == sorted(levels) and levels[0] < levels[-1] - 150
    assert assembler.counters == {"appended": 12, "gaps": 0, "unreadable": 0}
    assert not list((tmp_path / "cam" / "1" / "video").glob("*.partial.avi"))


def test_segments_close_at_their_frame_count_and_bytes(tmp_path):
    sink = FrameFileSink(tmp_path)
    closed = []
    _write_frames(sink, range(10))
    by_count = VideoAssembler(tmp_path, "cam", 1, segment_frames=4, on_segment=closed.append)
    assert by_count.advance() == 10
    assert [path.name for path in closed] == ["00000000-00000003.avi", "00000004-00000007.avi"]
    assert [path.name for path in by_count.finish()] == ["00000008-00000009.avi"]
    assert [len(_video_levels(path)) for path in video_segments(tmp_path, "cam", 1)] == [4, 4, 2]

    _write_frames(sink, range(3), epoch=2)
    two_jpegs = sum(sink.path_for(FrameId("cam", 2, index)).stat().st_size for index in (0, 1))
    by_bytes = VideoAssembler(tmp_path, "cam", 2, segment_bytes=two_jpegs)
    by_bytes.advance()
    assert [path.name for path in video_segments(tmp_path, "cam", 2)] == ["00000000-00000001.avi"]


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
    assert len(_levels_of(assembler.finish())) == 5


def test_finish_skips_missing_frames_and_counts_them(tmp_path):
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, [1, 2, 4, 9])
    assembler = VideoAssembler(tmp_path, "cam", 1)
    assert assembler.advance() == 0  # waiting for frame 0
    assert len(_levels_of(assembler.finish())) == 4
    assert assembler.gaps == 6


def test_finish_without_frames_writes_no_video(tmp_path):
    assembler = VideoAssembler(tmp_path, "cam", 1)
    assert assembler.finish() == []
    assert not (tmp_path / "cam").exists()


def test_a_restarted_assembler_rebuilds_the_open_segment_and_keeps_the_closed_ones(tmp_path):
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, range(7))
    crashed = VideoAssembler(tmp_path, "cam", 1, segment_frames=4)
    assert crashed.advance() == 7  # one segment closed, three frames in the open one
    assert len(list((tmp_path / "cam" / "1" / "video").glob("*.partial.avi"))) == 1
    del crashed  # never finished, as if the process had been killed

    _write_frames(FrameFileSink(tmp_path), range(5, 10))  # replayed and new records
    restarted = VideoAssembler(tmp_path, "cam", 1, segment_frames=4)
    assert restarted.next_index == 4
    assert restarted.advance(limit=2) == 2  # catching up in bounded steps
    assert restarted.advance() == 4
    restarted.finish()
    levels = _levels_of(video_segments(tmp_path, "cam", 1))
    assert len(levels) == 10 and levels == sorted(levels)
    assert not list((tmp_path / "cam" / "1" / "video").glob("*.partial.avi"))

    again = VideoAssembler(tmp_path, "cam", 1)  # a finished run has nothing left to add
    assert again.advance() == 0 and again.finish() == []


def test_segments_from_frame_10_to_the_8_on_are_found_in_order_after_a_restart(tmp_path):
    """Their names grow a ninth digit: a restarted sink still counts and deletes them, and its
    video goes on after the last of them."""
    first = 10**8 - 4
    sink = FrameFileSink(tmp_path)
    for n in range(6):
        sink.write(Joined(_grey_frame(first + n, level=20 + 30 * n), None))
    assert len(VideoAssembler(tmp_path, "cam", 1, segment_frames=2).finish()) == 3

    segments = video_segments(tmp_path, "cam", 1)  # as a restarted sink finds them
    assert [path.name for path in segments] == \
        ["99999996-99999997.avi", "99999998-99999999.avi", "100000000-100000001.avi"]
    levels = _levels_of(segments)
    assert len(levels) == 6 and levels == sorted(levels)
    assert VideoAssembler(tmp_path, "cam", 1, segment_frames=2).next_index == 10**8 + 2
    on_disk = sum(path.stat().st_blocks * 512 for path in tmp_path.rglob("*") if path.is_file())
    assert SinkRetention(tmp_path, budget_bytes=100 * MIB).kept_bytes == on_disk


def test_the_footage_is_private_whatever_the_umask(tmp_path):
    """Frames, video segments and every directory the sink makes are its user's alone."""
    out = tmp_path / "out"
    umask = os.umask(0o022)
    try:
        _write_frames(FrameFileSink(out), range(3))
        VideoAssembler(out, "cam", 1, segment_frames=2).finish()
    finally:
        os.umask(umask)
    made = [out, *out.rglob("*")]
    assert {path.name for path in made if path.suffix == ".avi"} == {"00000000-00000001.avi", "00000002-00000002.avi"}
    assert {(path.is_dir(), stat.S_IMODE(path.stat().st_mode)) for path in made} == {(True, 0o700), (False, 0o600)}


def test_a_video_that_cannot_be_created_is_counted_and_logged_and_the_sink_goes_on(tmp_path, caplog):
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, range(3))
    # A video directory where no file can be created, whoever the user (OpenCV's writer fails).
    (tmp_path / "cam" / "1" / "video").symlink_to("/proc/self")
    videos = VideoAssemblers(tmp_path, idle_finish_s=0)
    with caplog.at_level(logging.WARNING, "streamapp.agents.sink"):
        assert videos.advance(FrameId("cam", 1, 0)) == 0
    assert videos.failures == 1
    line, = [record.getMessage() for record in caplog.records]
    assert "OpenCV cannot create" in line and "00000000.partial.avi" in line and "\n" not in line
    assert not videos.still_to_take(sink.path_for(FrameId("cam", 1, 0)))  # retention may delete them
    assert videos.advance(FrameId("cam", 1, 1)) == 0 and videos.failures == 1  # tried once per run

    _write_frames(sink, range(2), epoch=2)  # other runs are unaffected
    assert videos.advance(FrameId("cam", 2, 0)) == 2
    assert [path.name for path in videos.finish_all()] == ["00000000-00000001.avi"]
    assert sink.written == 5


def test_a_full_disk_stops_the_video_before_the_frame_and_it_goes_on_after(tmp_path):
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, range(6))
    full = [False]

    def check_room():
        if full[0]:
            raise DiskFull(28, "no room")

    assembler = VideoAssembler(tmp_path, "cam", 1, segment_frames=4, check_room=check_room)
    assert assembler.advance(limit=2) == 2
    full[0] = True
    with pytest.raises(DiskFull):
        assembler.advance()
    assert assembler.next_index == 2
    full[0] = False
    assert assembler.advance() == 4
    assembler.finish()
    assert [len(_video_levels(path)) for path in video_segments(tmp_path, "cam", 1)] == [4, 2]


def test_a_segment_cut_short_is_written_again_from_its_first_frame(tmp_path):
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, range(3))
    assembler = VideoAssembler(tmp_path, "cam", 1)
    assembler.advance()
    assembler._segment_frames += 1  # the writer lost a frame, as on a full disk
    with pytest.raises(DiskFull):
        assembler.finish()
    assert assembler.next_index == 0 and video_segments(tmp_path, "cam", 1) == []
    assert [len(_video_levels(path)) for path in assembler.finish()] == [3]


def test_assemblers_per_run_finish_when_idle(tmp_path):
    clock = FakeClock()
    sink = FrameFileSink(tmp_path)
    closed = []
    assemblers = VideoAssemblers(tmp_path, idle_finish_s=30, on_segment=closed.append, clock=clock)
    for epoch in (1, 2):
        _write_frames(sink, range(3), epoch=epoch)
        assemblers.advance(FrameId("cam", epoch, 0))
    assert assemblers.active == 2
    clock.now = 20.0
    _write_frames(sink, [3], epoch=2)
    assert assemblers.advance_all() == 1
    clock.now = 35.0
    first = tmp_path / "cam" / "1" / "video" / "00000000-00000002.avi"
    second = tmp_path / "cam" / "2" / "video" / "00000000-00000003.avi"
    assert assemblers.finish_idle() == [first]
    assert assemblers.active == 1
    assert assemblers.finish_all() == [second]
    assert closed == [first, second]
    assert len(_video_levels(second)) == 4


def test_retention_keeps_the_newest_bytes_of_all_streams_together_and_counts_what_it_deletes(tmp_path):
    sink = FrameFileSink(tmp_path)
    for index in range(10):
        for stream in ("a", "b"):
            sink.write(Joined(_grey_frame(index, stream=stream), None))
    size = sink.path_for(FrameId("a", 1, 0)).stat().st_blocks * 512  # what it takes on disk
    assert size >= sink.path_for(FrameId("a", 1, 0)).stat().st_size
    retention = SinkRetention(tmp_path, budget_bytes=int(8.5 * size))  # adopts the 20 files there
    for stream in ("a", "b"):
        kept = sorted(path.name for path in (tmp_path / stream / "1" / "frames").iterdir())
        assert kept == [f"{index:08d}.jpg" for index in range(6, 10)]
    assert (retention.deleted_files, retention.kept_bytes) == (12, 8 * size)

    sink.write(Joined(_grey_frame(10, stream="a"), None))
    retention.add(sink.path_for(FrameId("a", 1, 10)))
    assert not sink.path_for(FrameId("a", 1, 6)).exists() and sink.path_for(FrameId("b", 1, 6)).exists()
    assert retention.as_metrics()["sink_retention_deleted_files_total"] == 13
    assert retention.deleted_bytes == 13 * size
    # Within what is retained a repeat is a duplicate; a frame retention deleted is written again.
    assert not sink.write(Joined(_grey_frame(9, stream="a"), None))
    assert sink.write(Joined(_grey_frame(2, stream="a"), None))


def test_making_room_deletes_the_oldest_files_first_whatever_their_stream(tmp_path):
    sink = FrameFileSink(tmp_path)
    for stream, count in (("a", 6), ("b", 3)):
        for index in range(count):
            sink.write(Joined(_grey_frame(index, stream=stream), None))
    size = sink.path_for(FrameId("a", 1, 0)).stat().st_blocks * 512
    retention = SinkRetention(tmp_path, budget_bytes=100 * size)
    assert retention.deletable_bytes == 9 * size

    assert retention.make_room(lambda: retention.disk_full_deleted_files == 4) == 4 * size
    assert not sink.path_for(FrameId("a", 1, 3)).exists() and sink.path_for(FrameId("a", 1, 4)).exists()
    assert all(sink.path_for(FrameId("b", 1, index)).exists() for index in range(3))

    assert retention.make_room(lambda: False) == 5 * size  # never enough: a stream's newest goes too
    assert not list(tmp_path.glob("*/1/frames/*.jpg"))
    metrics = retention.as_metrics()
    assert (metrics["sink_disk_full_deleted_files_total"], metrics["sink_disk_full_deleted_bytes_total"]) == \
        (9, 9 * size)
    assert metrics["sink_retention_deleted_files_total"] == 0  # the budget itself deleted nothing


@pytest.mark.slow
def test_stream_ids_a_producer_mints_cannot_take_the_sink_past_its_budget(tmp_path):
    """One frame each of 300 new streams, wired as the sink wires them: the budget holds for them
    all (a stream's one file is deleted like any other), the runs assembled at once and the open
    segments' bytes stay bounded, and what was given up on is counted."""
    frame_blocks = 8192
    budget = 40 * frame_blocks
    sink = FrameFileSink(tmp_path)
    videos = VideoAssemblers(tmp_path, segment_bytes=budget // 8, max_active=16,
                             on_segment=lambda path: retention.add(path))
    retention = SinkRetention(tmp_path, budget, in_use=videos.still_to_take)
    for n in range(300):
        frame = _grey_frame(0, stream=f"cam{n}")
        sink.write(Joined(frame, None))
        retention.add(sink.path_for(frame.id))
        videos.advance(frame.id)
        on_disk = sum(path.stat().st_blocks * 512 for path in tmp_path.rglob("*") if path.is_file())
        assert retention.kept_bytes <= budget and on_disk <= budget * 5 // 4, n
        assert retention.deletable_bytes >= retention.kept_bytes - frame_blocks  # room can always be made
    assert videos.active == 16 and videos.finished_early == 300 - 16
    assert retention.deleted_files > 300 and sink.path_for(FrameId("cam299", 1, 0)).exists()
    assert not (tmp_path / "cam0" / "1" / "frames" / "00000000.jpg").exists()


def test_closing_the_open_segments_makes_them_whole_files(tmp_path):
    sink = FrameFileSink(tmp_path)
    for index in range(5):
        sink.write(Joined(_grey_frame(index), None))
    closed = []
    videos = VideoAssemblers(tmp_path, segment_frames=900, on_segment=closed.append)
    videos.advance(FrameId("cam", 1, 0))
    assert videos.open_bytes > 0 and not video_segments(tmp_path, "cam", 1)
    videos.close_open_segments()
    assert [path.name for path in closed] == ["00000000-00000004.avi"] == \
        [path.name for path in video_segments(tmp_path, "cam", 1)]
    assert videos.open_bytes == 0


def test_making_room_while_the_video_finishes_never_deletes_a_frame_it_has_not_taken(tmp_path):
    """The sink's order on a full disk: close the open segment, then delete the oldest files.
    The segment just closed is the newest file, so the frames after it, not yet in any video,
    were next in line; deleting them lost them from both the frames and the video."""
    sink = FrameFileSink(tmp_path)
    _write_frames(sink, range(6))
    full = [False]

    def check_room():
        if full[0]:
            full[0] = False
            videos.close_open_segments()
            retention.make_room(lambda: retention.disk_full_deleted_files == 3)

    videos = VideoAssemblers(tmp_path, check_room=check_room,
                             on_segment=lambda path: retention.add(path))
    retention = SinkRetention(tmp_path, budget_bytes=100 * MIB, in_use=videos.still_to_take)
    videos.advance(FrameId("cam", 1, 0), limit=3)
    full[0] = True  # the disk fills up as the run is finished
    finished = videos.finish_all()
    levels = _levels_of(video_segments(tmp_path, "cam", 1))
    assert len(levels) == 6 and levels == sorted(levels)  # every frame went into the video, in order
    assert [path.name for path in finished] == ["00000003-00000005.avi"]
    assert retention.disk_full_deleted_files == 3  # frames 0-2, already in the first segment



def test_a_sink_disk_needs_the_reserve_and_one_segment_as_frames_and_video():
    settings = Settings(sink_disk_budget_bytes=2048 * MIB, disk_reserve_bytes=64 * MIB)
    assert sink_disk_needed(settings) == 64 * MIB + 256 * MIB * 5 // 2
    check_sink_disk(settings, 704 * MIB)  # exactly enough
    small_reserve = Settings(sink_disk_budget_bytes=128 * MIB, max_frame_bytes=1 * MIB, disk_reserve_bytes=1 * MIB)
    assert sink_disk_needed(small_reserve) == 4 * MIB + 40 * MIB  # a paused sink waits for 4 MiB at least


@pytest.mark.parametrize("disk, fix", [
    (8 * MIB, "lower STREAMAPP_DISK_RESERVE, or give the sink a larger disk"),
    (703 * MIB, "lower STREAMAPP_SINK_DISK_BUDGET to at most 2044MiB"),
])
def test_a_sink_disk_too_small_for_one_segment_is_a_one_line_settings_error(disk, fix):
    settings = Settings(sink_disk_budget_bytes=2048 * MIB, disk_reserve_bytes=64 * MIB)
    with pytest.raises(SettingsError) as raised:
        check_sink_disk(settings, disk)
    message = str(raised.value)
    assert "\n" not in message and raised.value.exit_code == 2
    assert "STREAMAPP_SINK_DISK_BUDGET=2.0GiB" in message and "STREAMAPP_DISK_RESERVE (64.0MiB" in message
    assert "needs at least 704.0MiB" in message and fix in message
    if disk == 8 * MIB:
        assert "at most" not in message  # no budget that fits: the reserve alone is larger


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.slow
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


def test_a_frame_path_names_its_frame_and_no_other_path_does(tmp_path):
    frame = FrameId("cam-1", 1717000000, 42)
    assert frame_id_of(frame_path(tmp_path, frame)) == frame
    for other in (tmp_path / "cam-1" / "1717000000" / "video" / "00000000-00000899.avi",
                  tmp_path / "cam-1" / "run" / "frames" / "00000042.jpg",
                  tmp_path / "cam-1" / "1717000000" / "frames" / "00000042.jpg.tmp"):
        assert frame_id_of(other) is None
