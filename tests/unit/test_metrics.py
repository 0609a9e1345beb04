"""The metrics registry: one snapshot, served as Prometheus text (prometheus_client) that a Prometheus
parser reads back with the same values, types, labels and help beside the standard collectors and
Faust's sensor; histograms; consumer lag; metric names."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from faust.exceptions import ConsumerNotStarted
from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from faust.types import TP
from prometheus_client import CollectorRegistry, Histogram as PrometheusHistogram
from prometheus_client.parser import text_string_to_metric_families

from streamapp.agents.join import Joiner
from streamapp.kafka.monitor import faust_monitor, observe_times
from streamapp.samples import Histogram, family_of, parse_sample, sample_name
from streamapp.wire import Detections, Frame, FrameId, encode_detections
from streamapp.worker.metrics import (
    HELP,
    STANDARD_FAMILIES,
    Metrics,
    consumer_gauges,
    peak_rss_bytes,
)


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


def registry_with_project_metrics() -> Metrics:
    metrics = Metrics()
    metrics.inc("join_joined_total", 3)
    metrics.declare("join_dead_lettered_total")
    metrics.add_gauges(lambda: {"join_pending_entries": 7,
                                sample_name("kafka_consumer_lag_records", topic="frames", partition=2): 11})
    metrics.histogram("join_latency_seconds", [0.5, 1.0]).observe(0.75)
    return metrics


def test_metrics_page_reads_back_with_the_snapshot_values_types_labels_and_help():
    metrics = registry_with_project_metrics()
    snapshot = metrics.snapshot()
    families = parse(metrics.prometheus_text())

    # The parser names a counter family without its _total suffix.
    assert families["join_joined"].type == "counter"
    assert families["join_joined"].documentation == HELP["join_joined_total"]
    assert [(s.name, s.value) for s in families["join_joined"].samples] == [("join_joined_total", 3)]
    assert families["join_dead_lettered"].samples[0].value == 0
    assert families["join_pending_entries"].type == "gauge"
    assert families["join_pending_entries"].documentation == HELP["join_pending_entries"]
    [lag] = families["kafka_consumer_lag_records"].samples
    assert (lag.labels, lag.value) == ({"topic": "frames", "partition": "2"}, 11)
    latency = families["join_latency_seconds"]
    assert latency.type == "histogram"
    assert [s.labels["le"] for s in latency.samples if "le" in s.labels] == ["0.5", "1", "+Inf"]
    assert {(s.name, s.labels.get("le")): s.value for s in latency.samples} == {
        ("join_latency_seconds_bucket", "0.5"): 0, ("join_latency_seconds_bucket", "1"): 1,
        ("join_latency_seconds_bucket", "+Inf"): 1, ("join_latency_seconds_sum", None): 0.75,
        ("join_latency_seconds_count", None): 1}
    def key(name: str, labels: dict) -> tuple:
        return name, tuple(sorted(labels.items()))

    parsed = {key(s.name, s.labels): s.value for family in families.values() for s in family.samples}
    # Every snapshot sample is on the page with its value; process and gc values are read again
    # at the scrape.
    own = {key(*parse_sample(name)): value for name, value in snapshot.items()
           if family_of(name) not in STANDARD_FAMILIES}
    assert own.keys() <= parsed.keys()
    steady = {name: value for name, value in own.items() if not name[0].startswith(("process_", "gc_"))}
    assert {name: parsed[name] for name in steady} == steady


def test_metrics_page_carries_the_standard_process_gc_and_platform_collectors():
    families = parse(Metrics().prometheus_text())
    assert families["process_resident_memory_bytes"].type == "gauge"
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    assert families["process_cpu_seconds"].type == "counter"
    collected = families["python_gc_objects_collected"]
    assert collected.type == "counter"
    assert {s.labels["generation"] for s in collected.samples} == {"0", "1", "2"}
    assert families["python_info"].samples[0].labels["implementation"]
    # One family per name: the project's own RSS gauge gives way to the standard collector's.
    assert len(families["process_resident_memory_bytes"].samples) == 1


def test_faust_sensor_metrics_are_on_the_same_page():
    metrics = Metrics()
    monitor = faust_monitor(metrics.registry)
    monitor.on_commit_completed(None, monitor.on_commit_initiated(None))
    monitor.on_tp_commit({TP("frames", 1): 42})
    families = parse(metrics.prometheus_text())
    commit = families["faust_consumer_commit_latency"]
    assert commit.type == "histogram"
    assert {s.name: s.value for s in commit.samples}["faust_consumer_commit_latency_count"] == 1
    [committed] = families["faust_topic_partition_offset_commited"].samples
    assert (committed.labels, committed.value) == ({"topic": "frames", "partition": "1"}, 42)
    for family in ("faust_total_rebalances", "faust_rebalance_done_latency", "faust_producer_send_latency"):
        assert family in families, family
    # The monitor still records commits for the consumer lag gauges.
    assert monitor.tp_committed_offsets == {TP("frames", 1): 42}


class _Stream:
    shortlabel = "Stream: Topic: frames|detections"

    def __init__(self) -> None:
        self.task_owner = self  # Faust keys a weak map by it


class _Message:
    time_in = None


def _feed_per_record_hooks(monitor) -> None:
    stream, message = _Stream(), _Message()
    for offset in range(3):
        for tp in (TP("frames", 1), TP("detections", 1), TP("frames", 2)):
            monitor.on_message_in(tp, offset, message)
            state = monitor.on_stream_event_in(tp, offset, stream, None)
            monitor.on_stream_event_out(tp, offset, stream, None, state)
            monitor.on_message_out(tp, offset, message)
            monitor.track_tp_end_offset(tp, offset + 10)
            sent = monitor.on_send_initiated(None, "joined", None, 1, 2)
            monitor.on_send_completed(None, sent, None)


def _faust_counts(text: str) -> dict:
    """Faust's samples but its timings (they differ from run to run) and creation times."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            if family.name.startswith("faust_") and not ("latency" in family.name or "runtime" in family.name)
            for sample in family.samples if not sample.name.endswith("_created")}


