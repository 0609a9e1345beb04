"""The seams of streamapp.kafka, each with a check of what it depends on in its library.

A check looks at the library as installed: the private names a seam calls or replaces exist, take
the parameters it passes, and set the fields it reads; where a seam copies or replaces a private
function, that function's source is the one the seam was written against (its hash). A library
that moved under a seam fails its check, and :func:`require_all` refuses to start the worker with
one line naming the library, its installed version and the seam; nothing is installed silently
over a changed library. What each seam is for: docs/seams.md.

This module imports the libraries only, never the seams themselves, so that ``python -m
streamapp.kafka.seams`` can check a scratch environment's newest releases (``streamapp
check-upgrade``): it prints each seam's result as JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import json
import platform
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from importlib import import_module, metadata
from typing import Any

from streamapp.errors import SeamMovedError

# The distributions whose inside the seams reach into, as pip names them; "python" is asyncio's.
PACKAGES = ("aiokafka", "faust-streaming", "mode-streaming", "prometheus_client", "python")


class Moved(Exception):
    """What a seam depends on is not as the seam expects (the message says what differs)."""


@dataclasses.dataclass(frozen=True)
class Seam:
    name: str          # as docs/seams.md heads it
    package: str       # one of PACKAGES
    check: Callable[[], None]  # raises Moved


def installed_version(library: str) -> str:
    return platform.python_version() if library == "python" else metadata.version(library)


# --- what a check can ask of a library -----------------------------------------------------------

def _find(path: str) -> Any:
    """``module:Attr.attr`` as installed (the original function under a ``functools.wraps``)."""
    module_name, _, attrs = path.partition(":")
    try:
        found: Any = import_module(module_name)
        for attr in filter(None, attrs.split(".")):
            found = inspect.getattr_static(found, attr) if isinstance(found, type) else getattr(found, attr)
    except (ImportError, AttributeError) as exc:
        raise Moved(f"{path} is gone") from exc
    found = getattr(found, "__func__", found)  # staticmethod, classmethod
    found = found.fget if isinstance(found, property) else found
    return inspect.unwrap(found) if callable(found) else found


def source_of(path: str) -> str:
    """The source of ``path``, dedented, without trailing spaces: what its hash is taken of."""
    try:
        source = inspect.getsource(_find(path))
    except (OSError, TypeError) as exc:
        raise Moved(f"{path} has no source to check") from exc
    return "\n".join(line.rstrip() for line in textwrap.dedent(source).strip().splitlines())


def source_hash(path: str) -> str:
    return hashlib.sha256(source_of(path).encode()).hexdigest()[:16]


def same_source(path: str, expected: str) -> None:
    """The function a seam copies or replaces is the one it was written against."""
    found = source_hash(path)
    if found != expected:
        raise Moved(f"{path} changed (source hash {found}, the seam was written against {expected})")


def has(path: str, *names: str) -> None:
    """``path`` (a class or module) has each of ``names``."""
    found = _find(path)
    missing = [name for name in names if not hasattr(found, name)]
    if missing:
        raise Moved(f"{path} has no {', '.join(missing)}")


def parameters(path: str, *names: str, leading: bool = False) -> None:
    """``path`` takes exactly these parameters, in this order (``self`` included); with
    ``leading``, these first (the rest have defaults the seam leaves alone)."""
    try:
        found = tuple(inspect.signature(_find(path)).parameters)
    except (TypeError, ValueError) as exc:
        raise Moved(f"{path} has no signature to check") from exc
    if (found[:len(names)] if leading else found) != names:
        raise Moved(f"{path} takes ({', '.join(found)}), not ({', '.join(names)})")


def source_says(path: str, *snippets: str) -> None:
    """The source of ``path`` contains each snippet (spaces as they are)."""
    source = source_of(path)
    missing = [snippet for snippet in snippets if snippet not in source]
    if missing:
        raise Moved(f"{path} no longer says {' / '.join(repr(snippet) for snippet in missing)}")


def _all(*checks: Callable[[], None]) -> Callable[[], None]:
    def check() -> None:
        for one in checks:
            one()
    return check


def _module_uses_io_only_for_bytesio() -> None:
    """aiokafka.conn uses the ``io`` module for ``io.BytesIO(resp)`` only: the seam replaces the
    module's ``io`` with something that has BytesIO alone."""
    uses = set(re.findall(r"(?<![\w.])io\.(\w+)", source_of("aiokafka.conn")))
    if uses != {"BytesIO"}:
        raise Moved(f"aiokafka.conn uses io.{', io.'.join(sorted(uses))}, not io.BytesIO alone")


