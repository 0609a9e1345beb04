"""Faust's Prometheus sensor with cheap per-record hooks and hooks per batch of events, and
prometheus_client's histogram observed many times in one step: both reach into the libraries'
private fields (docs/seams.md)."""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import MutableMapping, Sequence
from typing import Any

from faust.sensors.monitor import Monitor
from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from faust.types import TP
from prometheus_client import CollectorRegistry, Histogram as PrometheusHistogram

# Faust's sensor families are named faust_<metric> on every worker, whatever its app id.
FAUST_METRICS_PREFIX = "faust"


class LeanPrometheusMonitor(PrometheusMonitor):
    """Faust's Prometheus sensor, same families and values, with cheap per-record hooks. Faust's
    looks up each labelled child for every record (and renders a stream's label through a regex
    each time; docs/benchmarks.md, Measurements, has its cost). Here each child is
    looked up once per topic, partition or stream and kept (a few per input partition)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._labelled: dict[tuple, Any] = {}
        # Weakly, as Faust's own monitor keys streams: an agent restarted in a rebalance gets new
        # streams, and an id could be reused by one with another label.
        self._stream_events: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def _child(self, family, *labels):
        key = (id(family), *labels)
        child = self._labelled.get(key)
        if child is None:
            names = family._labelnames
            child = self._labelled[key] = family.labels(**dict(zip(names, labels, strict=True)))
        return child

    def on_message_in(self, tp: TP, offset: int, message) -> None:
        Monitor.on_message_in(self, tp, offset, message)
        metrics = self._metrics
        metrics.messages_received.inc()
        metrics.active_messages.inc()
        self._child(metrics.messages_received_per_topics, tp.topic).inc()
        self._child(metrics.messages_received_per_topics_partition, tp.topic, tp.partition).set(offset)

    def on_stream_event_in(self, tp: TP, offset: int, stream, event):
        state = Monitor.on_stream_event_in(self, tp, offset, stream, event)
        metrics = self._metrics
        metrics.total_events.inc()
        metrics.total_active_events.inc()
        self._stream_child(stream).inc()
        return state

    def on_events_in(self, stream, events: int, messages: Sequence[Any]) -> float:
        """What :meth:`on_stream_event_in` does for ``events`` events taken by ``stream`` as one
        batch (streamapp.batches), and :meth:`on_message_in` for the ``messages`` tracked among
        them, each family touched once per topic-partition. Returns the batch's time in, for
        :meth:`on_events_out`."""
        now, count, metrics = self.time(), len(messages), self._metrics
        per_tp: dict[TP, list[int]] = {}  # [records, last offset]
        for message in messages:
            message.time_in = now
            seen = per_tp.get(message.tp)
            if seen is None:
                per_tp[message.tp] = [1, message.offset]
            else:
                seen[0] += 1
                seen[1] = message.offset
        inbound = time.monotonic()
        for tp, (records, offset) in per_tp.items():
            self.messages_received_by_topic[tp.topic] += records
            self.tp_read_offsets[tp] = offset
            self.stream_inbound_time[tp] = inbound
            self._child(metrics.messages_received_per_topics, tp.topic).inc(records)
            self._child(metrics.messages_received_per_topics_partition, tp.topic, tp.partition).set(offset)
        self.messages_received_total += count
        self.messages_active += count
        self.events_total += events
        self.events_active += events
        self.events_by_stream[self._lookup(self.stream_lookup, stream)] += events
        self.events_by_task[self._lookup(self.task_lookup, stream.task_owner)] += events
        metrics.messages_received.inc(count)
        metrics.active_messages.inc(count)
        metrics.total_events.inc(events)
        metrics.total_active_events.inc(events)
        self._stream_child(stream).inc(events)
        return now

    def on_events_out(self, stream, events: int, time_in: float, finished: Sequence[Any]) -> None:
        """What :meth:`on_stream_event_out` does for ``events`` events of a batch taken at
        ``time_in``, and :meth:`on_message_out` for the ``finished`` messages (fully acked)."""
        now, metrics = self.time(), self._metrics
        runtime = now - time_in
        self.events_active -= events
        self.events_runtime.extend(itertools.repeat(runtime, min(events, self.max_avg_history)))
        metrics.total_active_events.dec(events)
        observe_times(metrics.events_runtime_latency, self.secs_to_ms(runtime), events)
        for message in finished:
            message.time_out = now
            if message.time_in is not None:
                message.time_total = now - message.time_in
        self.messages_active -= len(finished)
        metrics.active_messages.dec(len(finished))

    @staticmethod
    def _lookup(names: MutableMapping[Any, str], owner) -> str:
        """Faust's monitor renders a stream or task as a string once and keeps it."""
        name = names.get(owner)
        if name is None:
            name = names[owner] = str(owner)
        return name

    def _stream_child(self, stream):
        child = self._stream_events.get(stream)
        if child is None:
            child = self._stream_events[stream] = self._metrics.total_events_per_stream.labels(
                stream=f"stream.{self._stream_label(stream)}.events")
        return child

    def on_send_initiated(self, producer, topic: str, message, keysize: int, valsize: int):
        self._child(self._metrics.topic_messages_sent, f"topic.{topic}").inc()
        return Monitor.on_send_initiated(self, producer, topic, message, keysize, valsize)

    def track_tp_end_offset(self, tp: TP, offset: int) -> None:
        if self.tp_end_offsets.get(tp) == offset:  # Faust tells it for every record fetched
            return
        Monitor.track_tp_end_offset(self, tp, offset)
        self._child(self._metrics.topic_partition_end_offset, tp.topic, tp.partition).set(offset)


def observe_times(histogram: PrometheusHistogram, amount: float, times: int) -> None:
    """``histogram.observe(amount)`` ``times`` times, in one step: a batch's events share their
    runtime, and a call per event showed in the join worker's profile. Uses
    prometheus_client's own fields of a histogram without labels, as ``observe`` does."""
    histogram._raise_if_not_observable()
    histogram._sum.inc(amount * times)
    for bucket, bound in zip(histogram._buckets, histogram._upper_bounds, strict=True):
        if amount <= bound:
            bucket.inc(times)
            break


def faust_monitor(registry: CollectorRegistry) -> PrometheusMonitor:
    """Faust's Prometheus sensor (rebalances, commit and send latency, events, web requests) with
    its families in ``registry``. Built here rather than by ``setup_prometheus_sensors``, which
    would also serve a second page of its own."""
    return LeanPrometheusMonitor(metrics=FaustMetrics.create(registry, FAUST_METRICS_PREFIX))
