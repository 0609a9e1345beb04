"""Inference stage: detectors that need no downloaded weights, and the per-frame step around them.

A detector is any object with a ``name`` and ``detect(image, frame_id)`` returning box-likes
(``label, score, x, y, w, h`` in the pixels of ``image``). ``frame_id`` lets a stateful detector
keep one model per stream run; stateless ones ignore it. :func:`infer_frame` decodes the scaled
frame, runs the detector and maps the boxes back to the original frame's pixels.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import math
import time
from typing import Protocol, Sequence

import cv2
import numpy as np

from streamapp import wire
from streamapp.metrics import INFER_LATENCY_BOUNDS
from streamapp.imaging import CorruptFrame, decode_frame
from streamapp.wire import Box, Detections, Frame, FrameId


class BoxLike(Protocol):
    label: str
    score: float
    x: int
    y: int
    w: int
    h: int


class Detector(Protocol):
    name: str

    def detect(self, image: np.ndarray, frame_id: FrameId) -> Sequence[BoxLike]: ...


class DetectorError(ValueError):
    """A detector spec that does not name a loadable detector."""


def _boxes_of_mask(mask: np.ndarray, label: str, min_area: float) -> list[Box]:
    """One box per outer contour of a binary mask; score is how much of its box the blob fills."""
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    boxes = []
    for contour in contours:
        x, y, w, h = cv2.boundingRect(contour)
        if w * h < min_area:
            continue
        fill = cv2.countNonZero(mask[y:y + h, x:x + w]) / (w * h)
        boxes.append(Box(label, fill, x, y, w, h))
    return boxes


def _min_area(image: np.ndarray, ratio: float) -> float:
    return ratio * image.shape[0] * image.shape[1]


class ColorContourDetector:
    """Finds saturated red, green, blue and yellow blobs: the objects of the synthetic scenes."""

    name = "color"
    # OpenCV hue runs 0..179; red wraps around, so it takes two ranges.
    HUE_RANGES = {
        "red": ((0, 10), (170, 179)),
        "yellow": ((20, 40),),
        "green": ((45, 85),),
        "blue": ((100, 140),),
    }

    def __init__(self, *, min_saturation: int = 100, min_value: int = 140,
                 min_area_ratio: float = 0.001) -> None:
        self.min_saturation = min_saturation
        self.min_value = min_value
        self.min_area_ratio = min_area_ratio

    def detect(self, image: np.ndarray, frame_id: FrameId) -> list[Box]:
        hsv = cv2.cvtColor(image, cv2.COLOR_BGR2HSV)
        min_area = _min_area(image, self.min_area_ratio)
        boxes = []
        for label, hue_ranges in self.HUE_RANGES.items():
            mask = np.zeros(hsv.shape[:2], np.uint8)
            for low, high in hue_ranges:
                mask |= cv2.inRange(hsv, (low, self.min_saturation, self.min_value), (high, 255, 255))
            boxes.extend(_boxes_of_mask(mask, label, min_area))
        return boxes


@dataclasses.dataclass
class _BackgroundModel:
    subtractor: cv2.BackgroundSubtractorMOG2
    frames_seen: int = 0


class MotionDetector:
    """Moving regions by background subtraction (MOG2), one model per stream run.

    Models are kept for the ``max_streams`` most recently seen runs; each costs a few float arrays
    of the frame size. Frames seen while a model warms up produce no boxes: a fresh model calls
    everything foreground.
    """

    name = "motion"

    def __init__(self, *, max_streams: int = 16, history: int = 200, var_threshold: float = 16.0,
                 warmup_frames: int = 5, min_area_ratio: float = 0.002) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.max_streams = max_streams
        self.history = history
        self.var_threshold = var_threshold
        self.warmup_frames = warmup_frames
        self.min_area_ratio = min_area_ratio
        # Keyed by (stream, epoch), least recently used first.
        self._models: collections.OrderedDict[tuple[str, int], _BackgroundModel] = collections.OrderedDict()
        self._kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))

    def detect(self, image: np.ndarray, frame_id: FrameId) -> list[Box]:
        model = self._model((frame_id.stream, frame_id.epoch))
        mask = model.subtractor.apply(image)
        model.frames_seen += 1
        if model.frames_seen <= self.warmup_frames:
            return []
        # Drop shadows (127) and speckle, then close holes so one object gives one contour.
        _, mask = cv2.threshold(mask, 200, 255, cv2.THRESH_BINARY)
        mask = cv2.morphologyEx(mask, cv2.MORPH_OPEN, self._kernel)
        mask = cv2.morphologyEx(mask, cv2.MORPH_CLOSE, self._kernel, iterations=2)
        return _boxes_of_mask(mask, "motion", _min_area(image, self.min_area_ratio))

    def _model(self, key: tuple[str, int]) -> _BackgroundModel:
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = _BackgroundModel(cv2.createBackgroundSubtractorMOG2(
                history=self.history, varThreshold=self.var_threshold, detectShadows=True))
            if len(self._models) > self.max_streams:
                self._models.popitem(last=False)
        else:
            self._models.move_to_end(key)
        return model

    @property
    def streams(self) -> int:
        return len(self._models)


class HogPeopleDetector:
    """Upright people with OpenCV's HOG descriptor and its built-in linear SVM (64x128 window)."""

    name = "hog"

    def __init__(self, *, win_stride: int = 8, scale: float = 1.05, min_weight: float = 0.0) -> None:
        self.win_stride = win_stride
        self.scale = scale
        self.min_weight = min_weight
        self._hog = cv2.HOGDescriptor()
        self._hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())

    def detect(self, image: np.ndarray, frame_id: FrameId) -> list[Box]:
        window_w, window_h = self._hog.winSize
        if image.shape[1] < window_w or image.shape[0] < window_h:
            return []  # OpenCV raises instead of finding nothing
        rects, weights = self._hog.detectMultiScale(
            image, winStride=(self.win_stride, self.win_stride), padding=(8, 8), scale=self.scale)
        # SVM weights are unbounded margins; w / (1 + w) maps them into 0..1 keeping the order.
        return [Box("person", float(weight) / (1.0 + float(weight)), int(x), int(y), int(w), int(h))
                for (x, y, w, h), weight in zip(rects, np.ravel(weights))
                if weight > self.min_weight]


