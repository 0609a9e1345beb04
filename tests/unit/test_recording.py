"""Recording files: every field survives, damage is an error that says where, and synthetic
recordings are keyed and partitioned as the pipeline does it."""

from __future__ import annotations

import struct

import pytest
from aiokafka.partitioner import DefaultPartitioner

from streamapp import wire
from streamapp.cli.main import main
from streamapp.settings import Settings
from streamapp.tools.replay.capture import key_partition, synthetic_records
from streamapp.tools.replay.format import Record, Recording, RecordingError, RecordingWriter
from streamapp.tools.replay.transforms import side_of

RECORDS = [
    Record("frames", 3, 17, 1_800_000_000_000, b"cam1:1:0", b"\x00\x01value", (("h", b"v"), ("empty", None))),
    Record("detections", 0, 0, 1_800_000_000_100, None, None),
    Record("other", None, -1, 5, b"", b"", (("unicode-\u00e9", b"\xff"),)),
]


def write(path, records=RECORDS, topics=None):
    with RecordingWriter(path, topics or {"frames": 4, "detections": 4, "other": 1}, note="test") as writer:
        writer.write_all(records)
    return path


def test_every_field_survives_a_round_trip(tmp_path):
    recording = Recording(write(tmp_path / "r.rec"))
    assert list(recording) == RECORDS
    assert list(recording) == RECORDS  # each iteration reads the file anew
    assert recording.header.topics == {"frames": 4, "detections": 4, "other": 1}
    assert recording.header.note == "test"


def test_an_empty_recording_has_no_records(tmp_path):
    assert list(Recording(write(tmp_path / "r.rec", []))) == []


def test_an_interrupted_recording_has_no_end_marker(tmp_path):
    path = tmp_path / "r.rec"
    with pytest.raises(KeyboardInterrupt):
        with RecordingWriter(path, {"frames": 1}) as writer:
            writer.write(RECORDS[0])
            raise KeyboardInterrupt
    with pytest.raises(RecordingError, match="ends without its end marker after 1 records"):
        list(Recording(path))


def test_a_truncated_recording_is_an_error(tmp_path):
    path = write(tmp_path / "r.rec")
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(RecordingError, match="truncated in record 2|ends without"):
        list(Recording(path))


def test_a_damaged_byte_fails_the_crc(tmp_path):
    path = write(tmp_path / "r.rec")
    data = bytearray(path.read_bytes())
    data[data.index(b"value")] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(RecordingError, match="record 0 fails its CRC-32 check"):
        list(Recording(path))


def test_a_different_file_or_version_is_refused(tmp_path):
    other = tmp_path / "photo.jpg"
    other.write_bytes(b"\xff\xd8\xff\xe0 not a recording")
    with pytest.raises(RecordingError, match="not a streamapp recording"):
        Recording(other)
    future = write(tmp_path / "r.rec")
    data = bytearray(future.read_bytes())
    data[5] = 2
    future.write_bytes(bytes(data))
    with pytest.raises(RecordingError, match="format version 2; this build reads version 1"):
        Recording(future)
    with pytest.raises(RecordingError, match="no such recording file"):
        Recording(tmp_path / "missing.rec")


def test_a_huge_length_field_is_damage_not_an_allocation(tmp_path):
    path = write(tmp_path / "r.rec", [])
    data = path.read_bytes()[:-9] + b"R" + struct.pack(">II", 2**31, 0)
    path.write_bytes(data)
    with pytest.raises(RecordingError, match="claims 2147483648 bytes"):
        list(Recording(path))


def test_synthetic_records_are_keyed_partitioned_and_timed_as_the_pipeline_does():
    settings = Settings()
    records = list(synthetic_records(settings, streams=2, frames=6, width=96, height=72, fps=10,
                                     latency_ms=150, start_ms=1_800_000_000_000))
    frames = {wire.decode(r.value).id: r for r in records if side_of(r) == "frames"}
    results = {wire.decode(r.value).id: r for r in records if side_of(r) == "results"}
    assert len(frames) == len(results) == 12 and frames.keys() == results.keys()
    for frame_id, frame in frames.items():
        result = results[frame_id]
        assert frame.key == result.key == frame_id.bucket_key(settings.bucket_size)
        assert frame.partition == result.partition == key_partition(frame.key, settings.partitions)
        assert result.timestamp_ms == frame.timestamp_ms + 150
    assert [r.timestamp_ms for r in records] == sorted(r.timestamp_ms for r in records)
    assert {frame_id.stream for frame_id in frames} == {"cam1", "cam2"}


def test_key_partition_is_the_producers_default():
    for key in (b"cam1:1800000000000:0", b"a", b"stream-x:5:12"):
        assert key_partition(key, 4) == DefaultPartitioner()(key, [0, 1, 2, 3], [0, 1, 2, 3])


def test_record_synthetic_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "cams.rec"
    assert main(["record", "--synthetic", "--streams", "1", "--frames", "3", "--size", "64x64",
                 "--out", str(out)]) == 0
    assert "recorded 6 records" in capsys.readouterr().out
    recording = Recording(out)
    assert recording.header.topics == {"frames": 4, "detections": 4}
    assert sorted(r.topic for r in recording) == ["detections"] * 3 + ["frames"] * 3


def test_synthetic_takes_no_topics(tmp_path, capsys):
    assert main(["record", "--synthetic", "--topics", "x", "--out", str(tmp_path / "r.rec")]) == 2
    assert "--synthetic takes no --topics" in capsys.readouterr().err
