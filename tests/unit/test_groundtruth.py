import pytest

from streamapp.groundtruth import GroundTruthWriter, TruthBox, iou, match_boxes, read_ground_truth
from streamapp.wire import Box, FrameId


def test_iou():
    a = TruthBox("red", 0, 0, 10, 10)
    assert iou(a, a) == 1.0
    assert iou(a, TruthBox("red", 5, 0, 10, 10)) == pytest.approx(50 / 150)
    assert iou(a, TruthBox("red", 10, 0, 10, 10)) == 0.0  # touching edges do not overlap


def test_match_pairs_by_label_one_to_one():
    truth = [TruthBox("red", 0, 0, 10, 10), TruthBox("blue", 50, 50, 10, 10)]
    predicted = [Box("blue", 0.9, 51, 50, 10, 10), Box("red", 0.9, 0, 0, 10, 10)]
    match = match_boxes(predicted, truth)
    assert match.ok
    assert match.ious == (1.0, pytest.approx(90 / 110))
    assert match.mean_iou == pytest.approx((1 + 90 / 110) / 2)


def test_wrong_label_duplicates_and_low_overlap_do_not_match():
    truth = [TruthBox("red", 0, 0, 10, 10)]
    assert match_boxes([Box("blue", 1, 0, 0, 10, 10)], truth).missed == 1
    doubled = match_boxes([Box("red", 1, 0, 0, 10, 10), Box("red", 1, 1, 0, 10, 10)], truth)
    assert (doubled.missed, doubled.extra, doubled.ok) == (0, 1, False)
    far = match_boxes([Box("red", 1, 8, 8, 10, 10)], truth, threshold=0.5)
    assert (far.missed, far.extra, far.mean_iou) == (1, 1, 0.0)


def test_empty_frames():
    assert match_boxes([], []).ok and match_boxes([], []).mean_iou == 1.0
    assert not match_boxes([Box("red", 1, 0, 0, 5, 5)], []).ok


def test_ground_truth_file_round_trip(tmp_path):
    path = tmp_path / "truth" / "cam.jsonl"
    with GroundTruthWriter(path) as writer:
        writer.write(FrameId("cam", 7, 0), [TruthBox("red", 1, 2, 3, 4)])
        writer.write(FrameId("cam", 7, 1), [])
    with GroundTruthWriter(path) as writer:  # a second run appends
        writer.write(FrameId("cam", 8, 0), [TruthBox("blue", 5, 6, 7, 8)])
    assert list(read_ground_truth(path)) == [
        (FrameId("cam", 7, 0), (TruthBox("red", 1, 2, 3, 4),)),
        (FrameId("cam", 7, 1), ()),
        (FrameId("cam", 8, 0), (TruthBox("blue", 5, 6, 7, 8),)),
    ]
    first_line = path.read_text().splitlines()[0]
    assert first_line == ('{"stream":"cam","epoch":7,"index":0,'
                          '"boxes":[{"label":"red","x":1,"y":2,"w":3,"h":4}]}')


def test_reader_stops_at_a_half_written_line(tmp_path):
    path = tmp_path / "truth.jsonl"
    path.write_text('{"stream":"c","epoch":1,"index":0,"boxes":[]}\n{"stream":"c","ep')
    assert [frame_id.index for frame_id, _ in read_ground_truth(path)] == [0]
