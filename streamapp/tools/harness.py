"""One harness for everything that runs the pipeline as processes: a broker, one worker process
per stage, publishers of frames, and readers of ``joined``.

The demo, ``bench chaos``, ``bench soak``, ``bench join``, ``bench disk`` and the tests that run workers are all
built from these pieces, so they start, feed, read and stop the pipeline the same way. Loads and
publishers produce as :func:`streamapp.cli.publisher.producer_config` says; readers of the
output consume as :func:`output_consumer` says. (The systems that ``bench join`` measures, the
plain copy and the naive baseline, keep their own tuning: it is part of what is measured.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
import urllib.error
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamapp import wire
from streamapp.agents.source import synthetic_frames
from streamapp.cli.publisher import FramePublisher, synthetic_streams
from streamapp.kafkasecurity import client_options
from streamapp.settings import STAGES, Settings
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.common import Notify
from streamapp.tools.localkafka.locations import default_data_dir
from streamapp.tools.localkafka.processes import free_port, port_in_use
from streamapp.tools.localkafka.security import BrokerSecurity
from streamapp.tools.workers import Worker
from streamapp.topicadmin import ensure_topics
from streamapp.topics import max_record_bytes, topic_names
from streamapp.wire import new_epoch

POLL_S = 0.25
READY_TIMEOUT_S = 120.0

# --- the broker -------------------------------------------------------------------------------


def ensure_broker(settings: Settings, port: int, data_dir: Path | None = None) -> tuple[LocalBroker | None, Settings]:
    """Use a broker already listening on ``port``; otherwise start a local one there (the caller
    then owns it and stops it). Returns the broker started, if any, and ``settings`` pointed at it,
    by the host STREAMAPP_BROKER names (a TLS broker's certificate may name only ``localhost``)."""
    host = settings.bootstrap_servers.split(",")[0].rpartition(":")[0] or "127.0.0.1"
    address = settings.replace(broker=f"kafka://{host}:{port}")
    if port_in_use(port):
        return None, address
    broker = LocalBroker(data_dir or default_data_dir(port), port)
    broker.start()
    return broker, address


def own_broker(data_dir: Path, *, notify: Notify | None = None, timeout_s: float = 120.0,
               security: BrokerSecurity | None = None) -> LocalBroker:
    """A local broker of its own on a free port, data in ``data_dir``, started (SASL_SSL with
    ``security``)."""
    broker = LocalBroker(data_dir, free_port(), notify=notify, security=security)
    broker.start(timeout=timeout_s)
    return broker


async def delete_topics(settings: Settings) -> None:
    """The topics of ``settings``'s prefix: a run on a broker it did not start leaves it as it was."""
    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    try:
        mine = [name for name in await admin.list_topics() if name.startswith(settings.topic_prefix)]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


# --- the workers ------------------------------------------------------------------------------


class Pipeline:
    """One worker process per stage on one broker; a stage can be killed and started again as
    the same worker: same data dir, same web port (so the same static group member).

    The first start of a stage logs to ``<out>/logs/<stage>.log``; with ``restart_logs`` every
    start logs to its own ``<out>/logs/<stage>-NN/``, so a killed worker's log is kept."""

    def __init__(self, settings: Settings, out: Path, *, restart_logs: bool = True) -> None:
        self.settings = settings
        self.out = out
        self.restart_logs = restart_logs
        self.workers: dict[str, Worker] = {}
        self.starts: Counter = Counter()
        self.web_ports: dict[str, int] = {}

    def stage_settings(self, stage: str) -> Settings:
        web_port = self.web_ports.setdefault(stage, free_port())
        return self.settings.replace(stages=(stage,), web_port=web_port, data_dir=self.data_dir(stage))

    def data_dir(self, stage: str) -> Path:
        return self.out / ".data" / stage

    def start(self, stage: str) -> Worker:
        self.starts[stage] += 1
        log_dir = self.out / "logs"
        if self.restart_logs:
            log_dir = log_dir / f"{stage}-{self.starts[stage]:02d}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.workers[stage] = Worker(stage, self.stage_settings(stage), log_dir)
        return self.workers[stage]

    def start_all(self, stages: Iterable[str] = STAGES, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Create the topics, start a worker per stage and wait until every one is ready."""
        asyncio.run(ensure_topics(self.settings))
        for stage in stages:
            self.start(stage)
        if asyncio.run(wait_for(self.ready, timeout_s)) is None:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for the workers to be ready")

    def ready(self) -> bool:
        return all(worker.ready() for worker in self.workers.values())

    def kill(self, stage: str, *, wipe_store: bool = False) -> None:
        self.workers[stage].kill()
        if wipe_store:
            shutil.rmtree(self.data_dir(stage), ignore_errors=True)

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()

    def exited(self) -> set[str]:
        """Stages whose current worker ended although nobody killed it."""
        return {stage for stage, worker in self.workers.items() if worker.process.poll() is not None}


def processed(worker: Worker) -> float:
    """Records this process has handled so far: the sum of its stage's counters."""
    try:
        stats = worker.stats()
    except (OSError, urllib.error.URLError, ValueError):
        return 0.0  # the web server is not up yet
    prefix = f"{worker.stage}_"
    return sum(value for name, value in stats.items() if name.startswith(prefix) and name.endswith("_total"))


async def wait_for(condition: Callable[[], object], timeout_s: float) -> float | None:
    """Seconds until ``condition()`` held, or None after the timeout."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if condition():
            return time.monotonic() - began
        await asyncio.sleep(POLL_S)
    return None


# --- publishing -------------------------------------------------------------------------------

class SteadyCameras:
    """Publishes ``count`` endless synthetic cameras of a new epoch, each at ``fps``, until
    :attr:`stopping` is set; remembers every id sent."""

    def __init__(self, settings: Settings, count: int, width: int, height: int, fps: float) -> None:
        self.settings = settings
        self.count, self.width, self.height, self.fps = count, width, height, fps
        self.produced: set[wire.FrameId] = set()
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        streams = synthetic_streams(self.count, self.width, self.height, frames=None, fps=self.fps, epoch=new_epoch())
        async with FramePublisher(self.settings) as publisher:
            await publisher.play(streams, self.fps, stopping=self.stopping,
                                 on_frame=lambda frame, truth: self.produced.add(frame.id))


async def publish_frames(settings: Settings, stream: str, count: int, *, seed: int,
                         size: tuple[int, int] = (160, 120)) -> list[wire.FrameId]:
    """Publish ``count`` small synthetic frames of a new epoch of ``stream``, unpaced; their ids."""
    ids: list[wire.FrameId] = []
    async with FramePublisher(settings) as publisher:
        await publisher.play([synthetic_frames(stream, new_epoch(), count, *size, seed=seed)], None,
                             on_frame=lambda frame, truth: ids.append(frame.id))
    return ids


# --- reading the output -----------------------------------------------------------------------


def output_consumer(settings: Settings, *topics: str, **overrides) -> AIOKafkaConsumer:
    """A consumer of the pipeline's output as a downstream reader sees it: from the earliest
    record, records up to the frame limit, no group offsets committed (unless ``overrides``)."""
    config = dict(**client_options(settings), auto_offset_reset="earliest",
                  enable_auto_commit=False, max_partition_fetch_bytes=max_record_bytes(settings))
    return AIOKafkaConsumer(*topics, **{**config, **overrides})


async def follow(settings: Settings, topic: str, on_records: Callable[[list], None], *,
                 poll_ms: int = 500, **overrides) -> None:
    """Hand what each poll of ``topic`` (from its start) brings, if anything, to ``on_records``,
    until cancelled (the consumer as :func:`output_consumer` makes it, with ``overrides``)."""
    consumer = output_consumer(settings, topic, **overrides)
    await consumer.start()
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=poll_ms)
            if batches:
                on_records([record for records in batches.values() for record in records])
    finally:
        await consumer.stop()


async def read_joined_until(settings: Settings, expected: int, timeout_s: float,
                            on_joined: Callable[[wire.Joined], None]) -> int:
    """Hand every record of ``joined`` (from its start) to ``on_joined`` until ``expected``
    distinct frames are out and a further second brings nothing (a repeat would show there), or
    ``timeout_s``. Returns the distinct frames seen."""
    consumer = output_consumer(settings, topic_names(settings)["joined"])
    await consumer.start()
    frames: set[wire.FrameId] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for record in records:
                    joined = wire.decode_joined(record.value)
                    frames.add(joined.frame.id)
                    on_joined(joined)
            if len(frames) >= expected and not batches:
                break
    finally:
        await consumer.stop()
    return len(frames)


async def read_topic(settings: Settings, topic: str, partitions: int) -> list:
    """Every record of ``topic``, from the beginning to its end when called, as a downstream
    consumer sees it (records of aborted transactions left out)."""
    consumer = output_consumer(settings, isolation_level="read_committed")
    await consumer.start()
    records = []
    try:
        assigned = [TopicPartition(topic, number) for number in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records


@dataclasses.dataclass
class JoinedTopic:
    """What the ``joined`` topic holds: copies per frame and the outcomes each frame got."""

    copies: Counter = dataclasses.field(default_factory=Counter)
    outcomes: dict = dataclasses.field(default_factory=dict)

    def add(self, joined: wire.Joined) -> None:
        frame_id = joined.frame.id
        self.copies[frame_id] += 1
        self.outcomes.setdefault(frame_id, set()).add("joined" if joined.matched else "unmatched")


async def read_joined(settings: Settings) -> JoinedTopic:
    """All of ``joined`` as it stands now."""
    contents = JoinedTopic()
    for record in await read_topic(settings, topic_names(settings)["joined"], settings.partitions):
        contents.add(wire.decode_joined(record.value))
    return contents
