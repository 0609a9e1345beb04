"""The sink worker's live preview in a real headless Chromium, its /metrics page (the project's
metrics, the standard collectors and Faust's sensor on one page), and what its web port shows.

A sink worker runs on the real broker, its web port protected by a token; joined records of two
streams, each with one box of a distinct colour, are published to its input. Chromium loads
/preview/?token=... (the worker answers with a cookie; the page's script polls the worker and
fetches the frames with it) and takes a screenshot, which must show both boxes' colours.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import cv2
import numpy as np
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from streamapp import wire
from streamapp.agents.sink import label_colour
from streamapp.cli.publisher import producer_config
from streamapp.imaging import encode_jpeg
from streamapp.settings import Settings
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker, wait_until
from streamapp.topicadmin import ensure_topics
from streamapp.topics import topic_names

# Labels whose box colours (BGR) appear nowhere else on the page.
STREAM_LABELS = {"cam1": "green", "cam2": "blue"}
assert {label_colour(label) for label in STREAM_LABELS.values()} == {(255, 0, 255), (0, 255, 0)}


def chromium() -> str:
    found = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if found is None:
        reason = "no chromium on PATH (.ci/run installs it: apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


def joined_record(stream: str, label: str, index: int) -> wire.Joined:
    image = np.full((240, 320, 3), 40, np.uint8)
    frame_id = wire.FrameId(stream, epoch=1_700_000_000_000, index=index)
    frame = wire.Frame(frame_id, int(time.time() * 1000), 320, 240, encode_jpeg(image))
    box = wire.Box(label, 0.9, 100, 60, 120, 100)
    return wire.Joined(frame, wire.Detections(frame_id, (box,), "test", 1.0, 320, 240))


async def publish(settings: Settings, records: list[wire.Joined]) -> None:
    producer = AIOKafkaProducer(**producer_config(settings))
    await producer.start()
    try:
        for joined in records:
            await producer.send_and_wait(topic_names(settings)["joined"], wire.encode_joined(joined),
                                         key=joined.frame.id.bucket_key(settings.bucket_size))
    finally:
        await producer.stop()


TOKEN = uuid.uuid4().hex


def get(port: int, path: str, token: str | None = TOKEN) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def status(port: int, path: str, token: str | None = TOKEN) -> int:
    try:
        get(port, path, token)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


@pytest.fixture(scope="module")
def sink_worker(kafka_bootstrap, tmp_path_factory):
    root = tmp_path_factory.mktemp("preview")
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"preview-{uuid.uuid4().hex[:8]}.",
                        stages=("sink",), web_port=free_port(), data_dir=root / "data", out_dir=root / "out",
                        web_token=TOKEN)
    asyncio.run(ensure_topics(settings))
    worker = Worker("sink", settings, root)
    try:
        wait_until(worker.ready, 120, "the sink worker to start")
        asyncio.run(publish(settings, [joined_record(stream, label, index)
                                       for index in range(3) for stream, label in STREAM_LABELS.items()]))
        wait_until(lambda: len(json.loads(get(settings.web_port, "/preview/streams.json"))["streams"]) == 2,
                 60, "the preview to hold both streams")
        yield worker
    finally:
        worker.stop()


def test_preview_page_shows_the_latest_frame_of_each_stream_with_its_boxes(sink_worker, tmp_path):
    screenshot = tmp_path / "preview.png"
    profile = tmp_path / "profile"
    result = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1400,900",
         "--virtual-time-budget=5000", f"--screenshot={screenshot}",
         f"http://127.0.0.1:{sink_worker.settings.web_port}/preview/?token={TOKEN}"],
        capture_output=True, text=True, timeout=120)
    assert screenshot.exists(), f"chromium made no screenshot:\n{result.stderr[-2000:]}"
    page = cv2.imread(str(screenshot)).astype(int)
    for stream, label in STREAM_LABELS.items():
        pixels = int(np.all(np.abs(page - label_colour(label)) < 60, axis=2).sum())
        # The box outline alone is about 2 x (120 + 100) x 2 pixels at 1:1.
        assert pixels > 500, f"{stream}: {pixels} pixels of its box colour {label_colour(label)} on the page"

    listing = json.loads(get(sink_worker.settings.web_port, "/preview/streams.json"))
    assert [(s["stream"], s["index"], s["boxes"]) for s in listing["streams"]] == [("cam1", 2, 1), ("cam2", 2, 1)]
    assert listing["counters"]["sink_frames_written_total"] == 6


def test_metrics_page_is_prometheus_text_that_agrees_with_the_stats_page(sink_worker):
    port = sink_worker.settings.web_port

    def families():
        return {family.name: family for family in text_string_to_metric_families(get(port, "/metrics").decode())}

    # Lag is known from the first commit of the consumed offsets on.
    wait_until(lambda: "kafka_consumer_lag_records" in families(), 30, "the consumer's first commit")
    families = families()
    stats = json.loads(get(port, "/streamapp/stats/"))
    # The parser names counter families without their _total suffix.
    assert families["sink_records_in"].type == "counter"
    assert families["sink_records_in"].samples[0].value == stats["sink_records_in_total"] == 6
    assert families["preview_streams"].type == "gauge"
    assert families["preview_streams"].samples[0].value == 2
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    lag = families["kafka_consumer_lag_records"].samples
    assert lag and all(sample.value == 0 for sample in lag)
    assert {sample.labels["topic"] for sample in lag} == {topic_names(sink_worker.settings)["joined"]}
    # The same page carries the standard collectors and Faust's own sensor.
    assert families["python_gc_objects_collected"].type == "counter"
    assert families["process_cpu_seconds"].samples[0].value > 0
    received = {sample.labels["topic"]: sample.value for sample in families["faust_messages_received_per_topic"].samples
                if sample.name.endswith("_total")}
    assert received == {topic_names(sink_worker.settings)["joined"]: 6}
    commits = {sample.name: sample.value for sample in families["faust_consumer_commit_latency"].samples}
    assert commits["faust_consumer_commit_latency_count"] > 0
    assert families["faust_assign_latency"].type == "histogram"
    # The scrapes of this test were seen by Faust's web sensor.
    assert any(sample.labels.get("status_code") == "200" and sample.value > 0
               for sample in families["faust_http_status_codes"].samples)


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on ``port`` (the kernel's tables, hex as it
    writes them: 0100007F is 127.0.0.1)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_the_web_port_listens_on_this_host_only_and_shows_only_the_documented_routes(sink_worker):
    port = sink_worker.settings.web_port
    assert listening_addresses(port) == {"0100007F"}
    stream = "cam1"
    documented = ["/metrics", "/streamapp/stats/", "/preview/", "/preview/streams.json", f"/preview/frame/{stream}"]
    assert [status(port, path) for path in documented] == [200] * 5
    # Faust's own routes: its tables would show the join's waiting frames.
    faust = ["/", "/table/", "/table/join/", "/router/", "/graph/", "/assignment/", "/performance/"]
    assert [status(port, path) for path in faust] == [404] * len(faust)
    assert [status(port, path, token=None) for path in documented] == [401] * 5
    assert [status(port, path, token="wrong") for path in documented] == [401] * 5
    # The health checks are exempt by name: whatever they answer, it is never 401.
    assert 401 not in [status(port, path, token=None) for path in ("/healthz", "/readyz")]
    assert TOKEN not in sink_worker.log_path.read_text()


def test_faust_s_own_variables_beside_a_worker_change_nothing(kafka_bootstrap, tmp_path, monkeypatch):
    """A join worker (its table is what Faust's /table/ would show) with Faust's own variables set
    as an operator or a platform might: it ignores them, and says so in one line."""
    faust = {"WEB_BIND": "0.0.0.0", "APP_WEB_TABLES_ENABLED": "true", "BROKER_CHECK_CRCS": "false",
             # Read, either would stop the worker: no broker there, and Kubernetes' form of a
             # Service named "web" is no port number.
             "BROKER_URL": "kafka://127.0.0.1:9", "WEB_PORT": "tcp://10.0.0.1:80"}
    for name, value in faust.items():
        monkeypatch.setenv(name, value)
    settings = Settings(broker=f"kafka://{kafka_bootstrap}", topic_prefix=f"faustenv-{uuid.uuid4().hex[:8]}.",
                        stages=("join",), web_port=free_port(), data_dir=tmp_path / "data", out_dir=tmp_path / "out",
                        web_token=TOKEN)
    worker = Worker("join", settings, tmp_path)
    try:
        wait_until(worker.ready, 120, "the join worker to start")
        port = settings.web_port
        assert listening_addresses(port) == {"0100007F"}
        tables = ["/table/", "/table/join/", "/table/join/cam1:1:0/"]
        assert [status(port, path) for path in tables] == [404] * len(tables)
        assert [status(port, path) for path in ("/readyz", "/metrics")] == [200, 200]
        [line] = [line for line in worker.log_path.read_text().splitlines() if "ignoring" in line]
        assert f"ignoring {', '.join(sorted(faust))}: Faust's own settings" in line
    finally:
        worker.stop()
