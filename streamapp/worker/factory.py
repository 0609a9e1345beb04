"""The app factory: the Faust app of the stages named in STREAMAPP_STAGES, each loaded by name from
streamapp.agents and handed a :class:`~streamapp.worker.stage.Stage`.

One function builds the app for any set of stages, so every stage can run alone (and scale on its
own consumer group) or all together in one process. Settings come from the environment
(streamapp.settings); buffer sizes are derived from the byte budgets there, never left at Faust's
message-count defaults.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import NoReturn, cast

from faust.types.settings import Settings as FaustSettings

from streamapp import opencv, topicadmin, topics as topic_defs
from streamapp.errors import StreamappError, one_line
from streamapp.kafka import client as kafkaclient, consumer
from streamapp.kafka.app import KafkaApp, PromptTableManager
from streamapp.kafka.buffers import ByteBoundedQueue
from streamapp.kafka.monitor import faust_monitor
from streamapp.kafka.producer import ByteSendBuffer, KeyPartitioner
from streamapp.kafka.transactions import Transactions
from streamapp.kafkasecurity import broker_credentials
from streamapp.memoryplan import MemoryPlan
from streamapp.settings import EXACTLY_ONCE, HEARTBEAT_INTERVAL_S, Settings
from streamapp.tables.window import STORE_URL
from streamapp.worker import health, logs, webport
from streamapp.worker.budget import OverloadCounts, memory_plan
from streamapp.worker.deadletter import DeadLetters
from streamapp.worker.metrics import (
    PROMETHEUS_CONTENT_TYPE,
    Metrics,
    consumer_gauges,
    memory_budget_gauges,
)
from streamapp.worker.outbox import OutputThread
from streamapp.worker.stage import AppTopics, Stage

log = logging.getLogger(__name__)


class StreamApp(KafkaApp):
    """A Faust app that creates and checks its topics before it consumes anything, and whose
    buffers are limited in bytes by its memory plan."""

    streamapp_settings: Settings
    memory_plan: MemoryPlan
    dropped: OverloadCounts
    stream_buffers: list[ByteBoundedQueue]
    # The stages' transactions under exactly-once; None at least once.
    transactions: Transactions | None = None
    # Counted once, when frozen: each count walks every frozen object ("A gauge that walked the heap").
    frozen_objects = 0

    @property
    def in_transaction(self) -> bool:
        """Faust's exactly-once (its consumer reads read_committed, its recovery steps over
        transaction markers), with streamapp's transactions. Faust asks whether the worker has
        started, and its consumer asks once, when it is made: the join makes it as it registers,
        before the worker starts, so under Faust's answer the join never read committed."""
        return self.transactions is not None

    async def on_first_start(self) -> None:
        settings = self.streamapp_settings
        # Here, not in create_app: the consumer is made after this, and the worker's
        # --web-port (part of the name) is known only now.
        # Faust types this setting str, though None (its default) is dynamic membership.
        self.conf.consumer_group_instance_id = settings.group_instance_id(  # type: ignore[assignment]
            str(self.conf.canonical_url))
        try:
            created = await topicadmin.ensure_topics(settings, layouts=[settings.stages], group=True)
        except StreamappError as exc:
            # Before any stream or table has started: nothing to flush, so no shutdown to wait for.
            exit_with(exc)
        if created:
            log.info("created topics: %s", ", ".join(created))
        self._log_what_is_not_used()
        cast(ByteSendBuffer, self.producer.buffer).limit_bytes(self.memory_plan.send_buffer_bytes)
        await super().on_first_start()

    def _log_what_is_not_used(self) -> None:
        """One line each: Faust's own environment variables that are set and ignored, and the
        routes a port beyond loopback without a token does not serve."""
        ignored = faust_variables(os.environ)
        if ignored:
            log.warning("ignoring %s: Faust's own settings, which a worker takes only from STREAMAPP_* "
                        "variables (docs/operations.md, Settings)", ", ".join(ignored))
        if webport.private_routes_off(self.conf.web_bind, self.streamapp_settings.web_token):
            log.warning("%s", webport.private_routes_note(self.conf.web_bind))

    async def on_started(self) -> None:
        await super().on_started()
        # What the worker built to start (modules, Faust's services, the tables) lives as long as
        # it does. Frozen, a full collection no longer walks it, and its pause, one every few seconds
        # under load, no longer takes most of a live join's p99 latency budget (docs/benchmarks.md).
        gc.collect()
        gc.freeze()
        self.frozen_objects = gc.get_freeze_count()

    def FlowControlQueue(self, maxsize: int | None = None, *, clear_on_resume: bool = False) -> ByteBoundedQueue:
        queue = ByteBoundedQueue(self.memory_plan.stream_buffer_bytes, policy=self.streamapp_settings.overload,
                                 dropped=self.dropped, current_generation=lambda: self.consumer_generation_id,
                                 flow_control=self.flow_control,
                                 clear_on_resume=clear_on_resume)
        self.stream_buffers.append(queue)
        return queue

    def budget_gauges(self) -> dict[str, float]:
        return {**self.memory_plan.as_metrics(), **self.dropped.as_metrics(),
                "stream_buffer_bytes": sum(queue.bytes for queue in self.stream_buffers)}


# A poll moves records the consumer has already fetched, so the fetch limits bound its bytes. Each
# poll is two hand-overs between the consumer's thread and the loop, so fewer records a poll
# drained a backlog slower (docs/benchmarks.md, "One change was kept").
POLL_RECORDS = 1000


def faust_variables(env: Mapping[str, str]) -> list[str]:
    """The environment variables of Faust's settings that ``env`` sets."""
    return sorted(param.env_name for param in FaustSettings.SETTINGS.values()
                  if param.env_name is not None and param.env_name in env)


