"""Inference stage: the detectors, and the step around them that turns scaled frames into results.

A detector is any object with a ``name`` and ``detect(image, frame_id)`` returning box-likes
(``label, score, x, y, w, h`` in the pixels of ``image``). ``frame_id`` lets a stateful detector
keep one model per stream run; stateless ones ignore it. A detector that also has
``detect_batch(images, aspect_ratios)`` (the original frames' width / height, which scaled
images may not keep) gets several frames in one call when frames are waiting (YOLO runs them as
one network pass). :func:`infer_frames` decodes the scaled frames, runs the detector and maps
the boxes back to the original frames' pixels.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from streamapp import assets, wire
from streamapp.batches import acked_when_done
from streamapp.errors import UsageError
from streamapp.groundtruth import LabelledRect
from streamapp.imaging import UNUSABLE_PIXELS, CorruptFrame, decode_frame
from streamapp.opencv import cv2
from streamapp.samples import INFER_LATENCY_BOUNDS
from streamapp.settings import Settings
from streamapp.wire import Box, Detections, Frame, FrameId

if TYPE_CHECKING:
    from streamapp.worker.stage import Stage


class BoxLike(LabelledRect, Protocol):
    """What a detector returns per object: read-only, so frozen boxes (like wire.Box) qualify."""

    @property
    def score(self) -> float: ...


class Detector(Protocol):
    name: str

    def detect(self, image: np.ndarray, frame_id: FrameId) -> Sequence[BoxLike]: ...


class DetectorError(UsageError, ValueError):
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
        # cv2's stubs say Sequence[float]; it returns the float32 array setSVMDetector takes.
        self._hog.setSVMDetector(cv2.HOGDescriptor.getDefaultPeopleDetector())  # type: ignore[call-overload]

    def detect(self, image: np.ndarray, frame_id: FrameId) -> list[Box]:
        window_w, window_h = self._hog.winSize
        if image.shape[1] < window_w or image.shape[0] < window_h:
            return []  # OpenCV raises instead of finding nothing
        rects, weights = self._hog.detectMultiScale(
            image, winStride=(self.win_stride, self.win_stride), padding=(8, 8), scale=self.scale)
        # SVM weights are unbounded margins; w / (1 + w) maps them into 0..1 keeping the order.
        return [Box("person", float(weight) / (1.0 + float(weight)), int(x), int(y), int(w), int(h))
                for (x, y, w, h), weight in zip(rects, np.ravel(weights), strict=True)
                if weight > self.min_weight]


class YoloDetector:
    """YOLOv3-tiny (COCO, 80 classes) through OpenCV DNN, from the files ``streamapp model`` fetched.

    The network takes a square input of ``input_size`` pixels. Each frame is letterboxed into it
    at its original aspect ratio (the resize stage scales to an exact size, so a wide video
    arrives squeezed; stretched people and bicycles are missed). Non-maximum suppression runs per
    class, so a person on a bicycle keeps both boxes.
    """

    name = "yolo"
    PAD = 128  # the grey Darknet fills letterbox bars with

    def __init__(self, *, input_size: int = 416, confidence: float = 0.25, nms: float = 0.45,
                 classes: Sequence[str] = ()) -> None:
        weights, config, names = (assets.locate(asset) for asset in assets.MODEL)
        self.labels = tuple(line.strip() for line in names.read_text().splitlines() if line.strip())
        unknown = [label for label in classes if label not in self.labels]
        if unknown:
            raise DetectorError(f"STREAMAPP_YOLO_CLASSES: {', '.join(map(repr, unknown))} not among "
                                f"the COCO classes of {names}: {', '.join(self.labels)}")
        self._wanted = np.array([label in classes for label in self.labels]) if classes else None
        self.input_size, self.confidence, self.nms = input_size, confidence, nms
        self._net = cv2.dnn.readNetFromDarknet(str(config), str(weights))
        self._outputs = self._net.getUnconnectedOutLayersNames()

    @classmethod
    def from_settings(cls, settings: Settings) -> YoloDetector:
        return cls(input_size=settings.yolo_input, confidence=settings.yolo_confidence,
                   nms=settings.yolo_nms, classes=settings.yolo_classes)

    def detect(self, image: np.ndarray, frame_id: FrameId) -> list[Box]:
        return self.detect_batch([image], [image.shape[1] / image.shape[0]])[0]

    def detect_batch(self, images: Sequence[np.ndarray], aspect_ratios: Sequence[float]) -> list[list[Box]]:
        """The boxes of each image, from one pass of the network over all of them.

        ``aspect_ratios`` are the width / height of each image's original frame.
        """
        placements = [self._placement(image, ratio) for image, ratio in zip(images, aspect_ratios, strict=True)]
        canvases = [self._letterboxed(image, placement) for image, placement in zip(images, placements, strict=True)]
        self._net.setInput(cv2.dnn.blobFromImages(canvases, 1 / 255.0, swapRB=True, crop=False))
        del canvases
        # One array per YOLO output layer: rows of (cx, cy, w, h, objectness, 80 class scores),
        # relative to the input; batched as (images, rows, 85), or (rows, 85) for one image.
        layers = [layer.reshape(len(images), -1, layer.shape[-1]) for layer in self._net.forward(self._outputs)]
        return [self._boxes(np.concatenate([layer[number] for layer in layers]), image, placement)
                for number, (image, placement) in enumerate(zip(images, placements, strict=True))]

    def _placement(self, image: np.ndarray, aspect_ratio: float) -> tuple[int, int, int, int]:
        """Where the image goes on the square input: left, top, width, height."""
        size = self.input_size
        width, height = (size, max(1, round(size / aspect_ratio))) if aspect_ratio >= 1 else \
            (max(1, round(size * aspect_ratio)), size)
        return (size - width) // 2, (size - height) // 2, width, height

    def _letterboxed(self, image: np.ndarray, placement: tuple[int, int, int, int]) -> np.ndarray:
        left, top, width, height = placement
        canvas = np.full((self.input_size, self.input_size, 3), self.PAD, np.uint8)
        canvas[top:top + height, left:left + width] = cv2.resize(image, (width, height),
                                                                 interpolation=cv2.INTER_LINEAR)
        return canvas

    def _boxes(self, rows: np.ndarray, image: np.ndarray, placement: tuple[int, int, int, int]) -> list[Box]:
        scores = rows[:, 5:]
        class_ids = scores.argmax(axis=1)
        confidences = scores[np.arange(len(rows)), class_ids]
        keep = confidences >= self.confidence
        if self._wanted is not None:
            keep &= self._wanted[class_ids]
        rows, class_ids, confidences = rows[keep], class_ids[keep], confidences[keep]
        # Input-relative centres and sizes -> pixels of the image, axis by axis.
        left, top, width, height = placement
        to_image = (image.shape[1] / width, image.shape[0] / height)
        sizes = rows[:, 2:4] * self.input_size * to_image
        corners = (rows[:, 0:2] * self.input_size - (left, top)) * to_image - sizes / 2
        rects = np.concatenate([corners, sizes], axis=1).tolist()
        chosen = cv2.dnn.NMSBoxesBatched(rects, confidences.tolist(), class_ids.tolist(),
                                         self.confidence, self.nms) if rects else ()
        return [Box(self.labels[class_ids[i]], float(confidences[i]), *(round(v) for v in rects[i]))
                for i in np.ravel(chosen)]


BUILTIN_DETECTORS: dict[str, Callable[[Settings], Detector]] = {
    ColorContourDetector.name: lambda settings: ColorContourDetector(),
    MotionDetector.name: lambda settings: MotionDetector(),
    HogPeopleDetector.name: lambda settings: HogPeopleDetector(),
    YoloDetector.name: YoloDetector.from_settings,
}


def load_detector(spec: str, settings: Settings | None = None) -> Detector:
    """A built-in detector by name (configured by ``settings``), or ``"package.module:ClassName"``
    instantiated with no arguments."""
    if spec in BUILTIN_DETECTORS:
        try:
            return BUILTIN_DETECTORS[spec](settings or Settings())
        except assets.AssetError as exc:  # a missing or corrupt file, not a bad setting
            raise DetectorError(f"detector {spec!r}: {exc}", exit_code=assets.AssetError.exit_code) from None
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

    Raises CorruptFrame for an undecodable JPEG, and whatever the detector raises.
    """
    result = infer_frames([frame], detector)[0]
    if isinstance(result, Exception):
        raise result
    return result