BUILTIN_DETECTORS = {
    ColorContourDetector.name: ColorContourDetector,
    MotionDetector.name: MotionDetector,
    HogPeopleDetector.name: HogPeopleDetector,
}


def load_detector(spec: str) -> Detector:
    """A built-in detector by name, or ``"package.module:ClassName"`` instantiated with no arguments."""
    if spec in BUILTIN_DETECTORS:
        return BUILTIN_DETECTORS[spec]()
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise DetectorError(f"detector {spec!r}: expected one of {', '.join(BUILTIN_DETECTORS)} "
                            f"or an import path like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import runs arbitrary code; any failure means "cannot load"
        raise DetectorError(f"detector {spec!r}: cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, class_name, None)
    if not callable(factory):
        raise DetectorError(f"detector {spec!r}: module {module_name!r} has no class {class_name!r}")
    try:
        detector = factory()
    except Exception as exc:
        raise DetectorError(f"detector {spec!r}: {class_name}() failed: {exc}") from exc
    if not isinstance(getattr(detector, "name", None), str) or not callable(getattr(detector, "detect", None)):
        raise DetectorError(f"detector {spec!r}: needs a 'name' string and a detect(image, frame_id) method")
    return detector


# --- the stage --------------------------------------------------------------------------------


def infer_frame(frame: Frame, detector: Detector) -> Detections:
    """Detections for a (usually scaled) frame, in the pixels of the original frame.

    ``latency_ms`` covers decode, detection and mapping: what this stage spends on the frame.
    Raises CorruptFrame for an undecodable JPEG.
    """
    started = time.perf_counter()
    found = _detect(frame, detector)
    width = frame.source_width or frame.width
    height = frame.source_height or frame.height
    scale_x, scale_y = width / frame.width, height / frame.height
    boxes = tuple(box for box in (_to_original(raw, scale_x, scale_y, width, height) for raw in found)
                  if box is not None)
    return Detections(frame.id, boxes, detector.name, (time.perf_counter() - started) * 1000.0,
                      width, height)


def _detect(frame: Frame, detector: Detector) -> Sequence[BoxLike]:
    # The decoded image lives only in this call.
    return detector.detect(decode_frame(frame), frame.id)


def _to_original(box: BoxLike, scale_x: float, scale_y: float, width: int, height: int) -> Box | None:
    """The box scaled to the original frame and clipped to it; None if nothing of it is inside."""
    left, right = _clip_span(box.x * scale_x, (box.x + box.w) * scale_x, width)
    top, bottom = _clip_span(box.y * scale_y, (box.y + box.h) * scale_y, height)
    if right <= left or bottom <= top:
        return None
    score = float(box.score)
    score = min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0
    return Box(str(box.label), score, left, top, right - left, bottom - top)


def _clip_span(start: float, end: float, limit: int) -> tuple[int, int]:
    """[start, end) rounded to whole pixels within [0, limit); at least one pixel wide if it overlaps."""
    first = min(max(round(start), 0), limit)
    last = min(max(round(end), 0), limit)
    if last == first and start < limit and end > 0:
        last = min(first + 1, limit)
        first = last - 1
    return first, last


def register(stage) -> None:
    """Faust agent: ``frames.scaled`` -> ``detections``, detection on the pixel thread.

    A detector that raises on one frame (a plugin's bug, a frame it cannot handle) costs that
    frame a dead letter, never the worker.
    """
    settings, topics = stage.settings, stage.topics
    detector = load_detector(settings.detector)
    latency = stage.metrics.histogram("infer_latency_seconds", INFER_LATENCY_BOUNDS)
    stage.metrics.declare("infer_frames_in_total", "infer_results_total")

    @stage.app.agent(topics.scaled, name="infer")
    async def infer(stream):
        async for event in stream.events():
            stage.metrics.inc("infer_frames_in_total")
            try:
                scaled = wire.decode_frame(event.value, max_frame_bytes=settings.max_frame_bytes)
                detections = await stage.offload(infer_frame, scaled, detector)
                value = wire.encode_detections(detections)
                latency.observe(detections.latency_ms / 1000)
            except (wire.WireError, CorruptFrame) as exc:
                await stage.dead_letters.send(event, stage="infer", reason=str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - see the docstring
                await stage.dead_letters.send(event, stage="infer", reason=f"{detector.name}: {exc!r}")
                continue
            if await stage.dead_letters.emit(event, stage="infer", topic=topics.detections,
                                             key=scaled.id.bucket_key(settings.bucket_size), value=value,
                                             timestamp=event.message.timestamp):
                stage.metrics.inc("infer_results_total")
