"""The metrics registry: one snapshot, rendered as Prometheus text that a Prometheus parser reads back
with the same values, types and help; histograms; consumer lag; every metric documented."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from faust.exceptions import ConsumerNotStarted
from faust.types import TP
from prometheus_client.parser import text_string_to_metric_families

from streamapp.agents.join import Joiner
from streamapp.metrics import (HELP, Histogram, Metrics, consumer_gauges, peak_rss_bytes, prometheus_text,
                               sample_name)
from streamapp.wire import Detections, Frame, FrameId, encode_detections

def parse(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_histogram_buckets_are_cumulative_with_sum_and_count():
    histogram = Histogram([0.1, 1.0])
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    assert histogram.samples("wait_seconds") == {
        'wait_seconds_bucket{le="0.1"}': 2,
        'wait_seconds_bucket{le="1"}': 3,
        'wait_seconds_bucket{le="+Inf"}': 4,
        "wait_seconds_sum": 3.65,
        "wait_seconds_count": 4,
    }


def test_prometheus_text_reads_back_with_the_snapshot_values_types_and_help():
    metrics = Metrics()
    metrics.inc("join_joined_total", 3)
    metrics.declare("join_dead_lettered_total")
    metrics.add_gauges(lambda: {"join_pending_entries": 7,
                                sample_name("kafka_consumer_lag_records", topic="frames", partition=2): 11})
    metrics.histogram("join_latency_seconds", [0.5, 1.0]).observe(0.75)
    snapshot = metrics.snapshot()
    families = parse(prometheus_text(snapshot, metrics.histograms))

    # The parser names a counter family without its _total suffix.
    assert families["join_joined"].type == "counter"
    assert families["join_joined"].documentation == HELP["join_joined_total"]
    assert families["join_dead_lettered"].samples[0].value == 0
    assert families["join_pending_entries"].type == "gauge"
    [lag] = families["kafka_consumer_lag_records"].samples
    assert (lag.labels, lag.value) == ({"topic": "frames", "partition": "2"}, 11)
    latency = families["join_latency_seconds"]
    assert latency.type == "histogram"
    assert [s.labels["le"] for s in latency.samples if "le" in s.labels] == ["0.5", "1", "+Inf"]
    assert {(s.name, s.labels.get("le")): s.value for s in latency.samples} == {
        ("join_latency_seconds_bucket", "0.5"): 0, ("join_latency_seconds_bucket", "1"): 1,
        ("join_latency_seconds_bucket", "+Inf"): 1, ("join_latency_seconds_sum", None): 0.75,
        ("join_latency_seconds_count", None): 1}
    parsed = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in families.values() for s in family.samples}
    assert len(parsed) == len(snapshot)
    assert parsed[("process_resident_memory_bytes", ())] == snapshot["process_resident_memory_bytes"]


def test_label_values_are_escaped():
    name = sample_name("x", topic='a"b\\c\nd')
    [family] = text_string_to_metric_families(prometheus_text({name: 1}))
    assert family.samples[0].labels == {"topic": 'a"b\\c\nd'}


def test_join_latency_is_how_long_the_first_side_waited():
    joiner = Joiner(ttl_ms=5_000, marker_ttl_ms=60_000)
    state: dict = {}
    frame_id = FrameId("cam", 1, 0)
    frame = Frame(frame_id, 1_700_000_000_000, 8, 8, b"\xff\xd8jpeg")
    result = Detections(frame_id, (), "test", 1.0, 8, 8)
    joiner.arrive(_DictState(state), result, encode_detections(result), event_ms=0, now_ms=10_000)
    joiner.arrive(_DictState(state), frame, b"frame", event_ms=0, now_ms=10_250)
    assert (joiner.latency.count, joiner.latency.sum) == (1, 0.25)


class _DictState:
    def __init__(self, entries: dict) -> None:
        self.entries = entries

    def get(self, key):
        return self.entries.get(key)

    def put(self, key, entry):
        self.entries[key] = entry


class _Consumer:
    def __init__(self, highwaters: dict, started: bool = True) -> None:
        self.highwaters = highwaters
        self.started = started

    def assignment(self):
        if not self.started:
            raise ConsumerNotStarted("not yet")
        return set(self.highwaters)

    def highwater(self, tp):
        return self.highwaters[tp]


class _App:
    def __init__(self, consumer: _Consumer, committed: dict) -> None:
        self.consumer = consumer
        self.monitor = type("Monitor", (), {"tp_committed_offsets": committed})()


def test_consumer_lag_is_end_offset_minus_committed_for_partitions_known_so_far():
    frames0, frames1, frames2 = TP("frames", 0), TP("frames", 1), TP("frames", 2)
    app = _App(_Consumer({frames0: 120, frames1: 50, frames2: None}), {frames0: 100, frames2: 3})
    assert consumer_gauges(app) == {'kafka_consumer_assigned_partitions{topic="frames"}': 3,
                                    'kafka_consumer_lag_records{topic="frames",partition="0"}': 20}
    assert consumer_gauges(_App(_Consumer({}, started=False), {})) == {}


@pytest.mark.parametrize("name", sorted(HELP))
def test_metric_names_follow_prometheus_conventions(name):
    assert re.fullmatch(r"[a-z][a-z0-9_]*", name)
    if name.endswith("_total"):
        return
    assert re.search(r"_(bytes|seconds|entries|records|ratio|streams|active|partition|partitions|paused)$", name), name


def test_peak_rss_reads_vmhwm_from_the_process_status():
    status = "Name:\tfaust\nVmPeak:\t  900000 kB\nVmHWM:\t   68608 kB\nVmRSS:\t   50000 kB\n"
    assert peak_rss_bytes(status) == 68608 * 1024
    with pytest.raises(ValueError, match="VmHWM"):
        peak_rss_bytes("Name:\tfaust\n")


def test_peak_rss_of_a_process_started_by_a_large_one_is_its_own():
    # Linux carries ru_maxrss across fork and exec: a worker started by a process that once held
    # 256 MiB would report at least that as its own peak.
    held = bytearray(256 * 1024**2)
    held[::4096] = b"x" * len(held[::4096])
    child = subprocess.run(
        [sys.executable, "-c", "from streamapp.metrics import peak_rss_bytes; print(peak_rss_bytes())"],
        capture_output=True, text=True, check=True)
    del held
    assert int(child.stdout) < 128 * 1024**2, child.stdout
