"""Sink stage: annotated frames on disk, and each stream run's video in segments.

Layout under ``out_dir``::

    <stream>/<epoch>/frames/<index:08d>.jpg              annotated frames, written once each (idempotent)
    <stream>/<epoch>/video/<first:08d>-<last:08d>.avi    closed video segments, frames in index order (MJPG)
    <stream>/<epoch>/video/<first:08d>.partial.avi       the segment being written

The frame files are the record of what was written: a restarted sink skips frames that exist, and
the open segment is rebuilt from the files. Videos are assembled by reading frames back from disk
one at a time, so memory holds one decoded frame however out of order frames arrive. The sink
keeps at most ``STREAMAPP_SINK_DISK_BUDGET`` of frames and closed segments, all streams together:
past it, the oldest files are deleted (counted), so a frame redelivered after its file was deleted
is written again. However many stream ids arrive, the runs assembled at once and the open
segments' bytes are bounded too.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from streamapp import wire
from streamapp.batches import acked_when_done
from streamapp.diskspace import DiskFull, SpacePause, free_bytes_of, resume_bytes_for, usage_of
from streamapp.imaging import UNUSABLE_PIXELS, CorruptFrame, decode_frame, decode_jpeg, encode_jpeg
from streamapp.opencv import cv2
from streamapp.previewframes import LatestFrames
from streamapp.settings import Settings, SettingsError
from streamapp.sinkfiles import (
    SEGMENT_NAME,
    epoch_dir,
    frame_id_of,
    frame_path,
    last_index,
    segment_path,
    video_dir,
    video_segments,
)
from streamapp.units import format_bytes
from streamapp.wire import Box, FrameId, Joined

if TYPE_CHECKING:
    from streamapp.worker.stage import Stage

log = logging.getLogger(__name__)

UNMATCHED_BANNER = "NO DETECTIONS (unmatched)"
# Bright BGR colours that stand out on video; a label always gets the same one.
_PALETTE = ((0, 255, 255), (255, 0, 255), (255, 255, 0), (0, 165, 255),
            (0, 255, 0), (255, 128, 255), (255, 255, 255), (128, 255, 128))
_FONT = cv2.FONT_HERSHEY_SIMPLEX


# --- drawing ----------------------------------------------------------------------------------


def label_colour(label: str) -> tuple[int, int, int]:
    """A BGR colour per label, the same in every process (``hash()`` is salted per process)."""
    return _PALETTE[zlib.crc32(label.encode()) % len(_PALETTE)]


def annotate(joined: Joined, quality: int = 90) -> bytes:
    """The original frame as JPEG with its boxes drawn, or an "unmatched" banner if it has none."""
    image = decode_frame(joined.frame)
    # Line and text sizes follow the frame, so 4K annotations are as legible as 640x480 ones.
    scale = min(image.shape[:2]) / 480
    if joined.detections is None:
        _draw_banner(image, UNMATCHED_BANNER, scale)
    else:
        for box in joined.detections.boxes:
            _draw_box(image, box, scale)
    return encode_jpeg(image, quality)


def _draw_box(image: np.ndarray, box: Box, scale: float) -> None:
    colour = label_colour(box.label)
    thickness = max(2, round(2 * scale))
    cv2.rectangle(image, (box.x, box.y), (box.x + box.w - 1, box.y + box.h - 1), colour, thickness)
    text = f"{box.label} {box.score:.2f}"
    font_scale = max(0.35, 0.5 * scale)
    (text_w, text_h), baseline = cv2.getTextSize(text, _FONT, font_scale, 1)
    # A tag above the box, or inside its top edge when the box touches the top of the frame;
    # moved left when it would run off the right edge.
    top = box.y - text_h - baseline - thickness if box.y >= text_h + baseline + thickness else box.y
    left = max(0, min(box.x, image.shape[1] - text_w))
    cv2.rectangle(image, (left, top), (left + text_w, top + text_h + baseline), colour, cv2.FILLED)
    cv2.putText(image, text, (left, top + text_h), _FONT, font_scale, (0, 0, 0), max(1, round(scale)),
                cv2.LINE_AA)


def _draw_banner(image: np.ndarray, text: str, scale: float) -> None:
    height = round(36 * scale)
    cv2.rectangle(image, (0, 0), (image.shape[1] - 1, height), (0, 0, 200), cv2.FILLED)
    font_scale = 0.8 * scale
    (_, text_h), _ = cv2.getTextSize(text, _FONT, font_scale, 2)
    cv2.putText(image, text, (round(10 * scale), (height + text_h) // 2), _FONT, font_scale,
                (255, 255, 255), max(2, round(2 * scale)), cv2.LINE_AA)


# --- frame files ------------------------------------------------------------------------------


def _private_dirs(directory: Path) -> None:
    """``directory`` and its missing parents, each made 0700: the footage is the sink's user's
    alone, its files 0600 (frames by mkstemp, video segments by :meth:`VideoAssembler._open`)."""
    if directory.is_dir():
        return
    _private_dirs(directory.parent)
    directory.mkdir(mode=0o700, exist_ok=True)


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers see the whole file or none of it, even after a crash or power loss."""
    _private_dirs(path.parent)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


