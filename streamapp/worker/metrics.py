"""Counters, gauges and histograms of one worker process: one registry, two views.

:meth:`Metrics.snapshot` is the registry's state as Prometheus samples (``name`` or
``name{label="value"}`` -> value). The worker serves it as JSON on ``/streamapp/stats/``, and
``/metrics`` serves :attr:`Metrics.registry`: a ``prometheus_client`` registry of this app alone
(tests build several apps in one process) that reads the same samples through
:class:`ProjectCollector`, beside the standard process, gc and platform collectors and Faust's
Prometheus sensor (:func:`streamapp.kafka.monitor.faust_monitor`).

Counters count outcomes (every record ends in exactly one) and end in ``_total``; gauges are read
when asked, from providers registered by the stages (join state, RocksDB, consumer lag) plus the
process itself (RSS, gc); histograms are named in seconds and built here.
"""

from __future__ import annotations

import gc
import re
import resource
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from faust.exceptions import ConsumerNotStarted
from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from streamapp.samples import Histogram, family_of, parse_sample, sample_name

GaugeProvider = Callable[[], Mapping[str, float]]
PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
# Families of the snapshot that the standard process collector serves on /metrics under the same
# name and type; the JSON page keeps them.
STANDARD_FAMILIES = frozenset({"process_resident_memory_bytes"})

