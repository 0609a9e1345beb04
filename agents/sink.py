"""Sink stage: annotated frames on disk, one video per stream run, and contact sheets.

Layout under ``out_dir``::

    <stream>/<epoch>/frames/<index:08d>.jpg   annotated frames, written once each (idempotent)
    <stream>/<epoch>/video.avi                 the frames in index order (MJPG)

The frame files are the record of what was written: a restarted sink skips frames that exist, and
videos are rebuilt from the files. Videos are assembled by reading frames back from disk one at a
time, so memory holds one decoded frame however out of order frames arrive.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable, Iterable, Sequence

import cv2
import numpy as np

from streamapp.imaging import UNUSABLE_PIXELS, CorruptFrame, decode_frame, decode_jpeg, encode_jpeg
from streamapp import preview, wire
from streamapp.preview import LatestFrames
from streamapp.wire import Box, FrameId, Joined

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


def epoch_dir(out_dir: str | Path, stream: str, epoch: int) -> Path:
    if stream in (".", ".."):  # valid stream ids, but they would leave out_dir
        raise ValueError(f"stream id {stream!r} cannot name an output directory")
    return Path(out_dir) / stream / str(epoch)


def frame_path(out_dir: str | Path, frame_id: FrameId) -> Path:
    return epoch_dir(out_dir, frame_id.stream, frame_id.epoch) / "frames" / f"{frame_id.index:08d}.jpg"


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers see the whole file or none of it, even after a crash or power loss."""
    path.parent.mkdir(parents=True, exist_ok=True)
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


# --- videos -----------------------------------------------------------------------------------


def _frame_indices(frames_dir: Path) -> list[int]:
    """Indices of the frame files present, ascending (temporary files are skipped)."""
    if not frames_dir.is_dir():
        return []
    names = (entry.name for entry in os.scandir(frames_dir))
    return sorted(int(name[:-4]) for name in names if name.endswith(".jpg") and name[:-4].isdigit())