class FrameFileSink:
    """Writes each joined frame annotated, once: a frame whose file exists is a duplicate.

    The file is the record, so this holds across instances and process restarts.
    """

    def __init__(self, out_dir: str | Path, *, quality: int = 90) -> None:
        self.out_dir = Path(out_dir)
        self.quality = quality
        self.written = 0
        self.duplicates = 0

    def path_for(self, frame_id: FrameId) -> Path:
        return frame_path(self.out_dir, frame_id)

    def write(self, joined: Joined) -> bool:
        """True if the frame was written, False if it was already there. Raises CorruptFrame."""
        return self.write_annotated(joined) is not None

    def write_annotated(self, joined: Joined) -> bytes | None:
        """The annotated JPEG written, or None if the frame was already there. Raises CorruptFrame."""
        path = self.path_for(joined.frame.id)
        if path.exists():
            self.duplicates += 1
            return None
        jpeg = annotate(joined, self.quality)
        _write_atomically(path, jpeg)
        self.written += 1
        return jpeg

    @property
    def counters(self) -> dict[str, int]:
        return {"written": self.written, "duplicates": self.duplicates}


# --- retention --------------------------------------------------------------------------------


_BLOCK = 4096


def _disk_bytes(path: Path) -> int:
    """What a file takes on its file system: its blocks, not its length (a 48 KB frame takes
    52 KB of 4 KiB blocks), so the budget bounds the disk the sink uses; a block at least, so
    the files kept are at most the budget's blocks in number."""
    return max(path.stat().st_blocks * 512, _BLOCK)


class SinkRetention:
    """The newest ``budget_bytes`` of the sink's files, all streams together (frames and closed
    segments, as the blocks they take on disk), are kept; past it, the oldest files are deleted,
    whichever stream wrote them, counted. Files already on disk at start are taken in the order
    they were last written.

    A disk that fills up before the budget does is met by :meth:`make_room`: the oldest files go
    first there too, counted apart, so the sink keeps what its disk holds rather than stopping.
    Neither deletes a file ``in_use`` says is still needed (a frame its video has not taken yet: a
    segment closed to make room is newer than the frames after it)."""

    def __init__(self, out_dir: str | Path, budget_bytes: int, *,
                 in_use: Callable[[Path], bool] = lambda path: False) -> None:
        self.out_dir = Path(out_dir)
        self.budget_bytes = budget_bytes
        self._in_use = in_use
        self._files: collections.deque[tuple[Path, int]] = collections.deque()
        self.kept_bytes = 0
        self.deleted_files = 0
        self.deleted_bytes = 0
        self.disk_full_deleted_files = 0
        self.disk_full_deleted_bytes = 0
        self._adopt_existing()

    def add(self, path: Path) -> None:
        size = _disk_bytes(path)
        self._files.append((path, size))
        self.kept_bytes += size
        while self.kept_bytes > self.budget_bytes and (deleted := self._delete_oldest()):
            self.deleted_files += 1
            self.deleted_bytes += deleted

    @property
    def deletable_bytes(self) -> int:
        """What :meth:`make_room` can free: every file but those in use."""
        return sum(size for path, size in self._files if not self._in_use(path))

    def make_room(self, enough: Callable[[], bool]) -> int:
        """Delete the oldest deletable file again and again, until ``enough()`` or none is left;
        returns the bytes freed."""
        freed = 0
        while not enough() and (size := self._delete_oldest()):
            self.disk_full_deleted_files += 1
            self.disk_full_deleted_bytes += size
            freed += size
        return freed

    def _delete_oldest(self) -> int:
        """Delete the oldest file not in use; its bytes, 0 if there is none."""
        position = next((position for position, (path, _) in enumerate(self._files) if not self._in_use(path)), None)
        if position is None:
            return 0
        path, size = self._files[position]
        del self._files[position]
        path.unlink(missing_ok=True)
        self.kept_bytes -= size
        return size

    def _adopt_existing(self) -> None:
        if not self.out_dir.is_dir():
            return
        found = [(path.stat().st_mtime_ns, path) for path in self.out_dir.glob("*/*/*/*")
                 if path.suffix == ".jpg" or SEGMENT_NAME.match(path.name)]
        for _, path in sorted(found):
            self.add(path)

    def as_metrics(self) -> dict[str, float]:
        return {"sink_disk_budget_bytes": self.budget_bytes,
                "sink_disk_bytes": self.kept_bytes,
                "sink_retention_deleted_files_total": self.deleted_files,
                "sink_retention_deleted_bytes_total": self.deleted_bytes,
                "sink_disk_full_deleted_files_total": self.disk_full_deleted_files,
                "sink_disk_full_deleted_bytes_total": self.disk_full_deleted_bytes}