# One line per metric family: the Prometheus HELP text, and the table in docs/operations.md.
HELP: dict[str, str] = {
    "resize_frames_in_total": "Frames the resize stage consumed.",
    "resize_frames_out_total": "Scaled frames the resize stage produced.",
    "infer_frames_in_total": "Scaled frames the infer stage consumed.",
    "infer_results_total": "Detection results the infer stage produced.",
    "infer_batches_total": "Detector calls of the infer stage; frames per call = frames in / this.",
    "infer_latency_seconds": "Detector time per frame, as reported in each result (a batch's whole call).",
    "join_frames_in_total": "Original frames the join consumed.",
    "join_results_in_total": "Detection results the join consumed.",
    "join_joined_total": "Frames emitted with their result.",
    "join_unmatched_frames_total": "Frames emitted without a result, once it could no longer arrive within the TTL.",
    "join_orphan_results_total": "Results dropped because their frame could no longer arrive within the TTL.",
    "join_late_results_total": "Results dropped because their frame had already left unmatched.",
    "join_duplicates_total": "Repeated frames or results dropped at the join.",
    "join_unreadable_entries_total": "Stored join entries dropped because the join could not read their record.",
    "join_latency_seconds": "Time the first side of a key waited in the join window for the other.",
    "join_state_entries": "Entries in the join window (pending sides and done markers).",
    "join_state_bytes": "Bytes of the entries in the join window.",
    "join_pending_entries": "Frames and results waiting for their other side.",
    "outputs_in_flight_records": "Joined frames of the join's batches handed to the producer and not yet acknowledged.",
    "outputs_in_flight_bytes": "Bytes of those outputs.",
    "outputs_acked_total": "Joined frames of the join's batches the broker acknowledged.",
    "transactions_committed_total":
        "Kafka transactions committed under exactly-once: one per open input partition per commit interval.",
    "join_uncommitted_bytes": "Bytes of join window changes held in open transactions until they commit.",
    "join_uncommitted_commits_at_bound_total": "Open transactions committed early, at their byte bound.",
    "join_pairs_completed_in_batch_total": "Pairs whose two sides met in one batch: their payloads never stored.",
    "join_pending_bytes": "Bytes of the frames and results waiting for their other side.",
    "join_oldest_pending_age_seconds": "How long the oldest waiting frame or result has waited.",
    "join_next_expiry_seconds": "Time until the next entry of the join window is due.",
    "join_input_partitions_paused": "Join input partitions paused for reading more than a TTL ahead of their partner.",
    "join_held_bytes": "Bytes of join input records held back for their partner, to be decided in one batch with it.",
    "join_held_let_go_over_bound_total":
        "Records let go without their partner because the held records reached their byte bound.",
    "join_changelog_records_skipped_total":
        "Join changelog records recovery skipped: malformed, of an entry format this version does not read, or "
        "holding a record the join cannot read.",
    "join_changelog_records_upgraded_total":
        "Join changelog records in the entry format before its version byte, read as the current one.",
    "join_changelog_deadlines_cut_total":
        "Restored join entries whose deadline lay beyond the markers' TTL from now, brought forward to it.",
    "join_recovery_failures_total": "Times a batch of join changelog records could not be written to the store.",
    "join_recovery_failure_active": "1 while the join's changelog recovery cannot write to its store (not ready).",
    "join_input_pauses_total": "Times a join input partition was paused for being ahead of its partner.",
    "rocksdb_disk_bytes": "Bytes of the join window's RocksDB files on disk.",
    "rocksdb_memory_bytes": "Bytes of RocksDB's shared block cache and memtables.",
    "sink_records_in_total": "Joined records the sink consumed.",
    "sink_frames_written_total": "Annotated frames the sink wrote.",
    "sink_duplicates_total": "Joined records the sink skipped because the frame was already written.",
    "sink_videos_active": "Stream runs whose video the sink is assembling.",
    "sink_videos_finished_early_total": "Stream runs whose video was finished early, as the most runs were assembled.",
    "sink_video_failures_total": "Stream runs whose video could not be created; their frames are still written.",
    "sink_disk_budget_bytes": "STREAMAPP_SINK_DISK_BUDGET: bytes of frames and video segments kept, all streams.",
    "sink_disk_bytes": "Bytes of frames and closed video segments the sink keeps, all streams.",
    "sink_retention_deleted_files_total": "Oldest frame and video files the sink deleted to stay in its budget.",
    "sink_retention_deleted_bytes_total": "Bytes of the files the sink deleted to stay in its budget.",
    "sink_disk_full_pauses_total": "Times the sink paused because its disk was full.",
    "sink_disk_full_deleted_files_total": "Oldest files the sink deleted because its disk filled before its budget.",
    "sink_disk_full_deleted_bytes_total": "Bytes of the files the sink deleted as its disk filled before its budget.",
    "sink_disk_full_paused": "1 while the sink waits for disk space, else 0.",
    "preview_streams": "Streams whose latest annotated frame the preview holds.",
    "preview_bytes": "Bytes of the annotated frames the preview holds.",
    "preview_streams_evicted_total": "Streams dropped from the preview to stay within its byte budget.",
    "resize_dead_lettered_total": "Records the resize stage sent to the dead-letter topic.",
    "infer_dead_lettered_total": "Records the infer stage sent to the dead-letter topic.",
    "join_dead_lettered_total": "Records the join sent to the dead-letter topic.",
    "sink_dead_lettered_total": "Records the sink sent to the dead-letter topic.",
    "resize_over_pixel_budget_total": "Frames resize dead-lettered unread: their decoding would not fit the limit.",
    "infer_over_pixel_budget_total": "Frames infer dead-lettered unread: their decoding would not fit the limit.",
    "sink_over_pixel_budget_total": "Frames the sink dead-lettered unread: their decoding would not fit the limit.",
    "kafka_consumer_lag_records": "Records in a partition after the worker's last committed offset.",
    "kafka_consumer_assigned_partitions": "Partitions of a topic assigned to this worker.",
    "kafka_consumer_fetch_paused_partitions": "Assigned partitions of a topic the fetcher does not fetch.",
    "kafka_consumer_deleted_unread_records_total": "Input records retention deleted before this worker read them.",
    "process_peak_resident_memory_bytes": "Highest resident memory of the worker so far.",
    "memory_budget_used_ratio": "Resident memory as a fraction of the memory budget.",
    "gc_collections_total": "Collections by Python's cyclic garbage collector, all generations.",
    "gc_seconds_total": "Time spent in Python's cyclic garbage collector.",
    "gc_frozen_objects": "Objects the worker froze once started: full collections skip them.",
    "producer_key_hash_memo_bytes": "Bytes of keys whose partition hash the producer remembers.",
    "producer_key_hash_memo_resets_total": "Times the producer's key hash memo was full and forgot every key.",
    "budget_budget_bytes": "The worker's memory budget (STREAMAPP_MEMORY_BUDGET).",
    "budget_rocksdb_bytes": "Share of the budget for RocksDB's block cache and memtables.",
    "budget_stream_buffer_bytes": "Byte limit of each stream buffer.",
    "budget_fetch_bytes_per_partition": "Bytes the consumer asks for per partition per fetch.",
    "budget_producer_batch_bytes": "Largest producer batch per partition.",
    "budget_send_buffer_bytes": "Bytes that may wait in the producer's send buffer.",
    "budget_batch_bytes": "Largest batch of records the join decides at once.",
    "budget_decoded_frame_bytes": "Memory a pixel stage's decoded frame may take (6 bytes a pixel of the limit).",
    "budget_recovery_records": "Changelog records the join reads before applying them while it recovers.",
    "budget_planned_bytes": "Every share of the memory plan together: at most nine tenths of the budget.",
    "stream_buffer_bytes": "Bytes waiting in the stream buffers between the consumer and the agents.",
    "budget_stream_buffer_pauses_total": "Partitions paused because a stream buffer was full (backpressure).",
    "budget_dropped_records_total": "Buffered records dropped to stay in budget (drop-oldest only).",
    "budget_dropped_bytes_total": "Bytes of the buffered records dropped to stay in budget.",
    "disk_budget_bytes": "Bytes the join window may take on disk (STREAMAPP_DISK_BUDGET).",
    "disk_early_expired_total": "Join entries expired before their deadline to stay within the disk budget.",
    "disk_full_pauses_total": "Times the join paused because the disk was full.",
    "disk_full_paused": "1 while the join waits for disk space, else 0.",
    "worker_ready": "1 while every readiness condition of the worker holds (/readyz answers 200), else 0.",
}