def test_faust_sensor_per_record_hooks_give_what_faust_s_own_sensor_gives():
    ours, faust_own = Metrics(), Metrics()
    _feed_per_record_hooks(faust_monitor(ours.registry))
    _feed_per_record_hooks(PrometheusMonitor(metrics=FaustMetrics.create(faust_own.registry, "faust")))
    expected = _faust_counts(faust_own.prometheus_text())
    assert expected[("faust_messages_received_per_topic_total", (("topic", "frames"),))] == 6
    stream = ("stream", "stream.topic_frames|detections.events")
    assert expected[("faust_total_events_per_stream_total", (stream,))] == 9
    assert _faust_counts(ours.prometheus_text()) == expected


class _BatchMessage:
    time_in = None

    def __init__(self, tp: TP, offset: int) -> None:
        self.tp, self.offset = tp, offset


def _feed_batch_hooks(monitor) -> None:
    """The same records as _feed_per_record_hooks, counted one batch per offset."""
    stream = _Stream()
    for offset in range(3):
        tps = (TP("frames", 1), TP("detections", 1), TP("frames", 2))
        messages = [_BatchMessage(tp, offset) for tp in tps]
        time_in = monitor.on_events_in(stream, len(messages), messages)
        monitor.on_events_out(stream, len(messages), time_in, messages)
        assert all(message.time_total is not None for message in messages)
        for tp in tps:
            monitor.track_tp_end_offset(tp, offset + 10)
            sent = monitor.on_send_initiated(None, "joined", None, 1, 2)
            monitor.on_send_completed(None, sent, None)


def test_faust_sensor_batch_hooks_count_what_its_per_record_hooks_count():
    per_record, per_batch = Metrics(), Metrics()
    record_monitor, batch_monitor = faust_monitor(per_record.registry), faust_monitor(per_batch.registry)
    _feed_per_record_hooks(record_monitor)
    _feed_batch_hooks(batch_monitor)
    assert _faust_counts(per_batch.prometheus_text()) == _faust_counts(per_record.prometheus_text())
    for name in ("messages_received_total", "messages_active", "events_total", "events_active",
                 "messages_received_by_topic", "tp_read_offsets"):
        assert getattr(batch_monitor, name) == getattr(record_monitor, name), name
    assert list(batch_monitor.events_by_stream.values()) == list(record_monitor.events_by_stream.values()) == [9]
    assert len(batch_monitor.events_runtime) == len(record_monitor.events_runtime) == 9


