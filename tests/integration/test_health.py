"""/healthz, /readyz and JSON logs of real worker processes on the real broker: a join
worker reading a large changelog back is live but not ready until every entry is restored; with
STREAMAPP_LOG_FORMAT=json a worker's stderr is one JSON object per line, Faust's lines and ours
alike, and a warning carries its topic and partition as fields. (Not ready while paused on a full
disk: tests/integration/test_full_disk_pipeline.py.)"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from streamapp.settings import Settings
from streamapp.tools.harness import Pipeline, publish_frames, wait_for
from streamapp.tools.localkafka.processes import free_port
from streamapp.topicadmin import ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

PENDING = 120
FRAME_SIZE = (1280, 720)  # ~0.3 MB each as synthetic JPEG: a changelog of tens of MB


def _stats(pipeline: Pipeline) -> dict:
    try:
        return pipeline.workers["join"].stats()
    except OSError:
        return {}


def _poll_readiness(pipeline: Pipeline, timeout_s: float) -> list[tuple[int, list[str], float]]:
    """/readyz every few milliseconds until it answers 200: (status, unmet, entries restored)."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status, body = pipeline.workers["join"].readiness(timeout_s=2)
        except OSError:  # the web server is not up yet
            time.sleep(0.01)
            continue
        entries = _stats(pipeline).get("join_state_entries", 0) if status == 200 else -1
        seen.append((status, body["unmet"], entries))
        if status == 200:
            return seen
        time.sleep(0.005)
    raise AssertionError(f"/readyz never answered 200 in {timeout_s} s; last answers: {seen[-3:]}")


def test_a_join_worker_recovering_its_changelog_is_live_but_not_ready_until_it_has(
        kafka_bootstrap, tmp_path, unique_topic):
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1,
                        join_ttl_s=300.0, sweep_interval_s=1.0, done_marker_ttl_s=300.0)
    pipeline = Pipeline(settings, tmp_path)
    try:
        pipeline.start_all(("join",))
        join = pipeline.workers["join"]
        assert join.readiness()[0] == 200
        asyncio.run(publish_frames(settings, "cam", PENDING, seed=3, size=FRAME_SIZE))
        assert asyncio.run(wait_for(lambda: _stats(pipeline).get("join_state_entries") == PENDING, 60))

        # Killed with its store gone: everything must come back from the changelog.
        pipeline.kill("join", wipe_store=True)
        pipeline.start("join")
        seen = _poll_readiness(pipeline, 120)
        with urllib.request.urlopen(f"http://127.0.0.1:{join.settings.web_port}/healthz", timeout=5) as live:
            assert json.loads(live.read()) == {"live": True}
    finally:
        pipeline.stop()

    not_ready = [unmet for status, unmet, _ in seen if status == 503]
    assert not_ready, "the restarted worker was never seen not ready"
    assert ["tables recovered"] in not_ready, f"never seen assigned and still recovering: {not_ready[-5:]}"
    # Ready only once every pending entry is back.
    assert seen[-1] == (200, [], PENDING)


async def _publish_garbage(settings: Settings, topic: str) -> None:
    async with AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers) as producer:
        await producer.send_and_wait(topic, b"not a frame", key=b"cam:1:0")


def test_json_logs_are_one_object_per_stderr_line_for_faust_and_the_project(kafka_bootstrap, tmp_path, unique_topic):
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"{unique_topic}.", partitions=1,
                        stages=("resize",), web_port=free_port(), data_dir=tmp_path / "data", log_format="json")
    asyncio.run(ensure_topics(settings))
    faust = Path(sys.executable).with_name("faust")
    # The command line of the Kubernetes chart: --quiet leaves out Faust's banner on stdout.
    with open(tmp_path / "stdout", "wb") as stdout, open(tmp_path / "stderr", "wb") as stderr:
        worker = subprocess.Popen([str(faust), "--quiet", "-A", "streamapp.app", "worker", "-l", "info",
                                   "--web-port", str(settings.web_port)],
                                  env={**os.environ, **settings.to_env()}, stdout=stdout, stderr=stderr)
    try:
        def dead_lettered():
            url = f"http://127.0.0.1:{settings.web_port}/streamapp/stats/"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return json.loads(response.read()).get("resize_dead_lettered_total") == 1
            except OSError:
                return False

        assert asyncio.run(wait_for(lambda: b"Worker ready" in (tmp_path / "stderr").read_bytes(), 60))
        asyncio.run(_publish_garbage(settings, f"{settings.topic_prefix}frames"))
        assert asyncio.run(wait_for(dead_lettered, 30))
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)

    assert (tmp_path / "stdout").read_text() == ""
    records = [json.loads(line) for line in (tmp_path / "stderr").read_text().splitlines()]
    assert all({"time", "level", "logger", "message", "stage", "worker"} <= set(record) for record in records)
    assert {(record["stage"], record["worker"].rsplit(":", 1)[1]) for record in records} == {
        ("resize", str(settings.web_port))}
    loggers = {record["logger"] for record in records}
    assert any(name.startswith("faust.") for name in loggers) and any(name.startswith("streamapp.") for name in loggers)
    [dead_letter] = [record for record in records if record["logger"] == "streamapp.worker.deadletter"]
    assert dead_letter["level"] == "WARNING"
    assert (dead_letter["topic"], dead_letter["partition"]) == (f"{settings.topic_prefix}frames", 0)