def _builder_fields() -> None:
    """The fields of aiokafka's Python batch builder that LeanBatchBuilder reads and sets."""
    builder_class = _find("aiokafka.record.default_records:_DefaultRecordBatchBuilderPy")
    builder = builder_class(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                            producer_epoch=-1, base_sequence=-1, batch_size=1024)
    wanted = ("_first_timestamp", "_max_timestamp", "_compression_type", "_batch_size", "_num_records",
              "_last_offset", "_buffer", "_magic", "_producer_id", "_producer_epoch", "_base_sequence")
    missing = [name for name in wanted if not hasattr(builder, name)]
    if missing:
        raise Moved(f"aiokafka's _DefaultRecordBatchBuilderPy sets no {', '.join(missing)}")


def _stream_reader_fields() -> None:
    """asyncio's StreamReader fields WholeResponseReader reads (a reader made off any loop)."""
    loop = asyncio.new_event_loop()
    try:
        reader = asyncio.StreamReader(loop=loop)
    finally:
        loop.close()
    missing = [name for name in ("_buffer", "_eof", "_exception", "_waiter") if not hasattr(reader, name)]
    if missing:
        raise Moved(f"asyncio.StreamReader sets no {', '.join(missing)}")


# --- the seams ------------------------------------------------------------------------------------

