"""The Faust app: ``faust -A streamapp.app worker -l info`` runs the stages named in STREAMAPP_STAGES.

One module builds the app for any set of stages, so every stage can run alone (and scale on its
own consumer group) or all together in one process. Settings come from the environment
(streamapp.settings); buffer sizes are derived from the byte budgets there, never left at Faust's
message-count defaults.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import faust

from streamapp import topics as topic_defs
from streamapp.deadletter import DeadLetters
from streamapp.metrics import Metrics
from streamapp.settings import Settings
from streamapp.tables.memory import RocksMemory, shared_rocks_memory
from streamapp.tables.window import STORE_URL

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class AppTopics:
    frames: faust.TopicT
    scaled: faust.TopicT
    detections: faust.TopicT
    joined: faust.TopicT
    deadletter: faust.TopicT


@dataclasses.dataclass(frozen=True)
class Stage:
    """What a stage's ``register`` gets: the app and everything shared between stages."""

    app: faust.App
    settings: Settings
    topics: AppTopics
    metrics: Metrics
    dead_letters: DeadLetters
    rocks_memory: RocksMemory
    buffer_records: int
    # One thread for pixel work: decoded images exist one at a time (R7) and the event loop
    # stays free to heartbeat while a frame is decoded, detected or drawn.
    pixels: ThreadPoolExecutor = dataclasses.field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="pixels"))

    async def offload(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pixels, function, *args)


class StreamApp(faust.App):
    """A Faust app that creates and checks its topics before it consumes anything."""

    streamapp_settings: Settings

    async def on_first_start(self) -> None:
        settings = self.streamapp_settings
        created = await topic_defs.ensure_topics(settings, with_changelog="join" in settings.stages)
        if created:
            log.info("created topics: %s", ", ".join(created))
        await super().on_first_start()


# Faust counts its stream buffers in records. A quarter of the memory budget goes to them, sized
# for records of up to 4 MiB (a 4K JPEG is 1-3 MB). Below 32 records Faust pauses and resumes
# partitions so often that throughput drops by a third (measured), so that is the floor.
_BUFFERED_RECORD_BYTES = 4 * 1024**2
_MIN_BUFFER_RECORDS = 32


def buffer_records(settings: Settings) -> int:
    return max(_MIN_BUFFER_RECORDS, settings.memory_budget_bytes // 4 // _BUFFERED_RECORD_BYTES)


def create_app(settings: Settings | None = None) -> StreamApp:
    settings = settings or Settings.from_env()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    records = buffer_records(settings)
    record_bytes = topic_defs.max_record_bytes(settings)
    app = StreamApp(
        settings.group_id,
        broker=settings.broker,
        store=STORE_URL,
        datadir=str(settings.data_dir),
        web_port=settings.web_port,
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=settings.partitions,
        topic_disable_leader=True,
        table_standby_replicas=0,
        stream_buffer_maxsize=records,
        broker_max_poll_records=records,
        consumer_max_fetch_size=record_bytes,
        producer_max_request_size=record_bytes,
        producer_max_batch_size=min(record_bytes, 1024**2),
        stream_wait_empty=False,
        # A killed worker's partitions move on after 10 s instead of Faust's 60 s.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=2.0,
    )
    app.streamapp_settings = settings
    metrics = Metrics()
    names = topic_defs.topic_names(settings)
    app_topics = AppTopics(**{
        role: app.topic(name, key_serializer="raw", value_serializer="raw", partitions=None)
        for role, name in names.items()
    })
    stage = Stage(
        app=app,
        settings=settings,
        topics=app_topics,
        metrics=metrics,
        dead_letters=DeadLetters(app_topics.deadletter, metrics),
        rocks_memory=shared_rocks_memory(settings.memory_budget_bytes // 4),
        buffer_records=records,
    )
    for name in settings.stages:
        importlib.import_module(f"streamapp.agents.{name}").register(stage)

    @app.page("/streamapp/stats/")
    async def stats(web, request):
        return web.json(metrics.snapshot())

    return app


app = create_app()
