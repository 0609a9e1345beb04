"""A sink whose disk holds less than its budget (STREAMAPP_SINK_DISK_BUDGET plus the open video
segments) does not pause for good once the disk is full (it used to: nothing deleted its files
while it waited): when the reserve runs short, it closes its open segment and deletes its oldest
files, counted, until the reserve and a segment are free, and goes on. Nor do stream ids a
producer makes up by the hundred take it past its budget. On real 8 MiB file systems."""

import asyncio
import shutil
from pathlib import Path

import pytest

from streamapp.agents.source import synthetic_frames
from streamapp.cli.publisher import FramePublisher
from streamapp.settings import Settings
from streamapp.sinkfiles import frame_path, last_index, video_segments
from streamapp.tools.harness import Pipeline, publish_frames, wait_for
from streamapp.wire import new_epoch

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

MIB = 1024**2
FRAMES = 160


def test_a_sink_on_a_disk_smaller_than_its_budget_makes_room_and_goes_on(kafka_bootstrap, tmp_path, unique_topic,
                                                                          small_disks):
    out_disk = small_disks("out", "8m")
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1,
                        join_ttl_s=1.0, sweep_interval_s=0.5, max_frame_bytes=1 * MIB, memory_budget_bytes=64 * MIB,
                        disk_reserve_bytes=4 * MIB, sink_disk_budget_bytes=8 * MIB, out_dir=out_disk / "out")
    pipeline = Pipeline(settings, tmp_path)

    def sink():
        return sink_stats(pipeline)

    try:
        pipeline.start_all(("join", "sink"))
        ids = asyncio.run(publish_frames(settings, "cam", FRAMES, seed=1, size=(640, 480)))
        done = asyncio.run(wait_for(lambda: sink().get("sink_frames_written_total") == FRAMES
                                    and sink().get("sink_disk_full_paused") == 0, 120))
        assert done is not None, sink()
        stats = sink()
    finally:
        pipeline.stop()

    # The disk filled up (it holds about 4 MiB beside the reserve, the frames and video take
    # more): the sink made room as it went, without a pause; the newest frames are there, and
    # the video, finished on stop, goes on to the last frame.
    assert stats["sink_disk_full_pauses_total"] == 0
    assert stats["sink_disk_full_deleted_files_total"] > 0 and stats["sink_disk_full_deleted_bytes_total"] > 0
    assert frame_path(settings.out_dir, ids[-1]).exists()
    assert last_index(video_segments(settings.out_dir, "cam", ids[-1].epoch)[-1]) == ids[-1].index
    assert not frame_path(settings.out_dir, ids[0]).exists()
    assert shutil.disk_usage(out_disk).free >= 4 * MIB - 1 * MIB


def sink_stats(pipeline: Pipeline) -> dict:
    try:
        return pipeline.workers["sink"].stats()
    except OSError:
        return {}


def disk_blocks(directory: Path) -> int:
    return sum(path.stat().st_blocks * 512 for path in directory.rglob("*") if path.is_file())


STREAMS = 400


async def one_frame_each(settings: Settings, streams: int) -> None:
    epoch = new_epoch()
    async with FramePublisher(settings) as publisher:
        await publisher.play([synthetic_frames(f"made-up-{n}", epoch, 1, 320, 240, seed=n) for n in range(streams)],
                             None)


def test_made_up_stream_ids_keep_the_sink_within_its_budget_unpaused(
        kafka_bootstrap, tmp_path, unique_topic, small_disks):
    """One frame each of 400 new streams: each stream's only file used to be kept, so the disk
    filled up with files nothing could delete, and the sink paused for good."""
    out_disk = small_disks("out", "8m")
    budget = 2 * MIB
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1,
                        join_ttl_s=1.0, sweep_interval_s=0.5, max_frame_bytes=MIB // 4, memory_budget_bytes=64 * MIB,
                        disk_reserve_bytes=4 * MIB, sink_disk_budget_bytes=budget, out_dir=out_disk / "out")
    pipeline = Pipeline(settings, tmp_path)
    peak = 0

    def written() -> bool:
        nonlocal peak
        peak = max(peak, disk_blocks(settings.out_dir))
        stats = sink_stats(pipeline)
        return stats.get("sink_frames_written_total") == STREAMS and stats.get("sink_disk_full_paused") == 0

    try:
        pipeline.start_all(("join", "sink"))
        asyncio.run(one_frame_each(settings, STREAMS))
        done = asyncio.run(wait_for(written, 90))
        stats = sink_stats(pipeline)
        assert done is not None, stats
    finally:
        pipeline.stop()

    assert stats["sink_disk_full_pauses_total"] == 0 and stats["sink_disk_full_deleted_files_total"] == 0
    assert stats["sink_disk_bytes"] <= budget and peak <= budget * 5 // 4
    assert stats["sink_retention_deleted_files_total"] > 0
    assert stats["sink_videos_finished_early_total"] > 0 and stats["sink_videos_active"] <= 128
