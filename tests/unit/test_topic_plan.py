"""The broker disk plan: one budget split over every topic partition, refused when it cannot fit;
and the join changelogs of the stage sets the workers run."""

import pytest

from streamapp.settings import STAGES, Settings
from streamapp.topics import (
    BROKER_OWN_BYTES,
    JOIN_TABLE,
    MAX_SEGMENT_BYTES,
    TopicError,
    changelog_name,
    disk_plan,
    max_record_bytes,
    topic_specs,
)
from streamapp.worker.factory import create_app

MIB, GIB = 1024**2, 1024**3


def test_every_partition_gets_an_equal_share_and_the_plan_fits_the_budget():
    settings = Settings(partitions=4, broker_disk_budget_bytes=24 * GIB)
    plan = disk_plan(settings)
    # frames, scaled, detections, joined and the changelog with 4 partitions; dead letters with 1
    assert sorted(topic.partitions for topic in plan.topics) == [1, 4, 4, 4, 4, 4]
    partitions = sum(topic.partitions for topic in plan.topics)
    share = (24 * GIB - BROKER_OWN_BYTES) // partitions
    assert all(topic.bytes_each == share for topic in plan.topics)
    assert all(topic.segment_bytes == MAX_SEGMENT_BYTES for topic in plan.topics)
    assert plan.total_bytes <= plan.budget_bytes
    assert plan.budget_bytes - plan.total_bytes < partitions  # only the rounding is left over


def test_segments_shrink_with_the_share_but_hold_two_of_the_largest_records():
    settings = Settings(partitions=2, max_frame_bytes=1 * MIB,
                        broker_disk_budget_bytes=BROKER_OWN_BYTES + 11 * 40 * MIB)
    [topic, *_] = disk_plan(settings).topics
    assert topic.bytes_each == 40 * MIB
    assert topic.segment_bytes == 10 * MIB  # a quarter of the share
    assert topic.retention_bytes == 30 * MIB
    assert topic.segment_bytes >= 2 * max_record_bytes(settings)


def test_a_budget_that_cannot_hold_two_segments_per_partition_is_refused_in_one_line():
    settings = Settings(partitions=8, broker_disk_budget_bytes=2 * GIB)  # 16 MiB frames: 32 MiB segments
    with pytest.raises(TopicError) as refused:
        disk_plan(settings)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("STREAMAPP_BROKER_DISK_BUDGET=2.0GiB cannot hold 41 partitions")
    assert "needs at least 2.8GiB" in message


def test_the_smallest_budget_the_refusal_names_is_accepted():
    settings = Settings(partitions=8, broker_disk_budget_bytes=2 * GIB)
    needed = BROKER_OWN_BYTES + 41 * 2 * 2 * max_record_bytes(settings)
    plan = disk_plan(settings.replace(broker_disk_budget_bytes=needed))
    assert plan.total_bytes <= needed
    with pytest.raises(TopicError):
        disk_plan(settings.replace(broker_disk_budget_bytes=needed - 41))


def test_topic_configs_are_the_plan():
    settings = Settings(partitions=3, broker_disk_budget_bytes=8 * GIB)
    plan = disk_plan(settings)
    for spec in topic_specs(settings, layouts=[settings.stages]):
        planned = plan.topic(spec.name)
        assert spec.partitions == planned.partitions
        assert int(spec.config["retention.bytes"]) == planned.retention_bytes
        assert int(spec.config["segment.bytes"]) == planned.segment_bytes


def test_the_plan_prints_topic_partitions_bytes_each_and_total():
    text = disk_plan(Settings(partitions=2, broker_disk_budget_bytes=4 * GIB)).describe()
    lines = text.splitlines()
    assert lines[0].split() == ["topic", "partitions", "bytes", "each", "total"]
    assert lines[1].split()[:2] == ["frames", "2"]
    assert lines[-1].startswith("total") and lines[-1].endswith("of 4.0GiB")


def test_each_stage_set_that_runs_the_join_has_a_changelog_of_its_own():
    settings = Settings(topic_prefix="p.", partitions=3)
    layouts = [STAGES, ("join",), ("sink", "join", "infer", "resize"), ("resize", "infer"), ("join", "sink")]
    changelogs = [spec for spec in topic_specs(settings, layouts=layouts) if spec.name.endswith("-changelog")]
    assert [spec.name for spec in changelogs] == [
        "p.streamapp-all-join-changelog", "p.streamapp-join-join-changelog", "p.streamapp-join-sink-join-changelog"]
    assert all(spec.partitions == 3 and spec.feeds_join and spec.config["cleanup.policy"] == "compact,delete"
               for spec in changelogs)
    assert not any(spec.name.endswith("-changelog") for spec in topic_specs(settings))


def test_the_join_table_s_changelog_is_the_one_the_topics_are_made_with(tmp_path):
    # 256 MiB: a RocksDB pool of 64 MiB, the size the store tests give the process-wide pool.
    settings = Settings(stages=("join", "sink"), data_dir=tmp_path / "data", out_dir=tmp_path / "out",
                        memory_budget_bytes=256 * MIB, max_frame_bytes=1 * MIB)
    app = create_app(settings)
    assert app.tables[JOIN_TABLE].changelog_topic.get_topic_name() == changelog_name(settings)