def test_each_metrics_has_its_own_registry():
    first, second = registry_with_project_metrics(), Metrics()
    faust_monitor(first.registry), faust_monitor(second.registry)
    second.inc("join_joined_total")
    assert parse(first.prometheus_text())["join_joined"].samples[0].value == 3
    assert parse(second.prometheus_text())["join_joined"].samples[0].value == 1


def test_a_family_missing_from_help_has_no_documentation_on_the_page():
    metrics = Metrics()
    metrics.inc("made_up_total")
    assert parse(metrics.prometheus_text())["made_up"].documentation == ""


def test_label_values_are_escaped():
    name = sample_name("x", topic='a"b\\c\nd')
    assert parse_sample(name) == ("x", {"topic": 'a"b\\c\nd'})
    metrics = Metrics()
    metrics.add_gauges(lambda: {name: 1})
    assert parse(metrics.prometheus_text())["x"].samples[0].labels == {"topic": 'a"b\\c\nd'}


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
    def __init__(self, highwaters: dict, started: bool = True, paused: frozenset = frozenset()) -> None:
        self.highwaters = highwaters
        self.started = started
        self.paused = paused

    def assignment(self):
        if not self.started:
            raise ConsumerNotStarted("not yet")
        return set(self.highwaters)

    def highwater(self, tp):
        return self.highwaters[tp]

    def fetch_paused(self):
        return set(self.paused)


class _App:
    def __init__(self, consumer: _Consumer, committed: dict) -> None:
        self.consumer = consumer
        self.monitor = type("Monitor", (), {"tp_committed_offsets": committed})()


def test_consumer_lag_is_end_offset_minus_committed_for_partitions_known_so_far():
    frames0, frames1, frames2, changelog = TP("frames", 0), TP("frames", 1), TP("frames", 2), TP("changelog", 0)
    app = _App(_Consumer({frames0: 120, frames1: 50, frames2: None, changelog: 9}, paused=frozenset({changelog})),
               {frames0: 100, frames2: 3})
    assert consumer_gauges(app) == {'kafka_consumer_assigned_partitions{topic="changelog"}': 1,
                                    'kafka_consumer_assigned_partitions{topic="frames"}': 3,
                                    'kafka_consumer_fetch_paused_partitions{topic="changelog"}': 1,
                                    'kafka_consumer_lag_records{topic="frames",partition="0"}': 20}
    assert consumer_gauges(_App(_Consumer({}, started=False), {})) == {}


@pytest.mark.parametrize("name", sorted(HELP))
def test_metric_names_follow_prometheus_conventions(name):
    assert re.fullmatch(r"[a-z][a-z0-9_]*", name)
    if name.endswith("_total"):
        return
    units = "bytes|seconds|entries|records|objects|ratio|streams|active|partition|partitions|paused|ready"
    assert re.search(rf"_({units})$", name), name


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
        [sys.executable, "-c", "from streamapp.worker.metrics import peak_rss_bytes; print(peak_rss_bytes())"],
        capture_output=True, text=True, check=True)
    del held
    assert int(child.stdout) < 128 * 1024**2, child.stdout


def test_a_value_observed_many_times_at_once_is_what_as_many_observations_give():
    once, many = CollectorRegistry(), CollectorRegistry()
    bounds = (1.0, 5.0, 10.0)
    singly = PrometheusHistogram("runtime_ms", "runtime", buckets=bounds, registry=once)
    at_once = PrometheusHistogram("runtime_ms", "runtime", buckets=bounds, registry=many)
    for amount, times in ((0.5, 3), (5.0, 7), (7.5, 1), (50.0, 4), (2.0, 0)):
        for _ in range(times):
            singly.observe(amount)
        observe_times(at_once, amount, times)

    def samples(registry):
        return {(sample.name, sample.labels.get("le")): sample.value
                for family in registry.collect() for sample in family.samples if not sample.name.endswith("_created")}

    assert samples(many) == pytest.approx(samples(once))
    assert samples(many)[("runtime_ms_bucket", "5.0")] == 10 and samples(many)[("runtime_ms_count", None)] == 15