SEAMS: tuple[Seam, ...] = (
    Seam("read: responses read whole", "aiokafka", _all(
        _module_uses_io_only_for_bytesio,
        lambda: source_says("aiokafka.conn:AIOKafkaConnection.connect",
                            "reader = asyncio.StreamReader(", "self._reader, self._writer, self._protocol = "),
    )),
    # WholeResponseReader repeats the bookkeeping of readexactly and feed_data around the rest.
    Seam("read: asyncio's StreamReader buffer", "python", _all(
        lambda: same_source("asyncio:StreamReader.readexactly", "b6b86321633c3a50"),
        lambda: same_source("asyncio:StreamReader.feed_data", "c1bc9b47aa7598df"),
        lambda: same_source("asyncio:StreamReader._wait_for_data", "1d515382fce56a27"),
        lambda: same_source("asyncio:StreamReader._wakeup_waiter", "0395d4989aa6802a"),
        lambda: same_source("asyncio:StreamReader._maybe_resume_transport", "9d3e655ef6f9a2d7"),
        _stream_reader_fields,
    )),
    Seam("write: produce requests unjoined", "aiokafka", _all(
        lambda: same_source("aiokafka.conn:AIOKafkaConnection.send", "cadce008203b5aa0"),
        lambda: has("aiokafka.conn:AIOKafkaConnection", "_next_correlation_id"),
        lambda: source_says("aiokafka.conn:AIOKafkaConnection.__init__", "self._requests = ",
                            "self._request_timeout = ", "self._client_id = ", "self._versions = "),
    )),
    Seam("crc: batches built lean", "aiokafka", _all(
        lambda: source_says("aiokafka.producer.message_accumulator:BatchBuilder.__init__",
                            "DefaultRecordBatchBuilder("),
        lambda: has("aiokafka.record.default_records", "calc_crc32c", "_DefaultRecordMetadataPy"),
        lambda: same_source("aiokafka.record.default_records:_DefaultRecordBatchBuilderPy._write_header",
                            "655e03f355797c85"),
        lambda: parameters("aiokafka.record.default_records:_DefaultRecordBatchBuilderPy.append",
                           "self", "offset", "timestamp", "key", "value", "headers", leading=True),
        _builder_fields,
    )),
    Seam("crc: fetched batches checked", "aiokafka", _all(
        lambda: has("aiokafka.consumer.fetcher", "MemoryRecords"),
        lambda: source_says("aiokafka.consumer.fetcher:Fetcher._proc_fetch_request", "MemoryRecords("),
        lambda: has("aiokafka.record.memory_records:MemoryRecords", "next_batch", "has_next", "size_in_bytes"),
    )),
    Seam("consumer: fetch wait", "faust-streaming", _all(
        lambda: parameters("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._create_consumer",
                           "self", "loop"),
        lambda: source_says("aiokafka.consumer.consumer:AIOKafkaConsumer.start",
                            "fetch_max_wait_ms=self._fetch_max_wait_ms"),
    )),
    Seam("consumer: fetch loop", "faust-streaming", lambda: same_source(
        "faust.transport.consumer:Consumer._drain_messages", "6b6a22fa66e689d5")),
    Seam("consumer: rebalance and gaps", "faust-streaming", _all(
        lambda: parameters("faust.transport.consumer:Consumer._add_gap", "self", "tp", "offset_from", "offset_to"),
        lambda: has("faust.transport.consumer:Consumer", "_is_changelog_tp", "seek_to_committed", "perform_seek"),
        lambda: has("faust.transport.drivers.aiokafka:Consumer", "_new_consumer_thread"),
        lambda: source_says("faust.transport.consumer:Consumer.__init__", "self._read_offset = "),
        lambda: source_says("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread.on_start",
                            "self._consumer = "),
    )),
    Seam("handover: records to streams directly", "faust-streaming", _all(
        lambda: same_source("faust.transport.conductor:Conductor._compile_message_handler", "0d9c44f9ea20a65c"),
        lambda: source_says("faust.transport.conductor:Conductor.__init__",
                            "self._tp_index = ", "self._tp_to_callback_lock = "),
        lambda: parameters("mode.utils.queues:ThrowableQueue.put_nowait_enhanced",
                           "self", "value", "on_pressure_high", "on_pressure_drop"),
    )),
    Seam("producer: flush and send buffer", "faust-streaming", _all(
        lambda: same_source("faust.transport.drivers.aiokafka:Producer.flush", "8ea83e62fa085be0"),
        lambda: source_says("faust.transport.producer:ProducerBuffer.__post_init__", "self.pending = "),
        lambda: has("faust.transport.producer:ProducerBuffer", "max_messages", "size"),
        lambda: has("faust.transport.drivers.aiokafka:Producer", "_producer", "_transaction_producers"),
    )),
    # The byte-counted queues extend _put and _get, answer full() through qsize(), read the deque
    # _init makes, and a drop repeats task_done's count of what put_nowait counted in.
    Seam("buffers: asyncio's queue internals", "python", _all(
        lambda: same_source("asyncio:Queue._init", "13c3b22a966c558b"),
        lambda: same_source("asyncio:Queue._put", "850a6a0ad8dcd258"),
        lambda: same_source("asyncio:Queue._get", "6cbe1f3eec7d9903"),
        lambda: same_source("asyncio:Queue.full", "68397d4f1c5d1244"),
        lambda: same_source("asyncio:Queue.put_nowait", "41b41c295e65967a"),
        lambda: same_source("asyncio:Queue.get_nowait", "6aef37a819476e90"),
        lambda: same_source("asyncio:Queue.task_done", "d88fd21943367019"),
        lambda: source_says("asyncio:Queue.__init__", "self._unfinished_tasks = 0"),
    )),
    Seam("producer: aiokafka's producer", "aiokafka", _all(
        lambda: parameters("aiokafka.producer.producer:AIOKafkaProducer._serialize",
                           "self", "key", "value", "headers"),
        lambda: parameters("aiokafka.producer.producer:AIOKafkaProducer._partition",
                           "self", "topic", "partition", "key", "value", "serialized_key", "serialized_value"),
        lambda: parameters("aiokafka.client:AIOKafkaClient._wait_on_metadata", "self", "topic"),
        lambda: has("aiokafka.client:AIOKafkaClient", "force_metadata_update"),
        lambda: source_says("aiokafka.consumer.consumer:AIOKafkaConsumer.__init__", "self._client = "),
    )),
    Seam("producer: Faust's producer settings", "faust-streaming",
         lambda: has("faust.transport.drivers.aiokafka:Producer",
                     "_settings_default", "_settings_auth", "_settings_extra", "_ensure_producer")),
    Seam("buffers: stream buffers in bytes", "mode-streaming", _all(
        lambda: has("mode.utils.queues:ThrowableQueue", "_put", "_get", "clear", "in_pressure_high_state"),
        lambda: source_says("mode.utils.queues:FlowControlQueue.__init__", "self._flow_control"),
        lambda: source_says("mode.utils.queues:FlowControlQueue.put_nowait_enhanced",
                            "self.in_pressure_high_state("),
    )),
    Seam("streams: sensors and acks per batch", "faust-streaming", _all(
        lambda: source_says("faust.streams:Stream.__init__",
                            "self._on_stream_event_in = self.app.sensors.on_stream_event_in",
                            "self._on_stream_event_out = self.app.sensors.on_stream_event_out",
                            "self._on_message_out = self.app.sensors.on_message_out"),
        lambda: parameters("faust.sensors.base:SensorDelegate.on_stream_event_in",
                           "self", "tp", "offset", "stream", "event"),
        lambda: parameters("faust.sensors.base:SensorDelegate.on_stream_event_out",
                           "self", "tp", "offset", "stream", "event", "state"),
        lambda: parameters("faust.sensors.base:SensorDelegate.on_message_out", "self", "tp", "offset", "message"),
        lambda: source_says("faust.transport.consumer:Consumer.__init__", "self._unacked_messages = "),
        lambda: has("faust.types:Message", "incref", "tracked", "generation_id"),
    )),
    Seam("monitor: Faust's Prometheus sensor", "faust-streaming", _all(
        lambda: source_says("faust.sensors.prometheus:PrometheusMonitor.__init__", "self._metrics = "),
        lambda: has("faust.sensors.prometheus:PrometheusMonitor", "_stream_label"),
        lambda: parameters("faust.sensors.monitor:Monitor.on_stream_event_in",
                           "self", "tp", "offset", "stream", "event"),
    )),
    Seam("monitor: histogram observed at once", "prometheus_client", _all(
        lambda: same_source("prometheus_client.metrics:Histogram.observe", "b85548cbd469507a"),
        lambda: source_says("prometheus_client.metrics:Histogram._metric_init",
                            "self._buckets", "self._sum = "),
        lambda: source_says("prometheus_client.metrics:MetricWrapperBase.__init__", "self._labelnames = "),
    )),
    Seam("app: transport and table manager", "faust-streaming", _all(
        lambda: source_says("faust.app.base:App.transport", "self._new_transport()"),
        lambda: same_source("faust.tables.manager:TableManager.on_start", "35aa469ac19e96ab"),
    )),
    Seam("store: RocksDB store hooks", "faust-streaming", _all(
        lambda: parameters("faust.stores.rocksdb:Store._open_for_partition", "self", "partition"),
        lambda: parameters("faust.stores.rocksdb:Store._db_for_partition", "self", "partition"),
        lambda: parameters("faust.stores.rocksdb:Store._set", "self", "key", "value"),
        lambda: parameters("faust.stores.rocksdb:Store._del", "self", "key"),
        lambda: parameters("faust.stores.rocksdb:Store.apply_changelog_batch", "self", "batch", "to_key", "to_value"),
        lambda: source_says("faust.stores.rocksdb:Store.__init__", "self._dbs = "),
    )),
    Seam("transactions: one per input partition", "faust-streaming", _all(
        lambda: has("faust.transport.drivers.aiokafka:Transport", "TransactionManager"),
        lambda: has("faust.app.base:App", "in_transaction"),
        lambda: parameters("faust.transport.consumer:TransactionManager.on_rebalance",
                           "self", "assigned", "revoked", "newly_assigned"),
        lambda: parameters("faust.transport.consumer:TransactionManager.commit",
                           "self", "offsets", "start_new_transaction"),
        lambda: parameters("faust.transport.consumer:Consumer._commit", "self", "offsets"),
        lambda: parameters("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread._highwaters",
                           "self", "partitions"),
    )),
)


@dataclasses.dataclass(frozen=True)
class Result:
    seam: Seam
    moved: str | None  # what differs; None: the seam holds

    def refusal(self) -> SeamMovedError:
        library = self.seam.package
        return SeamMovedError(f"{library} {installed_version(library)} moved under the seam "
                              f"{self.seam.name!r}: {self.moved}")


def check(seams: Iterable[Seam] = SEAMS) -> list[Result]:
    results = []
    for seam in seams:
        try:
            seam.check()
            results.append(Result(seam, None))
        except Moved as exc:
            results.append(Result(seam, str(exc)))
    return results


def require_all() -> None:
    """Raise the refusal of the first seam that moved (SeamMovedError: one line, its exit code)."""
    for result in check():
        if result.moved is not None:
            raise result.refusal()


def main() -> int:
    """Each seam's result as JSON (``streamapp check-upgrade`` runs this in its scratch environment)."""
    report = {
        "versions": {library: installed_version(library) for library in PACKAGES},
        "seams": [{"name": result.seam.name, "package": result.seam.package, "moved": result.moved}
                  for result in check()],
    }
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
