"""Scenario transforms as pure functions on record streams, their specs, and the predicted outcome."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
from pathlib import Path

import pytest

from streamapp import wire
from streamapp.cli.main import main
from streamapp.settings import Settings
from streamapp.tools.replay.format import Record, RecordingWriter
from streamapp.tools.replay.predict import predict
from streamapp.tools.replay.publish import ReplayTarget, _PartitionCounts
from streamapp.tools.replay.scenario import ReplayPlan, Scenario
from streamapp.tools.replay.transforms import ReplayError, frame_id, interleave, parse_transform, side_of

SCENARIOS = Path(__file__).parents[1] / "replay" / "scenarios"
START = 1_800_000_000_000


def frame_record(stream: str, index: int, at_ms: int, epoch: int = START) -> Record:
    frame_id = wire.FrameId(stream, epoch, index)
    frame = wire.Frame(frame_id, START + index * 100, 8, 8, b"\xff\xd8" + bytes([index % 256]) * 10)
    return Record("frames", 0, index, at_ms, frame_id.bucket_key(900), wire.encode_frame(frame))


def result_record(stream: str, index: int, at_ms: int, epoch: int = START) -> Record:
    frame_id = wire.FrameId(stream, epoch, index)
    detections = wire.Detections(frame_id, (wire.Box("red", 0.9, 1, 1, 2, 2),), "color", 1.0, 8, 8)
    return Record("detections", 0, index, at_ms, frame_id.bucket_key(900), wire.encode_detections(detections))


def pairs(count: int, stream: str = "cam1", latency_ms: int = 50) -> list[Record]:
    records = []
    for index in range(count):
        records += [frame_record(stream, index, index * 100), result_record(stream, index, index * 100 + latency_ms)]
    return records


def run(spec: str, records: list[Record], seed: int = 1) -> list[Record]:
    return list(parse_transform(spec, seed=seed, position=0, bucket_size=900)(iter(records)))


def ids(records, side=None):
    return [wire.decode(r.value).id for r in records if side is None or side_of(r) == side]


def test_reorder_moves_no_record_further_than_its_window_and_keeps_the_times():
    records = pairs(200)
    shuffled = run("reorder:10", records)
    position = {id(record.value): at for at, record in enumerate(records)}
    moves = [abs(position[id(record.value)] - at) for at, record in enumerate(shuffled)]
    assert sorted(r.value for r in shuffled) == sorted(r.value for r in records)
    assert max(moves) <= 10 and sum(1 for move in moves if move) > 100
    assert [r.timestamp_ms for r in shuffled] == [r.timestamp_ms for r in records]


def test_the_same_seed_gives_the_same_stream_and_another_seed_another():
    records = pairs(100)
    assert run("reorder:5", records, seed=3) == run("reorder:5", records, seed=3)
    assert run("reorder:5", records, seed=3) != run("reorder:5", records, seed=4)


def test_drop_loses_only_its_side():
    kept = run("drop:results:0.3", pairs(500))
    assert len(ids(kept, "frames")) == 500
    assert 100 < 500 - len(ids(kept, "results")) < 200


def test_duplicate_repeats_records_of_its_side_right_after_them():
    doubled = run("duplicate:frames:0.5", pairs(200))
    counts = collections.Counter(r.value for r in doubled)
    repeated = [value for value, count in counts.items() if count == 2]
    assert 50 < len(repeated) < 150 and max(counts.values()) == 2
    assert all(side_of(Record("t", 0, 0, 0, None, value)) == "frames" for value in repeated)
    assert all(doubled[i + 1].value == doubled[i].value for i in range(len(doubled) - 1)
               if counts[doubled[i].value] == 2 and doubled[i - 1].value != doubled[i].value)


def test_delay_moves_one_side_later_and_keeps_the_stream_in_time_order():
    delayed = run("delay:frames:1s", pairs(50))
    assert [r.timestamp_ms for r in delayed] == sorted(r.timestamp_ms for r in delayed)
    frame_times = [r.timestamp_ms for r in delayed if side_of(r) == "frames"]
    assert frame_times == [index * 100 + 1000 for index in range(50)]
    # Each result now comes before its frame.
    assert ids(delayed)[:10] == [wire.FrameId("cam1", START, index) for index in range(10)]
    assert all(side_of(r) == "results" for r in delayed[:10])


def test_stall_silences_one_side_for_a_while_and_resumes_with_live_data():
    stalled = run("stall:results:1s:2s", pairs(50))
    results = {frame_id.index for frame_id in ids(stalled, "results")}
    assert results == set(range(10)) | set(range(30, 50))
    assert len(ids(stalled, "frames")) == 50


def test_restart_gives_later_frames_a_new_epoch_counting_from_zero():
    restarted = run("restart:20", pairs(30))
    frame_ids = ids(restarted, "frames")
    assert frame_ids[:20] == [wire.FrameId("cam1", START, index) for index in range(20)]
    assert frame_ids[20:] == [wire.FrameId("cam1", START + 20, index) for index in range(10)]
    moved = [r for r in restarted if wire.decode(r.value).id.epoch != START]
    assert all(r.key == wire.decode(r.value).id.bucket_key(900) and r.partition is None for r in moved)
    assert ids(restarted, "results") == frame_ids


def test_skew_sets_each_cameras_clock_off_its_frames_and_results_together():
    records = pairs(100, stream="cam-a") + pairs(100, stream="cam-b")
    skewed = list(run("skew:60s", records))
    offsets = {}
    for before, after in zip(records, skewed, strict=True):
        stream = frame_id(before).stream
        offsets.setdefault(stream, set()).add(after.event_time_ms - before.timestamp_ms)
        if side_of(before) == "frames":
            moved = wire.decode_frame(after.value).timestamp_ms - wire.decode_frame(before.value).timestamp_ms
            assert moved == after.event_time_ms - before.timestamp_ms
    assert all(len(shifts) == 1 for shifts in offsets.values())  # one clock per camera
    assert all(-60_000 <= shift <= 60_000 for [shift] in offsets.values())
    assert offsets["cam-a"] != offsets["cam-b"]
    # Only the event time moves: when each record is sent, its key and partition stay.
    assert ([(r.key, r.partition, r.timestamp_ms) for r in skewed]
            == [(r.key, r.partition, r.timestamp_ms) for r in records])


def test_records_that_are_not_frames_or_results_pass_untouched():
    other = Record("logs", 0, 0, 50, b"k", b"not a streamapp record")
    for spec in ("reorder:3", "drop:both:1", "duplicate:both:1", "delay:both:1s", "stall:both:0s:1h",
                 "restart:1", "skew:1s"):
        assert run(spec, [other]) == [other]


def test_interleave_merges_recordings_by_time_from_a_common_start():
    first = [frame_record("cam1", index, 5_000 + index * 100) for index in range(5)]
    second = [frame_record("cam2", index, 90_000 + index * 100 + 50) for index in range(5)]
    merged = list(interleave([first, second]))
    assert [wire.decode(r.value).id.stream for r in merged] == ["cam1", "cam2"] * 5
    assert [r.timestamp_ms for r in merged] == sorted(r.timestamp_ms for r in merged)
    assert [r.timestamp_ms for r in merged[:4]] == [5_000, 5_000, 5_100, 5_100]


@pytest.mark.parametrize("spec, message", [
    ("shuffle:3", "unknown transform"),
    ("drop:results", "takes 2 argument"),
    ("drop:sideways:0.1", "side must be one of"),
    ("drop:frames:1.5", "fraction must be a number within 0..1"),
    ("reorder:-2", "not a whole number"),
    ("delay:frames:10", "unit"),
])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ReplayError, match=message):
        parse_transform(spec, seed=0, position=0, bucket_size=900)


def test_predict_follows_the_joins_decision_on_the_replay_clock():
    settings = Settings(join_ttl_s=2.0, sweep_interval_s=0.5, done_marker_ttl_s=10.0)
    records = pairs(10)
    records += [result_record("cam1", 10, 1_000), frame_record("cam1", 11, 1_100),
                result_record("cam1", 11, 4_000), frame_record("cam1", 0, 4_100)]
    prediction = predict(sorted(records, key=lambda r: r.timestamp_ms), settings, speed=1.0)
    assert prediction.counts == {"frames_in": 12, "results_in": 12, "joined": 10, "unmatched_frames": 1,
                                 "orphan_results": 1, "late_results": 1, "duplicates": 1, "unreadable_entries": 0}
    assert prediction.unmatched == {wire.FrameId("cam1", START, 11)}
    # Twice the speed halves the wait: the late result of frame 11 now makes it.
    faster = predict(sorted(records, key=lambda r: r.timestamp_ms), settings, speed=2.0)
    assert faster.counts["joined"] == 11 and faster.counts["late_results"] == 0


@pytest.mark.parametrize("path", sorted(SCENARIOS.rglob("*.json")), ids=lambda path: path.stem)
def test_scenario_files_expect_what_the_join_decides_for_their_records(path):
    scenario = Scenario.load(path)
    settings = scenario.settings(Settings())
    plan = ReplayPlan(scenario.recordings, scenario.transforms, seed=scenario.seed, speed=scenario.speed,
                      settings=settings)
    counts = predict(plan.records(), settings, speed=plan.speed).counts
    assert scenario.expect == {"frames": counts["frames_in"], "results": counts["results_in"],
                               "joined": counts["joined"], "unmatched": counts["unmatched_frames"],
                               "orphan": counts["orphan_results"], "late": counts["late_results"],
                               "duplicates": counts["duplicates"]}


def test_recorded_partitions_are_kept_only_where_the_target_has_as_many():
    class Producer:
        async def partitions_for(self, topic):
            return {"same": {0, 1, 2, 3}, "more": set(range(8))}[topic]

    target = ReplayTarget({}, {"frames": 4})
    counts = _PartitionCounts(Producer(), target)
    record = frame_record("cam1", 0, 0)
    assert asyncio.run(counts.partition(record, "same")) == 0
    with pytest.raises(ReplayError, match="recorded with 4 partitions but 'more' has 8"):
        asyncio.run(counts.partition(record, "more"))
    by_key = _PartitionCounts(Producer(), ReplayTarget({}, {"frames": 4}, by_key=True))
    assert asyncio.run(by_key.partition(record, "more")) is None


def test_replay_reports_bad_input_without_a_traceback(tmp_path, capsys):
    assert main(["replay"]) == 1
    assert "no recording given" in capsys.readouterr().err
    broken = tmp_path / "broken.rec"
    broken.write_bytes(b"SAREC")
    assert main(["replay", str(broken)]) == 1
    assert "not a streamapp recording" in capsys.readouterr().err
    good = tmp_path / "good.rec"
    with RecordingWriter(good, {"frames": 4}) as writer:
        writer.write_all(pairs(2))
    assert main(["replay", str(good), "--transform", "shuffle:2"]) == 1
    assert "unknown transform 'shuffle:2'" in capsys.readouterr().err
    assert main(["replay", str(good), "--speed", "0"]) == 2
    assert main(["replay", str(good), "--rename", "frames"]) == 2
    bad_scenario = tmp_path / "s.json"
    bad_scenario.write_text(json.dumps({"transforms": []}))
    assert main(["replay", "--scenario", str(bad_scenario)]) == 1
    assert "not a scenario file" in capsys.readouterr().err


def test_malformed_frames_pass_every_transform_untouched():
    valid = frame_record("cam1", 0, 0)
    broken = dataclasses.replace(valid, value=valid.value.replace(b'"index":0', b'"index":-'))
    assert side_of(broken) is None
    for spec in ("restart:1", "skew:1s", "drop:both:1", "delay:both:1s"):
        assert run(spec, [broken]) == [broken]
    assert predict([broken], Settings(), speed=1.0).counts["frames_in"] == 0