def infer_frames(frames: Sequence[Frame], detector: Detector) -> list[Detections | Exception]:
    """:func:`infer_frame` for several frames in one detector call where the detector batches.

    Each frame gets its detections or the exception that cost it them: an undecodable frame (or
    one over the pixel limit) fails alone; a detector that raises fails the frames it was given.
    ``latency_ms`` is the whole call (decode, detection, mapping): how long each frame of it
    waited for its result.
    The decoded images live only in this call.
    """
    started = time.perf_counter()
    results: dict[int, Detections | Exception] = {}
    images, decoded = [], []
    for position, frame in enumerate(frames):
        try:
            images.append(decode_frame(frame))
            decoded.append(position)
        except UNUSABLE_PIXELS as exc:
            results[position] = exc
    found: Sequence[Sequence[BoxLike] | Exception]
    try:
        found = _detect_all(detector, images, [frames[position] for position in decoded])
    except Exception as exc:  # noqa: BLE001 - a plugin's failure is the frames', never the worker's
        found = [exc] * len(decoded)
    del images
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    for position, boxes in zip(decoded, found, strict=True):
        results[position] = boxes if isinstance(boxes, Exception) else _detections(
            frames[position], boxes, detector.name, elapsed_ms)
    return [results[position] for position in range(len(frames))]