# --- videos ---------------------------------------------------------------------------------


def _frame_indices(frames_dir: Path) -> list[int]:
    """Indices of the frame files present, ascending (temporary files are skipped)."""
    if not frames_dir.is_dir():
        return []
    names = (entry.name for entry in os.scandir(frames_dir))
    return sorted(int(name[:-4]) for name in names if name.endswith(".jpg") and name[:-4].isdigit())


def _no_room() -> None:
    """The default room check: none; the sink passes one that looks at the free space."""


class VideoAssembler:
    """Writes ``<stream>/<epoch>/video/<first>-<last>.avi`` segments from the frame files, in index order.

    :meth:`advance` appends every next frame that is on disk and stops at the first missing one.
    With ``gap_timeout_s`` a frame missing that long is given up on (counted in ``gaps``) once a
    later frame exists; :meth:`finish` gives up on all missing frames and closes the segment.
    A segment is closed once it holds ``segment_frames`` frames or ``segment_bytes`` of JPEG, so
    the sink's retention can delete videos whole, oldest first. The open segment is written as
    ``<first>.partial.avi`` and renamed when closed; a new assembler for the same run, e.g. after a
    restart, deletes a partial one and goes on after the last closed segment.

    OpenCV's writer does not report a full disk, so ``check_room`` (which raises DiskFull) is
    asked before each frame, and a closed segment whose frame count is short is deleted and
    written again from its first frame. A writer that cannot be opened ends this run's video
    (``failed`` says why, ``on_failure`` is told); its frames stay, and need it no longer.
    """

    def __init__(self, out_dir: str | Path, stream: str, epoch: int, *, fps: float = 15.0,
                 gap_timeout_s: float | None = None, segment_frames: int = 900,
                 segment_bytes: int = 256 * 1024**2, check_room: Callable[[], None] = _no_room,
                 on_segment: Callable[[Path], None] = lambda path: None,
                 on_failure: Callable[[str], None] = lambda reason: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = epoch_dir(out_dir, stream, epoch)
        self.frames_dir = self.directory / "frames"
        self.video_dir = video_dir(out_dir, stream, epoch)
        self.fps = fps
        self.gap_timeout_s = gap_timeout_s
        self.segment_frames = segment_frames
        self.segment_bytes = segment_bytes
        self._check_room = check_room
        self._on_segment = on_segment
        self._on_failure = on_failure
        self._clock = clock
        self.failed: str | None = None
        self.next_index = self._resume_index(out_dir, stream, epoch)
        self.appended = 0
        self.gaps = 0
        self.unreadable = 0
        self.last_progress = clock()
        self._waiting_since: float | None = None
        self._writer: cv2.VideoWriter | None = None
        self._size: tuple[int, int] | None = None
        self._segment_first = self.next_index
        self._segment_frames = 0
        self._segment_jpeg_bytes = 0

    def _resume_index(self, out_dir: str | Path, stream: str, epoch: int) -> int:
        for partial in self.video_dir.glob("*.partial.avi"):
            partial.unlink()  # left by a process that was killed; its frames are still on disk
        return max((last_index(path) + 1 for path in video_segments(out_dir, stream, epoch)), default=0)

    def advance(self, limit: int | None = None) -> int:
        """Append the frames that are next in order, at most ``limit``; returns how many were appended.

        A limit bounds the time one call takes, e.g. while catching up after a restart.
        """
        appended = 0
        while self.failed is None and (limit is None or appended < limit):
            path = self._path(self.next_index)
            if path.exists():
                self._append(path)
                if self.failed is None:
                    appended += 1
                self._waiting_since = None
                continue
            now = self._clock()
            if self._waiting_since is None:
                self._waiting_since = now
            if self.gap_timeout_s is None or now - self._waiting_since < self.gap_timeout_s:
                break
            later = [index for index in _frame_indices(self.frames_dir) if index > self.next_index]
            if not later:
                self._waiting_since = now  # look again after another timeout, not on every call
                break
            self.gaps += later[0] - self.next_index
            self.next_index = later[0]
        if appended:
            self.last_progress = self._clock()
        return appended

    def finish(self) -> list[Path]:
        """Append all remaining frames in index order, skipping missing ones, and close the
        segment; returns the segments closed meanwhile."""
        closed = []
        for index in _frame_indices(self.frames_dir):
            if index >= self.next_index and self.failed is None:
                self.gaps += index - self.next_index
                self.next_index = index
                closed += self._append(self._path(index))
        segment = self.close_segment()
        return closed + ([segment] if segment else [])

    def close_segment(self) -> Path | None:
        """Complete the open segment under its frame range; None if no segment is open."""
        if self._writer is None:
            return None
        self._writer.release()
        self._writer = None
        partial = self._partial_path()
        written = cv2.VideoCapture(str(partial))
        complete = written.get(cv2.CAP_PROP_FRAME_COUNT) == self._segment_frames
        written.release()
        if not complete:  # cut short by a full disk: write it again from its first frame
            partial.unlink(missing_ok=True)
            self.next_index = self._segment_first
            self._segment_frames = self._segment_jpeg_bytes = 0
            raise DiskFull(errno.ENOSPC, f"video segment {partial} was cut short")
        path = segment_path(self.video_dir, self._segment_first, self.next_index - 1)
        os.replace(partial, path)
        self._segment_first = self.next_index
        self._segment_frames = self._segment_jpeg_bytes = 0
        self._on_segment(path)
        return path

    @property
    def open_jpeg_bytes(self) -> int:
        """JPEG bytes of the frames in the open segment (0 if none is open)."""
        return self._segment_jpeg_bytes

    @property
    def open_bytes(self) -> int:
        """Disk blocks of the open segment (0 if none is open)."""
        partial = self._partial_path()
        return _disk_bytes(partial) if self._writer is not None and partial.exists() else 0

    def _path(self, index: int) -> Path:
        return self.frames_dir / f"{index:08d}.jpg"

    def _partial_path(self) -> Path:
        return self.video_dir / f"{self._segment_first:08d}.partial.avi"

    def _append(self, path: Path) -> list[Path]:
        """Append the frame at ``next_index``; returns the segment it closed, if it closed one."""
        self._check_room()
        data = path.read_bytes()
        try:
            image = decode_jpeg(data)
        except CorruptFrame:
            self.unreadable += 1
            self.next_index += 1
            return []
        writer = self._open(image) if self._writer is None else self._writer
        if writer is None:
            return []
        if (image.shape[1], image.shape[0]) != self._size:
            image = cv2.resize(image, self._size, interpolation=cv2.INTER_AREA)
        writer.write(image)
        self.next_index += 1
        self.appended += 1
        self._segment_frames += 1
        self._segment_jpeg_bytes += len(data)
        if self._segment_frames >= self.segment_frames or self._segment_jpeg_bytes >= self.segment_bytes:
            segment = self.close_segment()
            return [segment] if segment else []
        return []

    def _open(self, image: np.ndarray) -> cv2.VideoWriter | None:
        _private_dirs(self.video_dir)
        self._segment_first = self.next_index
        self._size = (image.shape[1], image.shape[0])
        writer = cv2.VideoWriter(str(self._partial_path()), cv2.CAP_OPENCV_MJPEG,
                                 cv2.VideoWriter.fourcc(*"MJPG"), self.fps, self._size)
        if not writer.isOpened():
            self.failed = f"OpenCV cannot create {self._partial_path()}"
            self._on_failure(self.failed)
            return None
        os.chmod(self._partial_path(), 0o600)  # OpenCV creates it as the umask says
        self._writer = writer
        return writer

    @property
    def counters(self) -> dict[str, int]:
        return {"appended": self.appended, "gaps": self.gaps, "unreadable": self.unreadable}


# Stream runs whose video a sink assembles at once, each with an open writer: bounds what stream
# ids a producer mints cost (past it, the run idle longest is finished).
MAX_VIDEOS = 128


class VideoAssemblers:
    """One :class:`VideoAssembler` per stream run, finished once its run goes quiet, and at most
    ``max_active`` at once: a run past them finishes the one that appended last longest ago first
    (counted in ``finished_early``). The open segments together hold at most ``segment_bytes`` of
    JPEG: past it the largest is closed where it is.

    A frame that arrives for a run after it was finished starts a new assembler, which goes on
    after that run's last segment. Every segment closed is passed to ``on_segment``. A video that
    cannot be written is counted in ``failures`` and logged; its run is finished like an idle one,
    so a frame that arrives after that tries again.
    """

    def __init__(self, out_dir: str | Path, *, fps: float = 15.0, gap_timeout_s: float | None = None,
                 idle_finish_s: float = 60.0, segment_frames: int = 900, segment_bytes: int = 256 * 1024**2,
                 max_active: int = MAX_VIDEOS, check_room: Callable[[], None] = _no_room,
                 on_segment: Callable[[Path], None] = lambda path: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out_dir = Path(out_dir)
        self.idle_finish_s = idle_finish_s
        self.segment_bytes = segment_bytes
        self.max_active = max_active
        self.finished_early = 0
        self.failures = 0
        self._new_assembler = functools.partial(
            VideoAssembler, fps=fps, gap_timeout_s=gap_timeout_s, segment_frames=segment_frames,
            segment_bytes=segment_bytes, check_room=check_room, on_segment=on_segment,
            on_failure=self._count_failure, clock=clock)
        self._clock = clock
        self._active: dict[tuple[str, int], VideoAssembler] = {}

    def _count_failure(self, reason: str) -> None:
        self.failures += 1
        log.warning("a video is not written: %s (its frames are; counted in sink_video_failures_total) — check "
                    "that STREAMAPP_OUT_DIR is writable and has free inodes and file descriptors", reason)

    def advance(self, frame_id: FrameId, limit: int | None = None) -> int:
        """Advance the run of ``frame_id``, starting an assembler for it if it has none."""
        key = (frame_id.stream, frame_id.epoch)
        if key not in self._active:
            if len(self._active) >= self.max_active:
                self._finish([min(self._active, key=lambda run: self._active[run].last_progress)])
                self.finished_early += 1
            self._active[key] = self._new_assembler(self.out_dir, *key)
        appended = self._active[key].advance(limit)
        self._close_largest_open_segments()
        return appended

    def advance_all(self, limit: int | None = None) -> int:
        """Advance every active run: lets gap timeouts fire when no frames arrive."""
        appended = sum(assembler.advance(limit) for assembler in self._active.values())
        self._close_largest_open_segments()
        return appended

    def _close_largest_open_segments(self) -> None:
        while sum(assembler.open_jpeg_bytes for assembler in self._active.values()) > self.segment_bytes:
            max(self._active.values(), key=lambda assembler: assembler.open_jpeg_bytes).close_segment()

    def finish_idle(self) -> list[Path]:
        """Finish the runs that appended nothing for ``idle_finish_s``; returns the segments closed."""
        now = self._clock()
        idle = [key for key, assembler in self._active.items()
                if now - assembler.last_progress >= self.idle_finish_s]
        return self._finish(idle)

    def finish_all(self) -> list[Path]:
        return self._finish(list(self._active))

    def still_to_take(self, path: Path) -> bool:
        """Whether ``path`` is a frame file that its run's video has not appended yet."""
        frame = frame_id_of(path)
        assembler = self._active.get((frame.stream, frame.epoch)) if frame else None
        return assembler is not None and frame is not None and assembler.failed is None \
            and frame.index >= assembler.next_index

    @property
    def open_bytes(self) -> int:
        return sum(assembler.open_bytes for assembler in self._active.values())

    def close_open_segments(self) -> None:
        """Close every open segment where it is, so that it can be deleted like any closed one;
        a segment cut short by the full disk is deleted (its frames are written again later)."""
        for assembler in self._active.values():
            try:
                assembler.close_segment()
            except DiskFull:
                pass

    def _finish(self, keys: Iterable[tuple[str, int]]) -> list[Path]:
        finished = []
        for key in keys:
            finished += self._active[key].finish()  # a full disk leaves the run active, to finish later
            del self._active[key]
        return finished

    @property
    def active(self) -> int:
        return len(self._active)


# Frames appended to a video per call: bounds one call's time while a restarted sink catches up.
VIDEO_STEP = 64
# A video segment is closed after this long of frames (or when the open ones hold an eighth of the disk budget).
SEGMENT_SECONDS = 60
SEGMENT_SHARE = 8
FPS = 15.0


def sink_disk_needed(settings: Settings) -> int:
    """The smallest disk a sink can work on: the free space it keeps (the reserve, at least
    4 MiB), plus one video segment twice, as frame files and re-encoded in the video (about 1.3x
    larger): 5/2 of the segment's JPEG bytes, an eighth of the budget."""
    segment = settings.sink_disk_budget_bytes // SEGMENT_SHARE
    return resume_bytes_for(settings.disk_reserve_bytes) + segment * 5 // 2


def check_sink_disk(settings: Settings, disk_bytes: int) -> None:
    """SettingsError unless a file system of ``disk_bytes`` holds :func:`sink_disk_needed`."""
    needed = sink_disk_needed(settings)
    if disk_bytes >= needed:
        return
    largest = (disk_bytes - resume_bytes_for(settings.disk_reserve_bytes)) * 2 // 5 * SEGMENT_SHARE
    lower = (f"lower STREAMAPP_SINK_DISK_BUDGET to at most {largest // 1024**2}MiB, "
             if largest >= 8 * settings.max_frame_bytes else "")
    raise SettingsError(
        f"STREAMAPP_OUT_DIR {settings.out_dir} is on a file system of {format_bytes(disk_bytes)}, but the sink needs "
        f"at least {format_bytes(needed)}: STREAMAPP_DISK_RESERVE ({format_bytes(settings.disk_reserve_bytes)}, "
        f"at least 4MiB) free, plus one video segment as frames and as video (an eighth of "
        f"STREAMAPP_SINK_DISK_BUDGET={format_bytes(settings.sink_disk_budget_bytes)}, 5/2 times) — {lower}"
        f"lower STREAMAPP_DISK_RESERVE, or give the sink a larger disk")


def register(stage: Stage) -> None:
    """Faust agent: ``joined`` -> annotated frame files and each stream run's video segments.

    Frames leave the join out of order (unmatched ones a TTL later), so a missing frame is waited
    for twice the longest a frame can take through the join before the video skips it. A full
    disk pauses the agent (Kafka keeps the records) until space returns; on stop every open
    segment is closed.
    """
    settings = stage.settings
    check_sink_disk(settings, usage_of(settings.out_dir).total)
    out_free = free_bytes_of(settings.out_dir)
    space = SpacePause("the sink", out_free, resume_bytes=settings.disk_reserve_bytes,
                       make_room=lambda: stage.offload(make_room))
    room_warned = False

    def make_room() -> None:
        """On a full disk, close the open segments and delete the oldest files until the reserve
        and a segment's worth are free, if the sink's own files can free that much; if something
        else holds the disk, wait for it instead."""
        nonlocal room_warned
        short = space.resume_bytes - out_free()
        if short <= 0 or retention.deletable_bytes + videos.open_bytes < short:
            return
        videos.close_open_segments()
        target = space.resume_bytes + settings.sink_disk_budget_bytes // SEGMENT_SHARE
        if retention.make_room(lambda: out_free() >= target) and not room_warned:
            room_warned = True
            log.warning("the sink's disk filled up before its budget (%s): its oldest files are deleted to keep %s "
                        "free, counted in sink_disk_full_deleted_files_total — give it 5/4 x "
                        "STREAMAPP_SINK_DISK_BUDGET plus STREAMAPP_DISK_RESERVE, or lower STREAMAPP_SINK_DISK_BUDGET",
                        format_bytes(settings.sink_disk_budget_bytes), format_bytes(space.resume_bytes))

    def check_room() -> None:
        """Before each frame file and each frame of video: DiskFull unless the reserve is free,
        after making room if the sink's own files can."""
        if out_free() < settings.disk_reserve_bytes:
            make_room()
            if out_free() < settings.disk_reserve_bytes:
                raise DiskFull(errno.ENOSPC, f"under {settings.disk_reserve_bytes} bytes free")

    files = FrameFileSink(settings.out_dir, quality=settings.jpeg_quality)
    videos = VideoAssemblers(settings.out_dir, fps=FPS,
                             gap_timeout_s=2 * (settings.join_ttl_s + settings.sweep_interval_s),
                             segment_frames=round(FPS * SEGMENT_SECONDS),
                             segment_bytes=settings.sink_disk_budget_bytes // SEGMENT_SHARE, check_room=check_room,
                             on_segment=lambda path: retention.add(path))
    retention = SinkRetention(settings.out_dir, settings.sink_disk_budget_bytes, in_use=videos.still_to_take)
    stage.metrics.add_gauges(lambda: {"sink_frames_written_total": files.written,
                                      "sink_duplicates_total": files.duplicates,
                                      "sink_videos_active": videos.active,
                                      "sink_video_failures_total": videos.failures,
                                      "sink_videos_finished_early_total": videos.finished_early,
                                      **retention.as_metrics(), **space.as_metrics("sink_")})
    stage.readiness.add("sink disk not paused", lambda: not space.paused)
    latest = LatestFrames(settings.preview_bytes)
    stage.serve_preview(latest)
    stage.metrics.declare("sink_records_in_total", "sink_over_pixel_budget_total")

    def write_frame(joined: Joined) -> bytes | None:
        check_room()
        jpeg = files.write_annotated(joined)
        if jpeg is not None:
            retention.add(files.path_for(joined.frame.id))
        return jpeg

    async def write(joined: Joined) -> None:
        jpeg = await space.retry(lambda: write_frame(joined), offload=stage.offload)
        if jpeg is not None:
            latest.show(joined, jpeg)
            await space.retry(lambda: videos.advance(joined.frame.id, limit=VIDEO_STEP), offload=stage.offload)

    @stage.app.agent(stage.topics.joined, name="sink")
    async def sink(stream):
        async for event in acked_when_done(stream.events()):
            stage.metrics.inc("sink_records_in_total")
            try:
                joined = wire.decode_joined(event.value, max_frame_bytes=settings.max_frame_bytes)
                await write(joined)
            except (wire.WireError, *UNUSABLE_PIXELS) as exc:
                await stage.dead_letters.refuse(event, stage="sink", error=exc)

    def tend_videos() -> None:
        videos.advance_all(limit=VIDEO_STEP)
        videos.finish_idle()

    @stage.app.timer(1.0, name="sink-videos")
    async def tend():
        await space.unless_full(lambda: stage.offload(tend_videos))

    # mode types handlers as VarArg/NamedArg callables, which mypy 2.4 matches with no function, sync or async.
    @stage.app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def finish_videos(app, **kwargs) -> None:
        try:
            await stage.offload(videos.finish_all)
        except DiskFull as exc:  # the partial segment is rebuilt from its frames at the next start
            log.warning("could not finish the videos on stop: %s", exc)