class Metrics:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.histograms: dict[str, Histogram] = {}
        self._providers: list[GaugeProvider] = []
        self._gc_seconds = 0.0
        self._gc_started = 0.0
        gc.callbacks.append(self._time_gc)
        self.registry = CollectorRegistry()
        self.registry.register(ProjectCollector(self))
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def inc(self, name: str, amount: int = 1) -> None:
        self.counters[name] += amount

    def declare(self, *names: str) -> None:
        """Counters shown at 0 before their first event, so rates and alerts see them from start."""
        for name in names:
            self.counters.setdefault(name, 0)

    def add_gauges(self, provider: GaugeProvider) -> None:
        self._providers.append(provider)

    def histogram(self, family: str, bounds: Sequence[float]) -> Histogram:
        histogram = self.histograms[family] = Histogram(bounds)
        return histogram

    def scalar_samples(self) -> dict[str, float]:
        """Counters and gauges: the snapshot without the histograms."""
        values: dict[str, float] = dict(self.counters)
        values.update(process_gauges())
        values["gc_seconds_total"] = round(self._gc_seconds, 6)
        for provider in self._providers:
            values.update(provider())
        return values

    def snapshot(self) -> dict[str, float]:
        values = self.scalar_samples()
        for family, histogram in self.histograms.items():
            values.update(histogram.samples(family))
        return values

    def prometheus_text(self) -> str:
        return generate_latest(self.registry).decode()

    def _time_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_seconds += time.perf_counter() - self._gc_started


class ProjectCollector:
    """The project's own samples as ``prometheus_client`` families, read at each scrape: a family
    ending in ``_total`` is a counter, a histogram is one of :attr:`Metrics.histograms`, the rest
    are gauges; help comes from :data:`HELP` (empty for a family missing there)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        families: dict[str, list[tuple[dict[str, str], float]]] = {}
        for sample, value in self._metrics.scalar_samples().items():
            family, labels = parse_sample(sample)
            if family not in STANDARD_FAMILIES:
                families.setdefault(family, []).append((labels, value))
        for family, samples in sorted(families.items()):
            yield _scalar_family(family, samples)
        for family, histogram in sorted(self._metrics.histograms.items()):
            yield _histogram_family(family, histogram)


def _scalar_family(family: str, samples: list[tuple[dict[str, str], float]]) -> Metric:
    kind = CounterMetricFamily if family.endswith("_total") else GaugeMetricFamily
    label_names = list(samples[0][0])
    metric = kind(family, HELP.get(family, ""), labels=label_names)
    for labels, value in samples:
        metric.add_metric([labels[name] for name in label_names], value)
    return metric


def _histogram_family(family: str, histogram: Histogram) -> Metric:
    samples = histogram.samples(family)
    buckets = [(parse_sample(sample)[1]["le"], count) for sample, count in samples.items()
               if family_of(sample) == f"{family}_bucket"]
    return HistogramMetricFamily(family, HELP.get(family, ""), buckets=buckets, sum_value=samples[f"{family}_sum"])


def rss_bytes() -> int:
    """Resident set size now (not the peak), from /proc."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes(status: str | None = None) -> int:
    """This process's own peak resident set size: ``VmHWM`` of /proc/self/status (or of the
    ``status`` text given). Not ``ru_maxrss``: Linux carries that across fork and exec, so a worker
    started by a large process would report its parent's peak."""
    if status is None:
        with open("/proc/self/status") as file:
            status = file.read()
    match = re.search(r"^VmHWM:\s*(\d+)\s*kB$", status, re.MULTILINE)
    if match is None:
        raise ValueError("no VmHWM line in the process status")
    return int(match.group(1)) * 1024


def process_gauges() -> dict[str, float]:
    return {
        "process_resident_memory_bytes": rss_bytes(),
        "process_peak_resident_memory_bytes": peak_rss_bytes(),
        "gc_collections_total": sum(generation["collections"] for generation in gc.get_stats()),
    }


def memory_budget_gauges(budget_bytes: int) -> dict[str, float]:
    return {"memory_budget_used_ratio": round(rss_bytes() / budget_bytes, 4)}


def consumer_gauges(app) -> dict[str, float]:
    """Partitions assigned to this worker per topic (and those its fetcher is paused on), and the
    lag of each: log end offset minus the offset this worker last committed.

    Lag appears from a partition's first commit on (Faust's monitor records commits); the end
    offset is the high watermark of the consumer's latest fetch.
    """
    consumer = app.consumer
    committed = app.monitor.tp_committed_offsets
    values: dict[str, float] = {}
    try:
        assigned = consumer.assignment()
    except ConsumerNotStarted:
        return values
    for topic, count in sorted(Counter(tp.topic for tp in assigned).items()):
        values[sample_name("kafka_consumer_assigned_partitions", topic=topic)] = count
    for topic, count in sorted(Counter(tp.topic for tp in consumer.fetch_paused()).items()):
        values[sample_name("kafka_consumer_fetch_paused_partitions", topic=topic)] = count
    for tp in sorted(assigned):
        end, position = consumer.highwater(tp), committed.get(tp)
        if end is not None and position is not None:
            values[sample_name("kafka_consumer_lag_records", topic=tp.topic, partition=tp.partition)] = \
                max(0, end - position)
    return values
