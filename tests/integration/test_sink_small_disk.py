"""A sink whose disk holds less than its budget (STREAMAPP_SINK_DISK_BUDGET per stream plus the
open video segment) does not pause for good once the disk is full (it used to: nothing deleted
its files while it waited): when the reserve runs short, it closes its open segment and deletes
its oldest files, counted, until the reserve and a segment are free, and goes on. On a real 8 MiB
file system."""

import asyncio
import shutil

import pytest

from streamapp.settings import Settings
from streamapp.sinkfiles import frame_path, last_index, video_segments
from streamapp.tools.harness import Pipeline, publish_frames, wait_for

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
        try:
            return pipeline.workers["sink"].stats()
        except OSError:
            return {}

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
