"""The join and the sink on real 64 MiB file systems that fill up (R6): both pause, say why,
resume by themselves when space returns, and afterwards every frame is accounted for and the
join's store reopens complete. The short version of the full-disk scenario."""

import asyncio
import shutil

import pytest
import rocksdict

from streamapp.settings import Settings
from streamapp.sinkfiles import frame_path, video_segments
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.store import EXPIRY_FAMILY
from streamapp.tools.harness import Pipeline, publish_frames, read_joined, wait_for

from conftest import fill_disk

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

MIB = 1024**2
BATCH = 20


class OnSmallDisk(Pipeline):
    """Workers whose stores live on ``data_disk`` (their logs stay off it)."""

    def __init__(self, settings, out, data_disk):
        super().__init__(settings, out)
        self.data_disk = data_disk

    def data_dir(self, stage):
        return self.data_disk / stage


def _stats(pipeline, stage):
    try:
        return pipeline.workers[stage].stats()
    except OSError:
        return {}


def _unmet(pipeline, stage):
    """The readiness conditions /readyz names as not met; 503 exactly when there are some."""
    status, body = pipeline.workers[stage].readiness()
    assert status == (503 if body["unmet"] else 200)
    return body["unmet"]


def _waited(condition, timeout_s=60):
    return asyncio.run(wait_for(condition, timeout_s)) is not None


def test_a_full_disk_pauses_the_join_and_the_sink_until_space_returns(kafka_bootstrap, tmp_path, unique_topic,
                                                                     small_disks):
    data_disk, out_disk = small_disks("data"), small_disks("out")
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1,
                        join_ttl_s=2.0, sweep_interval_s=0.5, done_marker_ttl_s=300.0,
                        max_frame_bytes=1 * MIB, memory_budget_bytes=64 * MIB,
                        disk_reserve_bytes=8 * MIB, sink_disk_budget_bytes=48 * MIB, out_dir=out_disk / "out")
    pipeline = OnSmallDisk(settings, tmp_path, data_disk)
    join, sink = (lambda: _stats(pipeline, "join")), (lambda: _stats(pipeline, "sink"))
    ids = []
    try:
        pipeline.start_all(("join", "sink"))

        # Running normally: frames without results leave the join unmatched and reach the sink.
        ids += asyncio.run(publish_frames(settings, "cam", BATCH, seed=1))
        assert _waited(lambda: sink().get("sink_frames_written_total") == BATCH)

        # The sink's disk fills up while frames wait in the join: the sink pauses on its write.
        ids += asyncio.run(publish_frames(settings, "cam", BATCH, seed=2))
        assert _waited(lambda: join().get("join_frames_in_total") == 2 * BATCH)
        sink_filler = fill_disk(out_disk)
        assert _waited(lambda: sink().get("sink_disk_full_paused") == 1)
        # The join's disk fills up too: it stops taking records.
        join_filler = fill_disk(data_disk)
        ids += asyncio.run(publish_frames(settings, "cam", BATCH, seed=3))
        assert _waited(lambda: join().get("disk_full_paused") == 1)
        # Paused, neither is ready, and each says why.
        assert _unmet(pipeline, "join") == ["join disk not paused"]
        assert _unmet(pipeline, "sink") == ["sink disk not paused"]
        paused_at = join().get("join_frames_in_total")
        written_while_full = sink()["sink_frames_written_total"]
        assert written_while_full < 2 * BATCH

        # Space comes back: both go on by themselves, and every frame arrives.
        join_filler.unlink()
        sink_filler.unlink()
        assert _waited(lambda: join().get("disk_full_paused") == 0 and sink().get("sink_disk_full_paused") == 0)
        assert _unmet(pipeline, "join") == _unmet(pipeline, "sink") == []
        assert _waited(lambda: sink().get("sink_frames_written_total") == 3 * BATCH, 90)
        assert join()["join_frames_in_total"] == 3 * BATCH > paused_at - 1
        assert join()["disk_full_pauses_total"] >= 1 and sink()["sink_disk_full_pauses_total"] >= 1
        assert join()["join_unmatched_frames_total"] == 3 * BATCH
    finally:
        pipeline.stop()

    # Every frame accounted for: one file each, one record each on `joined`, the video finished.
    assert all(frame_path(settings.out_dir, frame_id).exists() for frame_id in ids)
    joined = asyncio.run(read_joined(settings))
    assert set(joined.copies) == set(ids)
    epochs = {frame_id.epoch for frame_id in ids}
    segments = [segment for epoch in epochs for segment in video_segments(settings.out_dir, "cam", epoch)]
    assert len(segments) == len(epochs)
    assert not list(settings.out_dir.glob("*/*/video/*.partial.avi"))

    # The store reopens, and holds an "expired" marker for every frame.
    [partition_dir] = [path for path in (data_disk / "join").rglob("*") if (path / "CURRENT").exists()]
    options = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(str(partition_dir), options=options, column_families={EXPIRY_FAMILY: options})
    try:
        markers = {key: Entry.decode(value).kind for key, value in db.items() if key.count(b":") == 2}
    finally:
        db.close()
    assert markers == {frame_id.join_key(): EntryKind.EXPIRED for frame_id in ids}
    assert shutil.disk_usage(data_disk).free > 32 * MIB
