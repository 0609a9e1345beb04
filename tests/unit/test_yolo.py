"""YOLOv3-tiny through OpenCV DNN on real footage (vtest.avi), as the infer stage runs it."""

import dataclasses
import itertools

import pytest

from streamapp.agents.infer import DetectorError, YoloDetector, infer_frame, infer_frames, load_detector
from streamapp.agents.resize import resize_frame
from streamapp.agents.source import video_file_frames
from streamapp.imaging import CorruptFrame
from streamapp.settings import Settings

pytestmark = pytest.mark.slow  # the real model on real footage


@pytest.fixture(scope="module")
def detector(model_files):
    return YoloDetector()


@pytest.fixture(scope="module")
def vtest_frames(sample_videos):
    """Every 40th frame of vtest.avi, scaled as the resize stage does by default."""
    frames = video_file_frames(sample_videos["vtest.avi"], "vtest", 1)
    return [resize_frame(frame, 320, 240) for frame in itertools.islice(frames, 0, None, 40)]


def test_yolo_finds_the_pedestrians_of_vtest(detector, vtest_frames):
    results = [infer_frame(frame, detector) for frame in vtest_frames]
    persons = [sum(box.label == "person" for box in result.boxes) for result in results]
    assert all(count >= 1 for count in persons), persons
    assert sum(persons) / len(persons) >= 3  # the street has 4-8 people in most frames
    for result in results:
        assert (result.frame_width, result.frame_height) == (768, 576)
        for box in result.boxes:
            assert 0.25 <= box.score <= 1
            assert 0 <= box.x < box.x + box.w <= 768 and 0 <= box.y < box.y + box.h <= 576
            if box.label == "person":
                assert box.h > box.w  # upright pedestrians


def test_a_batch_gives_each_frame_what_it_gets_alone(detector, vtest_frames):
    alone = [infer_frame(frame, detector).boxes for frame in vtest_frames[:4]]
    assert [result.boxes for result in infer_frames(vtest_frames[:4], detector)] == alone
    assert len(set(alone)) == 4  # four different frames, four different answers


def test_an_undecodable_frame_fails_alone_in_its_batch(detector, vtest_frames):
    broken = dataclasses.replace(vtest_frames[1], jpeg=vtest_frames[1].jpeg[:200])
    results = infer_frames([vtest_frames[0], broken, vtest_frames[2]], detector)
    assert isinstance(results[1], CorruptFrame)
    assert results[0].boxes == infer_frame(vtest_frames[0], detector).boxes
    assert results[2].boxes == infer_frame(vtest_frames[2], detector).boxes


def test_settings_configure_the_detector(model_files, vtest_frames):
    settings = Settings(detector="yolo", yolo_input=320, yolo_confidence=0.5, yolo_classes=("car",))
    detector = load_detector("yolo", settings)
    assert (detector.input_size, detector.confidence) == (320, 0.5)
    boxes = [box for frame in vtest_frames for box in infer_frame(frame, detector).boxes]
    assert boxes and {box.label for box in boxes} == {"car"}  # cars are parked along the street
    assert min(box.score for box in boxes) >= 0.5


def test_an_unknown_class_names_the_setting(model_files):
    with pytest.raises(DetectorError, match="STREAMAPP_YOLO_CLASSES: 'persn' not among the COCO classes"):
        YoloDetector(classes=("person", "persn"))


def test_missing_model_files_say_how_to_fetch_them(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMAPP_ASSETS_HOME", str(tmp_path))
    with pytest.raises(DetectorError, match="detector 'yolo': .*missing; run `streamapp model`"):
        load_detector("yolo", Settings(detector="yolo"))
