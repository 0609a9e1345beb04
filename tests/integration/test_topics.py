"""Topics on the real broker: created with their configs, and a join whose inputs disagree on
partition counts refuses to start (R9)."""

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streamapp.errors import ExitCode
from streamapp.settings import Settings
from streamapp.tools.localkafka.processes import free_port
from streamapp.topicadmin import ensure_topics
from streamapp.topics import TopicError, changelog_name, check_copartitioned, disk_plan, topic_names


def settings_for(bootstrap: str, **changes) -> Settings:
    return Settings(broker=f"kafka://{bootstrap}", topic_prefix=f"t{uuid.uuid4().hex[:8]}.", **changes)


async def topic_config(bootstrap: str, name: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
        [resource] = response.resources
        return {entry[0]: entry[1] for entry in resource[4]}
    finally:
        await admin.close()


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


def test_topics_are_created_with_the_disk_plan_and_one_frame_limit(kafka_bootstrap):
    settings = settings_for(kafka_bootstrap, max_frame_bytes=4 * 1024**2, partitions=3,
                            broker_disk_budget_bytes=6 * 1024**3)
    created = asyncio.run(ensure_topics(settings, layouts=[settings.stages]))
    assert len(created) == 6
    plan = disk_plan(settings)
    for planned in plan.topics:
        config = asyncio.run(topic_config(kafka_bootstrap, planned.name))
        assert int(config["retention.bytes"]) == planned.retention_bytes, planned.name
        assert int(config["segment.bytes"]) == planned.segment_bytes, planned.name
        assert int(config["max.message.bytes"]) == 4 * 1024**2 + 64 * 1024
    assert sum(topic.partitions for topic in plan.topics) == 3 * 5 + 1
    assert plan.total_bytes <= 6 * 1024**3
    frames = asyncio.run(topic_config(kafka_bootstrap, topic_names(settings)["frames"]))
    assert frames["cleanup.policy"] == "delete"
    changelog = asyncio.run(topic_config(kafka_bootstrap, changelog_name(settings)))
    assert changelog["cleanup.policy"] == "compact,delete"
    assert int(changelog["segment.ms"]) <= 60_000
    assert asyncio.run(ensure_topics(settings, layouts=[settings.stages])) == []


def test_topics_create_prints_the_plan_it_creates(kafka_bootstrap):
    settings = settings_for(kafka_bootstrap, partitions=2, broker_disk_budget_bytes=4 * 1024**3)
    finished = subprocess.run([sys.executable, "-m", "streamapp.cli.main", "topics", "create"],
                              env={**settings.to_env(), "PATH": str(Path(sys.executable).parent)},
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith(disk_plan(settings).describe())
    joined = topic_names(settings)["joined"]
    config = asyncio.run(topic_config(kafka_bootstrap, joined))
    assert int(config["retention.bytes"]) == disk_plan(settings).topic(joined).retention_bytes


def test_mismatched_partition_counts_are_refused_with_names_and_counts(kafka_bootstrap):
    settings = settings_for(kafka_bootstrap, partitions=4)
    asyncio.run(create_topic(kafka_bootstrap, topic_names(settings)["detections"], 2))
    with pytest.raises(TopicError) as refused:
        asyncio.run(ensure_topics(settings))
    message = str(refused.value)
    assert f"{topic_names(settings)['frames']}=4" in message
    assert f"{topic_names(settings)['detections']}=2" in message


def test_a_join_worker_refuses_to_start_on_mismatched_partitions(kafka_bootstrap, tmp_path):
    settings = settings_for(kafka_bootstrap, partitions=4, stages=("join",), data_dir=tmp_path / "data")
    asyncio.run(create_topic(kafka_bootstrap, topic_names(settings)["detections"], 2))
    faust = Path(sys.executable).with_name("faust")
    finished = subprocess.run(
        [str(faust), "-A", "streamapp.app", "worker", "-l", "info", "--web-port", str(free_port())],
        env={**settings.to_env(), "PATH": str(faust.parent)}, capture_output=True, text=True, timeout=120,
    )
    # One line (after the worker's own info log), its exit code, no traceback before it.
    assert finished.returncode == ExitCode.FAILURE, finished.stderr
    assert finished.stderr.splitlines()[-1].startswith("streamapp: error: topics that feed the join must have the "
                                                       "same number of partitions"), finished.stderr
    assert "Traceback" not in finished.stdout + finished.stderr


def test_check_copartitioned_accepts_equal_counts():
    check_copartitioned({"a": 4, "b": 4})
    with pytest.raises(TopicError):
        check_copartitioned({"a": 4, "b": 3})
