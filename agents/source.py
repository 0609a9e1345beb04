"""Frame sources: synthetic scenes with ground truth, and video files.

Every run of a source gets a new epoch and numbers its frames from 0 (R10), so a restarted source
never collides with what an earlier run left in the join. A frame's timestamp is its capture clock:
the run's start time plus index / fps.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from streamapp.errors import StreamappError
from streamapp.groundtruth import TruthBox
from streamapp.imaging import encode_jpeg
from streamapp.opencv import cv2
from streamapp.wire import Frame, FrameId, parse_stream_id

DEFAULT_FPS = 15.0
# BGR colours far apart in hue that the colour detector looks for. All are much brighter than the
# background: JPEG keeps colour at half resolution, so edges are found by brightness (pure blue is
# as dark as the background and would bleed by two pixels).
COLOURS = {"red": (40, 40, 255), "green": (0, 255, 0), "blue": (255, 120, 0), "yellow": (0, 255, 255)}


class SourceError(StreamappError, RuntimeError):
    """A source that cannot produce frames, e.g. a video file OpenCV cannot open."""


def to_frame(frame_id: FrameId, timestamp_ms: int, image: np.ndarray, quality: int = 90) -> Frame:
    height, width = image.shape[:2]
    return Frame(frame_id, timestamp_ms, width, height, encode_jpeg(image, quality))


def _check_rate_and_quality(fps: float, quality: int) -> None:
    if not (math.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be a positive number, got {fps!r}")
    if not 1 <= quality <= 100:
        raise ValueError(f"JPEG quality must be 1..100, got {quality}")


def _capture_time(start_ms: int, index: int, fps: float) -> int:
    return start_ms + round(index * 1000 / fps)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# --- synthetic scenes -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Mover:
    """One object moving at constant speed and bouncing off the walls of its lane."""

    label: str
    circle: bool
    w: int
    h: int
    x_range: tuple[int, int]  # where the top-left corner may be, inclusive
    y_range: tuple[int, int]
    start: tuple[float, float]  # phase of the bounce, in pixels
    velocity: tuple[float, float]  # pixels per frame

    def box(self, index: int) -> TruthBox:
        x = _bounce(self.start[0] + self.velocity[0] * index, *self.x_range)
        y = _bounce(self.start[1] + self.velocity[1] * index, *self.y_range)
        return TruthBox(self.label, x, y, self.w, self.h)

    def draw(self, image: np.ndarray, box: TruthBox) -> None:
        colour = COLOURS[self.label]
        if self.circle:
            radius = box.w // 2
            cv2.circle(image, (box.x + radius, box.y + radius), radius, colour, cv2.FILLED, cv2.LINE_8)
        else:
            cv2.rectangle(image, (box.x, box.y), (box.x + box.w - 1, box.y + box.h - 1), colour,
                          cv2.FILLED, cv2.LINE_8)


def _bounce(travelled: float, low: int, high: int) -> int:
    """Position after travelling ``travelled`` pixels back and forth between ``low`` and ``high``."""
    span = high - low
    if span == 0:
        return low
    phase = travelled % (2 * span)
    return low + round(phase if phase <= span else 2 * span - phase)


class SyntheticScene:
    """Two to four coloured rectangles and circles bouncing over a dark, lightly textured background.

    Deterministic for a seed, and random access: ``render(index)`` needs no earlier frame. Each
    object has its own horizontal lane and stays fully inside the frame, so objects never overlap
    and each true box is exactly the object's pixels.
    """

    def __init__(self, width: int = 640, height: int = 480, *, seed: int = 0,
                 objects: int | None = None) -> None:
        if width < 64 or height < 64:
            raise ValueError(f"a synthetic scene needs at least 64x64 pixels, got {width}x{height}")
        if objects is not None and not 1 <= objects <= len(COLOURS):
            raise ValueError(f"objects must be 1..{len(COLOURS)}, got {objects}")
        rng = np.random.default_rng(seed)
        self.width, self.height = width, height
        count = objects or int(rng.integers(2, len(COLOURS) + 1))
        labels = rng.choice(list(COLOURS), size=count, replace=False)
        lane_height = height // count
        self._movers = [self._mover(rng, str(label), lane * lane_height, lane_height)
                        for lane, label in enumerate(labels)]
        self._background = self._textured_background(rng)

    def _mover(self, rng: np.random.Generator, label: str, lane_top: int, lane_height: int) -> _Mover:
        margin = 4  # keeps JPEG ringing of neighbouring lanes apart
        w = int(rng.uniform(0.10, 0.18) * self.width)
        h = min(int(rng.uniform(0.12, 0.22) * self.height), lane_height - 2 * margin)
        circle = bool(rng.integers(2))
        if circle:  # odd diameter: a filled circle of radius r covers exactly 2r + 1 pixels
            w = h = (min(w, h) - 1) | 1
        x_range = (0, self.width - w)
        y_range = (lane_top + margin, lane_top + lane_height - margin - h)
        return _Mover(
            label, circle, w, h, x_range, y_range,
            start=(rng.uniform(0, 2 * (x_range[1] - x_range[0])), rng.uniform(0, 2 * (y_range[1] - y_range[0]))),
            velocity=(rng.uniform(0.004, 0.012) * self.width * rng.choice((-1, 1)),
                      rng.uniform(0.002, 0.008) * self.height * rng.choice((-1, 1))),
        )

    def _textured_background(self, rng: np.random.Generator) -> np.ndarray:
        # Dark and nearly grey (low value and saturation), so no colour threshold ever fires on it.
        ramp = np.linspace(20, 55, self.width)[None, :] + np.linspace(0, 15, self.height)[:, None]
        grey = ramp + rng.normal(0, 3, (self.height, self.width))
        tinted = np.stack([grey + 6, grey + 3, grey], axis=-1)
        return np.clip(tinted, 0, 255).astype(np.uint8)

    def truth(self, index: int) -> list[TruthBox]:
        return [mover.box(index) for mover in self._movers]

    def render(self, index: int) -> tuple[np.ndarray, list[TruthBox]]:
        """The BGR image of frame ``index`` and its true boxes."""
        image = self._background.copy()
        boxes = self.truth(index)
        for mover, box in zip(self._movers, boxes, strict=True):
            mover.draw(image, box)
        return image, boxes


def synthetic_frames(stream: str, epoch: int, count: int | None = None, width: int = 640,
                     height: int = 480, seed: int = 0, *, fps: float = DEFAULT_FPS, quality: int = 90,
                     objects: int | None = None, now_ms: int | None = None,
                     ) -> Iterator[tuple[Frame, list[TruthBox]]]:
    """``count`` frames (endless if None) of a :class:`SyntheticScene`, each with its true boxes.

    Arguments are checked now, not at the first frame.
    """
    parse_stream_id(stream)
    _check_rate_and_quality(fps, quality)
    scene = SyntheticScene(width, height, seed=seed, objects=objects)
    start_ms = _now_ms() if now_ms is None else now_ms
    return _render_frames(scene, stream, epoch, count, fps, quality, start_ms)


def _render_frames(scene: SyntheticScene, stream: str, epoch: int, count: int | None, fps: float,
                   quality: int, start_ms: int) -> Iterator[tuple[Frame, list[TruthBox]]]:
    for index in itertools.count() if count is None else range(count):
        image, truth = scene.render(index)
        frame = to_frame(FrameId(stream, epoch, index), _capture_time(start_ms, index, fps), image, quality)
        del image  # a suspended generator would otherwise keep the image alive
        yield frame, truth


# --- video files ------------------------------------------------------------------------------


def video_file_frames(path: str | Path, stream: str, epoch: int, *, max_frames: int | None = None,
                      fps: float | None = None, quality: int = 90, now_ms: int | None = None,
                      ) -> Iterator[Frame]:
    """The frames of any video OpenCV can read, re-encoded as JPEG.

    Opens the file now, so a missing or unreadable file raises :class:`SourceError` here rather
    than at the first frame. ``fps`` defaults to the file's own rate (15 if it does not say).
    """
    parse_stream_id(stream)
    _check_rate_and_quality(DEFAULT_FPS if fps is None else fps, quality)
    capture = cv2.VideoCapture(str(path))
    if not capture.isOpened():
        raise SourceError(f"cannot open video {str(path)!r}: missing, unreadable or not a format OpenCV reads")
    if fps is None:
        fps = capture.get(cv2.CAP_PROP_FPS)
        fps = fps if math.isfinite(fps) and fps > 0 else DEFAULT_FPS
    start_ms = _now_ms() if now_ms is None else now_ms
    return _read_video(capture, path, stream, epoch, max_frames, fps, quality, start_ms)


def _read_video(capture: cv2.VideoCapture, path: str | Path, stream: str, epoch: int,
                max_frames: int | None, fps: float, quality: int, start_ms: int) -> Iterator[Frame]:
    try:
        for index in itertools.count() if max_frames is None else range(max_frames):
            ok, image = capture.read()
            if not ok:
                if index == 0:
                    raise SourceError(f"video {str(path)!r} opened but no frame could be decoded")
                return
            frame = to_frame(FrameId(stream, epoch, index), _capture_time(start_ms, index, fps), image, quality)
            del image
            yield frame
    finally:
        capture.release()


# --- pacing -----------------------------------------------------------------------------------


class Pacer:
    """Spaces frames ``1 / fps`` apart on a fixed schedule, so sleep overshoot never adds up to drift.

    ``fps=None`` means as fast as possible. After a stall longer than one interval the schedule
    restarts from now instead of bursting to catch up (a live source does not replay the past).
    """

    def __init__(self, fps: float | None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if fps is not None and not (math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps must be a positive number or None, got {fps!r}")
        self.interval = 0.0 if fps is None else 1.0 / fps
        self._clock = clock
        self._sleep = sleep
        self._next: float | None = None

    def delay(self) -> float:
        """Seconds until the next frame is due; books that frame. For ``await asyncio.sleep(...)``."""
        if not self.interval:
            return 0.0
        now = self._clock()
        if self._next is None or now - self._next > self.interval:
            self._next = now
        delay = max(0.0, self._next - now)
        self._next += self.interval
        return delay

    def wait(self) -> None:
        delay = self.delay()
        if delay:
            self._sleep(delay)