class VideoAssembler:
    """Builds ``<stream>/<epoch>/video.avi`` from the frame files, in index order.

    :meth:`advance` appends every next frame that is on disk and stops at the first missing one.
    With ``gap_timeout_s`` a frame missing that long is given up on (counted in ``gaps``) once a
    later frame exists; :meth:`finish` gives up on all missing frames and completes the file.
    The video is written to ``video.partial.avi`` and renamed when finished (which ends the
    assembler); a new assembler for the same run, e.g. after a restart, rebuilds it from frame 0,
    so the video depends only on the frame files.
    """

    def __init__(self, out_dir: str | Path, stream: str, epoch: int, *, fps: float = 15.0,
                 gap_timeout_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = epoch_dir(out_dir, stream, epoch)
        self.frames_dir = self.directory / "frames"
        self.video_path = self.directory / "video.avi"
        self._partial_path = self.directory / "video.partial.avi"
        self.fps = fps
        self.gap_timeout_s = gap_timeout_s
        self._clock = clock
        self.next_index = 0
        self.appended = 0
        self.gaps = 0
        self.unreadable = 0
        self.last_progress = clock()
        self._waiting_since: float | None = None
        self._writer: cv2.VideoWriter | None = None
        self._size: tuple[int, int] | None = None

    def advance(self, limit: int | None = None) -> int:
        """Append the frames that are next in order, at most ``limit``; returns how many were appended.

        A limit bounds the time one call takes, e.g. while catching up after a restart.
        """
        appended = 0
        while limit is None or appended < limit:
            path = self._path(self.next_index)
            if path.exists():
                self._append(path)
                self.next_index += 1
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

    def finish(self) -> Path | None:
        """Append all remaining frames in index order, skipping missing ones, and complete the video."""
        for index in _frame_indices(self.frames_dir):
            if index >= self.next_index:
                self.gaps += index - self.next_index
                self._append(self._path(index))
                self.next_index = index + 1
        if self._writer is None:
            return None
        self._writer.release()
        self._writer = None
        os.replace(self._partial_path, self.video_path)
        return self.video_path

    def _path(self, index: int) -> Path:
        return self.frames_dir / f"{index:08d}.jpg"

    def _append(self, path: Path) -> None:
        try:
            image = decode_jpeg(path.read_bytes())
        except CorruptFrame:
            self.unreadable += 1
            return
        if self._writer is None:
            self._size = (image.shape[1], image.shape[0])
            self._writer = cv2.VideoWriter(str(self._partial_path), cv2.CAP_OPENCV_MJPEG,
                                           cv2.VideoWriter_fourcc(*"MJPG"), self.fps, self._size)
            if not self._writer.isOpened():
                self._writer = None
                raise OSError(f"cannot write video {self._partial_path}")
        if (image.shape[1], image.shape[0]) != self._size:
            image = cv2.resize(image, self._size, interpolation=cv2.INTER_AREA)
        self._writer.write(image)
        self.appended += 1

    @property
    def counters(self) -> dict[str, int]:
        return {"appended": self.appended, "gaps": self.gaps, "unreadable": self.unreadable}


class VideoAssemblers:
    """One :class:`VideoAssembler` per stream run, finished once its run goes quiet.

    A frame that arrives for a run after it was finished starts a new assembler, which rebuilds
    that run's video from all its frame files.
    """

    def __init__(self, out_dir: str | Path, *, fps: float = 15.0, gap_timeout_s: float | None = None,
                 idle_finish_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.out_dir = Path(out_dir)
        self.fps = fps
        self.gap_timeout_s = gap_timeout_s
        self.idle_finish_s = idle_finish_s
        self._clock = clock
        self._active: dict[tuple[str, int], VideoAssembler] = {}

    def advance(self, frame_id: FrameId, limit: int | None = None) -> int:
        """Advance the run of ``frame_id``, starting an assembler for it if it has none."""
        key = (frame_id.stream, frame_id.epoch)
        if key not in self._active:
            self._active[key] = VideoAssembler(self.out_dir, *key, fps=self.fps,
                                               gap_timeout_s=self.gap_timeout_s, clock=self._clock)
        return self._active[key].advance(limit)

    def advance_all(self, limit: int | None = None) -> int:
        """Advance every active run: lets gap timeouts fire when no frames arrive."""
        return sum(assembler.advance(limit) for assembler in self._active.values())

    def finish_idle(self) -> list[Path]:
        """Finish the runs that appended nothing for ``idle_finish_s``; returns their videos."""
        now = self._clock()
        idle = [key for key, assembler in self._active.items()
                if now - assembler.last_progress >= self.idle_finish_s]
        return self._finish(idle)

    def finish_all(self) -> list[Path]:
        return self._finish(list(self._active))

    def _finish(self, keys: Iterable[tuple[str, int]]) -> list[Path]:
        videos = (self._active.pop(key).finish() for key in keys)
        return [video for video in videos if video is not None]

    @property
    def active(self) -> int:
        return len(self._active)


# --- contact sheets ---------------------------------------------------------------------------


def contact_sheet(image_paths: Sequence[str | Path], columns: int = 4, tile_width: int = 320) -> np.ndarray:
    """The images as tiles of ``tile_width`` in a grid, left to right, top to bottom.

    Tiles take the aspect ratio of the first image; others keep theirs, centred on black.
    Images are read one at a time.
    """
    if not image_paths:
        raise ValueError("a contact sheet needs at least one image")
    if columns < 1 or tile_width < 1:
        raise ValueError(f"columns and tile_width must be >= 1, got {columns} and {tile_width}")
    sheet = tile_height = None
    rows = math.ceil(len(image_paths) / columns)
    for position, path in enumerate(image_paths):
        image = _read_image(path)
        if sheet is None:
            tile_height = max(1, round(tile_width * image.shape[0] / image.shape[1]))
            sheet = np.zeros((rows * tile_height, columns * tile_width, 3), np.uint8)
        row, column = divmod(position, columns)
        scale = min(tile_width / image.shape[1], tile_height / image.shape[0])
        width, height = max(1, round(image.shape[1] * scale)), max(1, round(image.shape[0] * scale))
        top = row * tile_height + (tile_height - height) // 2
        left = column * tile_width + (tile_width - width) // 2
        sheet[top:top + height, left:left + width] = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    return sheet


def _read_image(path: str | Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise CorruptFrame(f"cannot read image {str(path)!r}")
    return image


def save_contact_sheet(path: str | Path, image_paths: Sequence[str | Path], columns: int = 4,
                       tile_width: int = 320) -> Path:
    """Writes :func:`contact_sheet` as a PNG (``contact_sheet.png`` by convention)."""
    path = Path(path)
    ok, png = cv2.imencode(".png", contact_sheet(image_paths, columns, tile_width))
    if not ok:
        raise OSError(f"cannot encode contact sheet {path}")
    _write_atomically(path, png.tobytes())
    return path


# Frames appended to a video per call: bounds one call's time while a restarted sink catches up.
VIDEO_STEP = 64


def register(stage) -> None:
    """Faust agent: ``joined`` -> annotated frame files and one video per stream run.

    Frames leave the join out of order (unmatched ones a TTL later), so a missing frame is waited
    for twice the longest a frame can take through the join before the video skips it.
    """
    settings = stage.settings
    files = FrameFileSink(settings.out_dir, quality=settings.jpeg_quality)
    videos = VideoAssemblers(settings.out_dir,
                             gap_timeout_s=2 * (settings.join_ttl_s + settings.sweep_interval_s))
    stage.metrics.add_gauges(lambda: {"sink_frames_written_total": files.written,
                                      "sink_duplicates_total": files.duplicates,
                                      "sink_videos_active": videos.active})
    latest = LatestFrames(settings.preview_bytes)
    preview.register(stage, latest)
    stage.metrics.declare("sink_records_in_total")

    def write(joined: Joined) -> None:
        jpeg = files.write_annotated(joined)
        if jpeg is not None:
            latest.show(joined, jpeg)
            videos.advance(joined.frame.id, limit=VIDEO_STEP)

    @stage.app.agent(stage.topics.joined, name="sink")
    async def sink(stream):
        async for event in stream.events():
            stage.metrics.inc("sink_records_in_total")
            try:
                joined = wire.decode_joined(event.value, max_frame_bytes=settings.max_frame_bytes)
                await stage.offload(write, joined)
            except (wire.WireError, *UNUSABLE_PIXELS) as exc:
                await stage.dead_letters.send(event, stage="sink", reason=str(exc))

    def tend_videos() -> None:
        videos.advance_all(limit=VIDEO_STEP)
        videos.finish_idle()

    @stage.app.timer(1.0, name="sink-videos")
    async def tend():
        await stage.offload(tend_videos)