T = TypeVar("T")


def pixel_batches(items: Sequence[tuple[T, Frame]], max_pixels: int) -> list[list[tuple[T, Frame]]]:
    """``(anything, frame)`` pairs in order, in groups of at most ``max_pixels`` pixels together
    (a larger frame alone): a detector call holds all its decoded images, and the memory plan has
    room for one frame's (docs/operations.md, Sizing). Pixels are what the frames claim; decoding
    checks that."""
    batches: list[list[tuple[T, Frame]]] = []
    pixels = 0
    for item in items:
        frame_pixels = item[1].width * item[1].height
        if not batches or pixels + frame_pixels > max_pixels:
            batches.append([])
            pixels = 0
        batches[-1].append(item)
        pixels += frame_pixels
    return batches


def _detect_all(detector: Detector, images: list[np.ndarray], frames: list[Frame]) -> list[Sequence[BoxLike]]:
    if not images:
        return []
    batch = getattr(detector, "detect_batch", None)
    if batch is not None:
        return batch(images, [(frame.source_width or frame.width) / (frame.source_height or frame.height)
                              for frame in frames])
    return [detector.detect(image, frame.id) for image, frame in zip(images, frames, strict=True)]


def _detections(frame: Frame, found: Sequence[BoxLike], detector_name: str, latency_ms: float) -> Detections:
    """The boxes found on a scaled frame, in the pixels of its original."""
    width = frame.source_width or frame.width
    height = frame.source_height or frame.height
    scale_x, scale_y = width / frame.width, height / frame.height
    boxes = tuple(box for box in (_to_original(raw, scale_x, scale_y, width, height) for raw in found)
                  if box is not None)
    return Detections(frame.id, boxes, detector_name, latency_ms, width, height)


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


# The longest a frame waits for others to share its detector call: a small part of a frame
# interval at 15 fps. Frames already waiting fill a batch at once.
BATCH_WAIT_S = 0.01


def register(stage: Stage) -> None:
    """Faust agent: ``frames.scaled`` -> ``detections``, detection on the pixel thread.

    The agent takes what is buffered, up to ``STREAMAPP_INFER_BATCH`` frames, so a detector that
    batches runs bigger batches exactly when it is behind. A detector that raises (a plugin's
    bug, a frame it cannot handle) costs those frames a dead letter, never the worker.
    """
    detector = load_detector(stage.settings.detector, stage.settings)
    latency = stage.metrics.histogram("infer_latency_seconds", INFER_LATENCY_BOUNDS)
    stage.metrics.declare("infer_frames_in_total", "infer_results_total", "infer_batches_total",
                          "infer_over_pixel_budget_total")

    commit = stage.batch_commit("infer", stage.topics.scaled)

    @stage.app.agent(stage.topics.scaled, name="infer")
    async def infer(stream):
        async for events in acked_when_done(stream.take_events(stage.settings.infer_batch, within=BATCH_WAIT_S)):
            async with commit(events):
                await _infer_events(stage, detector, latency, events)


async def _infer_events(stage, detector: Detector, latency, events) -> None:
    settings = stage.settings
    stage.metrics.inc("infer_frames_in_total", len(events))
    readable = []
    for event in events:
        try:
            readable.append((event, wire.decode_frame(event.value, max_frame_bytes=settings.max_frame_bytes)))
        except wire.WireError as exc:
            await stage.dead_letters.send(event, stage="infer", reason=str(exc))
    for batch in pixel_batches(readable, settings.frame_pixel_limit):
        results = await stage.offload(infer_frames, [scaled for _, scaled in batch], detector)
        stage.metrics.inc("infer_batches_total")
        for (event, scaled), result in zip(batch, results, strict=True):
            await _send_result(stage, detector, latency, event, scaled, result)


async def _send_result(stage, detector: Detector, latency, event, scaled: Frame,
                       result: Detections | Exception) -> None:
    settings, topics = stage.settings, stage.topics
    if isinstance(result, Exception):
        if isinstance(result, CorruptFrame):
            await stage.dead_letters.refuse(event, stage="infer", error=result)
        else:
            await stage.dead_letters.send(event, stage="infer", reason=f"{detector.name}: {result!r}")
        return
    latency.observe(result.latency_ms / 1000)
    if await stage.dead_letters.emit(event, stage="infer", topic=topics.detections,
                                     key=scaled.id.bucket_key(settings.bucket_size),
                                     value=wire.encode_detections(result),
                                     timestamp=event.message.timestamp):
        stage.metrics.inc("infer_results_total")