def create_app(settings: Settings | None = None) -> StreamApp:
    settings = settings or Settings.from_env()
    settings.check_worker()
    # Before any stage loads OpenCV, which reads its limit once.
    opencv.use_pixel_limit(settings.frame_pixel_limit)
    kafkaclient.install()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    plan = memory_plan(settings)
    partitioner = KeyPartitioner(plan.key_hash_memo_bytes)
    app = StreamApp(
        settings.group_id,
        broker=settings.broker,
        broker_credentials=broker_credentials(settings.security),
        store=STORE_URL,
        datadir=str(settings.data_dir),
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        web_transport="tcp://",
        web_application_options={"middlewares": [webport.guard(settings.web_token, lambda: app.conf.web_bind)]},
        # Faust's own routes off: its tables would show the join's waiting frames (R21).
        web_router_enabled=False, web_tables_enabled=False, web_graph_enabled=False, web_stats_enabled=False,
        web_metrics_enabled=False,
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=settings.partitions,
        topic_disable_leader=True,
        # Every topic, the join's changelog included, is made (or verified, for a user who may not
        # create topics) by on_first_start; Faust would try to create the changelog again.
        topic_allow_declare=False,
        # None: a join standby doubles changelog reads and disk.
        table_standby_replicas=0,
        topic_replication_factor=settings.replication_factor,
        broker_max_poll_records=POLL_RECORDS,
        consumer_max_fetch_size=plan.fetch_bytes_per_partition,
        producer_max_request_size=topic_defs.max_record_bytes(settings),
        producer_max_batch_size=plan.producer_batch_bytes,
        producer_partitioner=partitioner,
        stream_wait_empty=False,
        # A worker restarted within the session timeout rejoins as the same static member
        # (on_first_start) and gets its partitions back without a rebalance; one that stays
        # down loses them after it (10 s by default; Faust's default is 60 s).
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=HEARTBEAT_INTERVAL_S,
        # Every write waits for all in-sync copies (min.insync.replicas on a cluster).
        producer_acks=-1,
        # Under exactly-once, Faust's transaction manager is streamapp.kafka.transactions'.
        processing_guarantee=settings.processing_guarantee,
        TableManager=PromptTableManager,
        # Faust reads none of its own environment variables (WEB_BIND, BROKER_URL, ...): they
        # would override the settings above (R27).
        env={},
    )
    if settings.log_format == "json":
        app.conf.logging_config = logs.logging_config(",".join(settings.stages), lambda: app.conf.web_port)
    app.streamapp_settings = settings
    app.memory_plan = plan
    app.dropped = OverloadCounts()
    app.stream_buffers = []
    exactly_once = settings.processing_guarantee == EXACTLY_ONCE
    app.transactions = Transactions(app, settings.transaction_interval_s) if exactly_once else None
    metrics = Metrics()
    app.monitor = faust_monitor(metrics.registry)
    metrics.add_gauges(app.budget_gauges)
    metrics.add_gauges(lambda: {"gc_frozen_objects": app.frozen_objects})
    metrics.add_gauges(partitioner.as_metrics)
    metrics.add_gauges(lambda: memory_budget_gauges(settings.memory_budget_bytes))
    metrics.add_gauges(lambda: consumer_gauges(app))
    metrics.add_gauges(lambda: cast(consumer.StreamappConsumer, app.consumer).deleted_unread_gauges())
    metrics.declare(*(f"{name}_dead_lettered_total" for name in settings.stages))
    names = topic_defs.topic_names(settings)
    app_topics = AppTopics(**{
        role: app.topic(name, key_serializer="raw", value_serializer="raw", partitions=None)
        for role, name in names.items()
    })
    # Only the join batches its outputs; under exactly-once they join its transactions, so they
    # stay on the loop.
    output_thread = "join" in settings.stages and app.transactions is None
    stage = Stage(
        app=app,
        settings=settings,
        topics=app_topics,
        metrics=metrics,
        dead_letters=DeadLetters(app_topics.deadletter, metrics, app.transactions),
        memory=plan,
        output_thread=OutputThread(app.producer, name="outputs") if output_thread else None,
        transactions=app.transactions,
    )
    metrics.add_gauges(stage.outputs_in_flight.as_metrics)
    if app.transactions is not None:
        metrics.add_gauges(app.transactions.as_metrics)
        app.on_before_shutdown.connect(_stop_transactions)  # type: ignore[arg-type]
    health.register(app, stage.readiness, metrics)
    for name in settings.stages:
        importlib.import_module(f"streamapp.agents.{name}").register(stage)

    @app.page("/streamapp/stats/")
    async def stats(web, request):
        return web.json(metrics.snapshot())

    @app.page("/metrics")
    async def prometheus(web, request):
        # As a header: aiohttp refuses a content_type argument that names a charset.
        return web.bytes(metrics.prometheus_text().encode(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})

    return app


async def _stop_transactions(app: StreamApp, **kwargs) -> None:
    await cast(Transactions, app.transactions).stop()


def create_app_or_exit() -> StreamApp:
    """The app for ``faust -A streamapp.app``: Faust imports that module, so a bad setting is
    reported here in one line, with its exit code, instead of under Faust's import traceback."""
    try:
        return create_app()
    except StreamappError as exc:
        exit_with(exc)


def exit_with(error: StreamappError) -> NoReturn:
    """A worker that cannot start: the error's one line and its exit code, as the command's."""
    # The process's own stderr: a started Faust worker redirects sys.stderr into its log.
    print(f"streamapp: error: {one_line(error)}", file=sys.__stderr__, flush=True)
    logging.shutdown()
    os._exit(error.exit_code)

