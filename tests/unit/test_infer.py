import dataclasses
import math

import cv2
import numpy as np
import pytest

from streamapp.agents.infer import (
    ColorContourDetector,
    DetectorError,
    HogPeopleDetector,
    MotionDetector,
    infer_frame,
    load_detector,
)
from streamapp.agents.resize import resize_frame
from streamapp.agents.source import SyntheticScene, synthetic_frames, to_frame
from streamapp.groundtruth import iou, match_boxes
from streamapp.imaging import CorruptFrame
from streamapp.wire import Frame, FrameId, decode_detections, encode_detections

NOW_MS = 1_700_000_000_000
FRAME_ID = FrameId("cam", 1, 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_color_detector_recovers_ground_truth_through_resize(seed):
    detector = ColorContourDetector()
    for frame, truth in synthetic_frames("cam", 1, 50, 640, 480, seed=seed, now_ms=NOW_MS):
        detections = infer_frame(resize_frame(frame, 320, 240), detector)
        match = match_boxes(detections.boxes, truth, threshold=0.5)
        assert match.ok, (frame.id, detections.boxes, truth)
        assert min(match.ious) >= 0.9, (frame.id, detections.boxes, truth)
        # Boxes are in original pixels and pass the wire format's own validation.
        assert (detections.frame_width, detections.frame_height) == (640, 480)
        assert decode_detections(encode_detections(detections)) == dataclasses.replace(
            detections, latency_ms=round(detections.latency_ms, 3),
            boxes=tuple(dataclasses.replace(box, score=round(box.score, 4)) for box in detections.boxes))


@dataclasses.dataclass
class RawBox:
    label: str
    score: float
    x: int
    y: int
    w: int
    h: int


class FixedDetector:
    name = "fixed"

    def __init__(self, boxes=()):
        self.boxes = list(boxes)
        self.shapes = []

    def detect(self, image, frame_id):
        self.shapes.append(image.shape)
        return self.boxes


def _scaled_frame(width=320, height=240, source=(1280, 720)) -> Frame:
    frame = to_frame(FRAME_ID, NOW_MS, np.zeros((height, width, 3), np.uint8))
    return dataclasses.replace(frame, source_width=source[0], source_height=source[1])


def test_infer_frame_maps_boxes_to_the_original_frame():
    detector = FixedDetector([RawBox("a", 0.5, 10, 20, 30, 40)])
    detections = infer_frame(_scaled_frame(), detector)
    assert detector.shapes == [(240, 320, 3)]
    box = detections.boxes[0]
    assert (box.label, box.score, box.x, box.y, box.w, box.h) == ("a", 0.5, 40, 60, 120, 120)
    assert (detections.id, detections.model, detections.frame_width, detections.frame_height) == \
        (FRAME_ID, "fixed", 1280, 720)
    assert detections.latency_ms > 0


def test_infer_frame_clips_boxes_and_scores_to_valid_values():
    detector = FixedDetector([
        RawBox("left", 2.0, -5, -5, 10, 10),  # partly outside: clipped
        RawBox("right", math.nan, 315, 230, 50, 50),  # partly outside: clipped
        RawBox("outside", 0.5, 400, 10, 10, 10),  # wholly outside: dropped
        RawBox("sliver", -1.0, 319, 239, 0, 0),  # empty, at the edge: one pixel
    ])
    detections = infer_frame(_scaled_frame(source=(640, 480)), detector)
    boxes = {box.label: (box.score, box.x, box.y, box.w, box.h) for box in detections.boxes}
    assert boxes == {"left": (1.0, 0, 0, 10, 10), "right": (0.0, 630, 460, 10, 20),
                     "sliver": (0.0, 638, 478, 1, 1)}
    encode_and_validate = decode_detections(encode_detections(detections))
    assert len(encode_and_validate.boxes) == 3


def test_infer_frame_on_an_unscaled_frame_uses_its_own_size():
    frame = to_frame(FRAME_ID, NOW_MS, np.zeros((48, 64, 3), np.uint8))
    detections = infer_frame(frame, FixedDetector([RawBox("a", 1.0, 1, 2, 3, 4)]))
    box = detections.boxes[0]
    assert (detections.frame_width, detections.frame_height, box.x, box.y, box.w, box.h) == (64, 48, 1, 2, 3, 4)


def test_infer_frame_raises_corrupt_frame():
    frame = _scaled_frame()
    with pytest.raises(CorruptFrame):
        infer_frame(dataclasses.replace(frame, jpeg=frame.jpeg[:100]), FixedDetector())


def test_motion_detector_finds_a_moving_object_after_warm_up():
    scene = SyntheticScene(320, 240, seed=4, objects=1)
    detector = MotionDetector(warmup_frames=5)
    for index in range(60):
        image, truth = scene.render(index)
        boxes = detector.detect(image, FRAME_ID)
        if index < 5:
            assert boxes == []
    assert boxes and all(box.label == "motion" for box in boxes)
    assert max(iou(box, truth[0]) for box in boxes) > 0.5


def test_motion_detector_keeps_a_bounded_number_of_stream_models():
    detector = MotionDetector(max_streams=2)
    image = np.zeros((48, 64, 3), np.uint8)
    for stream in ("a", "b", "a", "c", "d"):
        detector.detect(image, FrameId(stream, 1, 0))
        assert detector.streams <= 2
    assert detector.streams == 2


def test_motion_detector_starts_a_new_model_for_a_new_epoch():
    detector = MotionDetector(warmup_frames=1)
    image = np.zeros((48, 64, 3), np.uint8)
    detector.detect(image, FrameId("a", 1, 0))
    detector.detect(image, FrameId("a", 2, 0))
    assert detector.streams == 2


def test_opencv_still_ships_the_hog_people_detector():
    # opencv 5 moved it out of the main package; this fails loudly if an upgrade slips in.
    assert hasattr(cv2, "HOGDescriptor_getDefaultPeopleDetector")
    assert cv2.HOGDescriptor_getDefaultPeopleDetector().size > 0


def test_hog_detector_runs():
    image, _ = SyntheticScene(320, 240, seed=0).render(0)
    detector = HogPeopleDetector()
    boxes = detector.detect(image, FRAME_ID)
    assert isinstance(boxes, list)
    assert all(box.label == "person" and 0 <= box.score <= 1 for box in boxes)
    assert detector.detect(np.zeros((32, 32, 3), np.uint8), FRAME_ID) == []  # smaller than the window


@pytest.mark.parametrize("spec, kind", [("color", ColorContourDetector), ("motion", MotionDetector),
                                        ("hog", HogPeopleDetector),
                                        ("streamapp.agents.infer:MotionDetector", MotionDetector)])
def test_load_detector(spec, kind):
    assert isinstance(load_detector(spec), kind)


def test_load_detector_from_a_plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_plugin.py").write_text(
        "class Everything:\n"
        "    name = 'everything'\n"
        "    def detect(self, image, frame_id):\n"
        "        return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    detector = load_detector("my_plugin:Everything")
    assert detector.name == "everything"
    assert infer_frame(_scaled_frame(), detector).boxes == ()


@pytest.mark.parametrize("spec, message", [
    ("yolov5", "expected one of color, motion, hog, yolo"),
    ("streamapp.agents.infer", "import path"),
    ("no_such_package.detectors:Thing", "cannot import 'no_such_package.detectors'"),
    ("streamapp.agents.infer:Nothing", "has no class 'Nothing'"),
    ("streamapp.agents.infer:BUILTIN_DETECTORS", "has no class"),
    ("streamapp.wire:Box", "Box() failed"),
    ("streamapp.agents.source:SourceError", "needs a 'name'"),
])
def test_load_detector_errors_name_the_spec(spec, message):
    with pytest.raises(DetectorError) as error:
        load_detector(spec)
    assert repr(spec) in str(error.value)
    assert message in str(error.value)
