"""The preview's frame store: newest frame per stream, bounded in bytes, evictions counted."""

from streamapp.previewframes import LatestFrames
from streamapp.wire import Box, Detections, Frame, FrameId, Joined
from streamapp.worker.preview import main_counters


def joined(stream: str, index: int, boxes: int = 1, epoch: int = 1) -> Joined:
    frame_id = FrameId(stream, epoch, index)
    frame = Frame(frame_id, 1_700_000_000_000, 8, 8, b"\xff\xd8")
    detections = Detections(frame_id, tuple(Box("x", 1.0, 0, 0, 1, 1) for _ in range(boxes)), "m", 1.0, 8, 8)
    return Joined(frame, detections)


def test_keeps_the_newest_frame_of_each_stream():
    frames = LatestFrames(max_bytes=1000)
    frames.show(joined("a", 5), b"five")
    frames.show(joined("a", 3), b"three")  # an unmatched frame leaving the join a TTL late
    frames.show(joined("a", 0, epoch=2), b"new run")
    frames.show(joined("b", 1, boxes=2), b"b1")
    assert frames.get("a").jpeg == b"new run"
    assert [(s["stream"], s["index"], s["boxes"]) for s in frames.streams()] == [("a", 0, 1), ("b", 1, 2)]
    assert frames.gauges() == {"preview_streams": 2, "preview_bytes": 9, "preview_streams_evicted_total": 0}


def test_least_recently_updated_streams_are_evicted_to_stay_within_bytes():
    frames = LatestFrames(max_bytes=250)
    for stream in ("a", "b", "c"):
        frames.show(joined(stream, 0), b"x" * 100)
    assert frames.get("a") is None and frames.get("c") is not None
    frames.show(joined("b", 1), b"x" * 100)  # b becomes the most recent; c goes next
    frames.show(joined("d", 0), b"x" * 100)
    assert [s["stream"] for s in frames.streams()] == ["b", "d"]
    assert frames.gauges() == {"preview_streams": 2, "preview_bytes": 200, "preview_streams_evicted_total": 2}


def test_a_frame_larger_than_the_budget_is_not_kept():
    frames = LatestFrames(max_bytes=10)
    frames.show(joined("a", 0), b"x" * 11)
    assert frames.streams() == [] and frames.evicted == 1


def test_main_counters_are_outcome_counters_only():
    snapshot = {"sink_records_in_total": 3, "gc_collections_total": 9, "preview_bytes": 10,
                'kafka_consumer_lag_records{topic="t",partition="0"}': 1}
    assert main_counters(snapshot) == {"sink_records_in_total": 3}
