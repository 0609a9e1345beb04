"""``streamapp bench join``: four systems on one local broker and the same bytes, one after the
other — a plain aiokafka consumer→producer copy (the limit), a Kafka Streams KStream–KStream join,
a Quix Streams interval join, and this project's join worker (``faust -A streamapp.app worker``
with ``STREAMAPP_STAGES=join``). On request a fifth, the same worker over SASL_SSL (SCRAM-SHA-512):
the broker then has a SASL_SSL listener beside its PLAINTEXT one, and only that worker uses it. The
load and the output reader of every system stay on PLAINTEXT, so their TLS is not charged to the
machine the worker shares.

Each system gets fresh topics per phase and runs as its own process, so its CPU and RSS come from
/proc the same way. Phases:

* **backlog**: ``pairs`` frame/result pairs preloaded (event time spaced as if recorded live at
  ``backlog_rate``), then the system started; drain rate, CPU per pair, joined fraction, peak
  pending state and RSS from its ready moment to its last output.
* **live**: pairs published at each of ``rates`` for ``live_seconds``, rising, until a rate is not
  sustained; per rate the joined fraction, lag growth and latency (output read here − when the
  result, the later of the pair, was published).
* **drain rounds** (on request): after every system has run, ``drain_rounds`` times every system's
  backlog drain in the order given, then reversed (A B C D D C B A), so that a drift over the run
  cancels in the ratios (see :func:`.join_report.balanced_drains`).

Every record's Kafka timestamp is its frame's capture time; a result carries its frame's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.metadata
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from streamapp import wire
from streamapp.settings import EXACTLY_ONCE, Settings
from streamapp.tools.bench import copy, join_report, kstreams, quixjoin, rdkafkacopy
from streamapp.tools.bench.pairs import RESULT_LAG, Cameras, PairLoad, create_plain_topics, load_producer
from streamapp.tools.bench.report import write_json
from streamapp.tools.bench.sampler import cpu_seconds_of, directory_bytes, rss_of
from streamapp.tools.harness import delete_topics, follow, own_broker
from streamapp.tools.localkafka.common import KAFKA_VERSION
from streamapp.tools.localkafka.jars import check_java
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.localkafka.security import ADMIN, BrokerSecurity
from streamapp.tools.workers import Process, Worker, wait_until
from streamapp.topicadmin import ensure_topics
from streamapp.topics import topic_names
from streamapp.wire import new_epoch

SAMPLE_INTERVAL_S = 0.5
READY_TIMEOUT_S = 120.0
# After the TTL the join emits what it could not match; past that, silence means it is done.
QUIET_AFTER_TTL_S = 5.0
# Latencies of a step's first tenth are the system settling into the rate, not its steady state.
WARMUP_FRACTION = 0.1


SYSTEMS = ("copy", "kstreams", "quix", "streamapp")
# The plain copy on librdkafka: not run unless asked for (`--systems copy copy-librdkafka ...`).
LIBRDKAFKA_COPY_SYSTEM = "copy-librdkafka"
# The worker over TLS and SASL: not run unless asked for (`--systems ... streamapp-tls`).
TLS_SYSTEM = "streamapp-tls"
# The worker and Kafka Streams under exactly-once: not run unless asked for
# (`--systems streamapp streamapp-eos kstreams kstreams-eos`).
EOS_SYSTEM = "streamapp-eos"
KSTREAMS_EOS_SYSTEM = "kstreams-eos"
DEFAULT_RATES = (150.0, 300.0, 450.0, 600.0, 900.0, 1200.0, 1500.0, 1800.0, 2250.0, 2700.0, 3150.0, 3600.0,
                 4050.0)


@dataclasses.dataclass(frozen=True)
class JoinBenchOptions:
    pairs: int = 20_000
    rates: tuple[float, ...] = DEFAULT_RATES
    live_seconds: float = 10.0
    # Before the first step, this long at the first rate: JIT compilation, caches and connections
    # settle in every system, so the lowest rate measures the steady state.
    warmup_s: float = 5.0
    backlog_rate: float = 150.0
    # After the first rate not sustained, this many steps halving the gap to the highest rate
    # sustained: near the top the ladder moves 450 pairs/s at a time, 14 % of the rate.
    refine_steps: int = 2
    # A step not sustained is tried this many more times once the system has caught up: a host
    # stall of half a second fails a 10 s step near the top for any system.
    retries: int = 1
    ttl_s: float = 5.0
    streams: int = 1                  # cameras sharing the rate, each at rate / streams
    systems: tuple[str, ...] = SYSTEMS
    width: int = 640
    height: int = 480
    out: Path = Path("out/bench-join")
    drain_timeout_s: float = 300.0
    # With the worker over PLAINTEXT and over SASL_SSL: rounds of their drains in the order A B B A.
    tls_rounds: int = 1
    # After the runs: rounds of every system's drain in the order A B C D D C B A (0: none).
    drain_rounds: int = 0


@dataclasses.dataclass(frozen=True)
class Topics:
    prefix: str
    frames: str
    results: str
    output: str


# --------------------------------------------------------------------------------------------
# what one system put out


@dataclasses.dataclass
class Outputs:
    """A system's output as its reader here sees it, by pair index."""

    cameras: Cameras
    result_sent_at: dict[int, float]            # the load's: wall time each result went out
    frames: int = 0                             # frame records out (joined, unmatched or copied)
    outcomes: dict[int, bool] = dataclasses.field(default_factory=dict)   # index -> joined
    latencies: dict[int, float] = dataclasses.field(default_factory=dict)
    last_at: float | None = None                # monotonic time of the latest output

    def pair_out(self, stream: str, frame_index: int, joined: bool, now: float) -> None:
        index = self.cameras.pair_of(stream, frame_index)
        self.outcomes[index] = joined
        sent = self.result_sent_at.get(index)
        if joined and sent is not None:
            self.latencies[index] = now - sent

    @property
    def pairs(self) -> int:
        """Pairs completely out: for a join one record each, for the copy both records."""
        return min(self.frames, len(self.outcomes))

    @property
    def frames_out_twice(self) -> int:
        """For a join: frame records beyond one per frame (a frame both joined and unmatched)."""
        return self.frames - len(self.outcomes)


def parse_join_key(key: bytes) -> tuple[str, int]:
    """``stream:epoch:index`` -> (stream, index)."""
    stream, _, index = key.decode().split(":")
    return stream, int(index)


# --------------------------------------------------------------------------------------------
# the systems


class System:
    """One system under test: its topics, how it starts, how its output is counted."""

    name: str
    label: str
    joins = True
    pending_measure: str | None = None
    secured = False  # the system itself connects over SASL_SSL
    isolation_level = "read_uncommitted"  # how a downstream consumer must read its output

    def __init__(self, settings: Settings, secured: Settings | None = None) -> None:
        self.settings = settings  # the load's, the reader's and the topics' connection
        self.secured_settings = secured

    def key_of(self, frame_id: wire.FrameId) -> bytes:
        return frame_id.join_key()

    def topics(self, prefix: str) -> Topics:
        return Topics(prefix, f"{prefix}frames", f"{prefix}detections", f"{prefix}joined")

    async def create_topics(self, topics: Topics) -> None:
        await create_plain_topics(self.settings, [topics.frames, topics.results, topics.output])

    def start(self, topics: Topics, scratch: Path, logs: Path) -> Running:
        """Start the system's process on ``topics``: its state under ``scratch``, its log in ``logs``."""
        raise NotImplementedError

    def tally(self, outputs: Outputs, record, now: float) -> None:
        outputs.frames += 1
        outputs.pair_out(*parse_join_key(record.key), True, now)


class Running:
    """A started system: its process, whether it is ready, its pending state and counters."""

    def __init__(self, process: Process, pending: Callable[[], int | None] = lambda: None,
                 counters: Callable[[], dict] = dict) -> None:
        self.process = process
        self.pid = process.process.pid
        self.pending_bytes = pending
        self.counters = counters

    def ready(self) -> bool:
        return self.process.ready()

    def stop(self) -> None:
        self.process.stop()


class PlainCopy(System):
    name = "copy"
    label = "plain copy (aiokafka)"
    joins = False
    program = copy.__name__  # run as ``python -m``; prints copy.READY_MARKER once assigned

    def topics(self, prefix: str) -> Topics:
        return Topics(prefix, f"{prefix}frames", f"{prefix}detections", f"{prefix}copy")

    def start(self, topics: Topics, scratch: Path, logs: Path) -> Running:
        argv = [sys.executable, "-m", self.program, f"{topics.prefix}copy", topics.output,
                topics.frames, topics.results]
        return Running(Process(self.label, argv, logs / f"{self.name}.log", copy.READY_MARKER,
                               env={**os.environ, **self.settings.to_env()}))

    def tally(self, outputs: Outputs, record, now: float) -> None:
        if wire.peek_kind(record.value) == wire.Kind.FRAME:
            outputs.frames += 1
        else:
            outputs.pair_out(*parse_join_key(record.key), True, now)


class LibrdkafkaCopy(PlainCopy):
    """The same copy on librdkafka: what the faster client alone moves here, the most a join on it
    could reach."""

    name = LIBRDKAFKA_COPY_SYSTEM
    label = "plain copy (librdkafka)"
    program = rdkafkacopy.__name__

    def __init__(self, settings: Settings, secured: Settings | None = None) -> None:
        super().__init__(settings, secured)
        if installed_version("confluent-kafka") is None:
            raise RuntimeError("confluent-kafka is not installed: pip install 'streamapp[bench]'")


class KafkaStreamsJoin(System):
    name = "kstreams"
    label = f"Kafka Streams {kstreams.KAFKA_STREAMS_VERSION}"
    pending_measure = "RocksDB memtables + SST files of its window stores (its own RocksDB metrics)"

    def __init__(self, settings: Settings, secured: Settings | None = None) -> None:
        super().__init__(settings, secured)
        self.build = kstreams.ensure_build()

    def client_properties(self, scratch: Path) -> Path:
        return kstreams.write_client_properties(self.settings, scratch)

    def start(self, topics: Topics, scratch: Path, logs: Path) -> Running:
        state = scratch / "state"
        state.mkdir(parents=True, exist_ok=True)
        argv = kstreams.command(self.build, bootstrap=self.settings.bootstrap_servers,
                                application_id=f"{topics.prefix}kstreams", frames=topics.frames,
                                results=topics.results, output=topics.output, state_dir=state,
                                window_ms=self.settings.join_ttl_ms,
                                client_properties=self.client_properties(scratch))
        process = Process("Kafka Streams join", argv, logs / "kstreams.log", kstreams.READY_MARKER)
        return Running(process, pending=lambda: kstreams.last_rocksdb_bytes(process.log_path))


class KafkaStreamsJoinExactlyOnce(KafkaStreamsJoin):
    name = KSTREAMS_EOS_SYSTEM
    label = f"Kafka Streams {kstreams.KAFKA_STREAMS_VERSION}, exactly_once_v2"
    isolation_level = "read_committed"

    def client_properties(self, scratch: Path) -> Path:
        path = super().client_properties(scratch)
        with path.open("a") as properties:  # read before the join's own settings, which leave it
            properties.write("processing.guarantee=exactly_once_v2\n")
        return path


class QuixStreamsJoin(System):
    name = "quix"
    label = "Quix Streams"
    pending_measure = "the size of its state directory (RocksDB files of both join stores)"

    def __init__(self, settings: Settings, secured: Settings | None = None) -> None:
        super().__init__(settings, secured)
        if installed_version("quixstreams") is None:
            raise RuntimeError("Quix Streams is not installed: pip install 'streamapp[bench]'")

    def start(self, topics: Topics, scratch: Path, logs: Path) -> Running:
        state = scratch / "state"
        state.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "streamapp.tools.bench.quixjoin", f"{topics.prefix}quix", topics.frames,
                topics.results, topics.output, str(state), str(self.settings.join_ttl_ms)]
        process = Process("Quix Streams join", argv, logs / "quix.log", quixjoin.READY_MARKER,
                          env={**os.environ, **self.settings.to_env()})
        return Running(process, pending=lambda: directory_bytes(state))


class StreamappJoin(System):
    name = "streamapp"
    label = "streamapp join worker"
    pending_measure = "the worker's join_pending_bytes gauge"

    def key_of(self, frame_id: wire.FrameId) -> bytes:
        return frame_id.bucket_key(self.settings.bucket_size)

    def worker_settings(self, prefix: str) -> Settings:
        return self.settings.replace(topic_prefix=prefix, stages=("join",))

    def topics(self, prefix: str) -> Topics:
        names = topic_names(self.worker_settings(prefix))
        return Topics(prefix, names["frames"], names["detections"], names["joined"])

    async def create_topics(self, topics: Topics) -> None:
        settings = self.worker_settings(topics.prefix)
        await ensure_topics(settings, layouts=[settings.stages])

    def start(self, topics: Topics, scratch: Path, logs: Path) -> Running:
        settings = self.worker_settings(topics.prefix).replace(data_dir=scratch / "data", web_port=free_port())
        worker = Worker("join", settings, logs)
        return Running(worker, pending=lambda: _stats(worker).get("join_pending_bytes"),
                       counters=lambda: {key: value for key, value in _stats(worker).items()
                                         if key.startswith("join_") and not isinstance(value, dict)})

    def tally(self, outputs: Outputs, record, now: float) -> None:
        # The header alone, as the other systems' outputs are counted from their keys: decoding the
        # frame would cost the load's share of the same cores more for this system than for them.
        frame_id, matched = wire.peek_joined(record.value)
        outputs.frames += 1
        outputs.pair_out(frame_id.stream, frame_id.index, matched, now)


class StreamappJoinOverTls(StreamappJoin):
    name = TLS_SYSTEM
    label = "streamapp join worker over SASL_SSL"
    secured = True

    def worker_settings(self, prefix: str) -> Settings:
        assert self.secured_settings is not None, "a secured system without the SASL_SSL listener"
        return super().worker_settings(prefix).replace(broker=self.secured_settings.broker,
                                                       security=self.secured_settings.security)


class StreamappJoinExactlyOnce(StreamappJoin):
    name = EOS_SYSTEM
    label = "streamapp join worker, exactly-once"
    isolation_level = "read_committed"  # an output counts once its transaction has committed

    def worker_settings(self, prefix: str) -> Settings:
        return super().worker_settings(prefix).replace(processing_guarantee=EXACTLY_ONCE)


def _stats(worker: Worker) -> dict:
    try:
        return worker.stats()
    except OSError:
        return {}  # busy for a moment; the sample shows nothing rather than stopping the bench


SYSTEM_TYPES: dict[str, type[System]] = {"copy": PlainCopy, LIBRDKAFKA_COPY_SYSTEM: LibrdkafkaCopy,
                                         "kstreams": KafkaStreamsJoin,
                                         "quix": QuixStreamsJoin, "streamapp": StreamappJoin,
                                         TLS_SYSTEM: StreamappJoinOverTls, EOS_SYSTEM: StreamappJoinExactlyOnce,
                                         KSTREAMS_EOS_SYSTEM: KafkaStreamsJoinExactlyOnce}


# --------------------------------------------------------------------------------------------
# the load, the reader, the sampler


async def read_outputs(settings: Settings, system: System, topic: str, outputs: Outputs) -> None:
    def tally(records: list) -> None:
        now = time.time()
        for record in records:
            system.tally(outputs, record, now)
        outputs.last_at = time.monotonic()

    await follow(settings, topic, tally, poll_ms=200, isolation_level=system.isolation_level)


class Sampler:
    """Every half second: the system's RSS, CPU and pending state, and the pairs in and out
    (kept in the report as each phase's timeline)."""

    def __init__(self, running: Running, load: PairLoad, outputs: Outputs) -> None:
        self.running = running
        self.load = load
        self.outputs = outputs
        self.started = time.monotonic()
        self.samples: list[dict] = []

    def now(self) -> float:
        return time.monotonic() - self.started

    async def run(self) -> None:
        while True:
            self.samples.append(await asyncio.to_thread(self.sample))
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def sample(self) -> dict:
        return {"t": round(self.now(), 2), "rss_bytes": rss_of(self.running.pid),
                "cpu_s": cpu_seconds_of(self.running.pid), "pending_bytes": self.running.pending_bytes(),
                "published": self.load.published, "out": self.outputs.pairs}

    def lag_between(self, begin: float, end: float) -> list[tuple[float, int]]:
        return [(sample["t"], sample["published"] - sample["out"]) for sample in self.samples
                if begin <= sample["t"] <= end]


@contextlib.asynccontextmanager
async def observing(settings: Settings, system: System, topics: Topics, running: Running, load: PairLoad):
    """The output reader and the sampler run for as long as the block does."""
    outputs = Outputs(load.cameras, load.result_sent_at)
    sampler = Sampler(running, load, outputs)
    tasks = [asyncio.create_task(read_outputs(settings, system, topics.output, outputs)),
             asyncio.create_task(sampler.run())]
    try:
        yield outputs, sampler
    finally:
        for task in tasks:
            task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [outcome for outcome in ended if isinstance(outcome, Exception)]
    if failed:
        raise failed[0]  # a dead reader or sampler would leave the numbers short without saying why


async def settle() -> None:
    """Write back what the load and earlier phases left dirty in the page cache, so that the
    kernel's writeback does not share the two cores with the system about to start."""
    await asyncio.to_thread(os.sync)


async def wait_ready(running: Running, label: str) -> None:
    # Polled often: the drain is timed from this moment, and a small backlog drains in a second.
    await asyncio.to_thread(wait_until, running.ready, READY_TIMEOUT_S, f"the {label} to start", poll_s=0.05)


async def wait_drained(outputs: Outputs, expected: int, quiet_s: float, timeout_s: float) -> bool:
    """Until ``expected`` pairs are out (True), or nothing more came out for ``quiet_s``, or
    ``timeout_s`` passed (False). Silence before the system's first output is not an end: it
    may read a whole backlog before it emits anything."""
    began = time.monotonic()
    while outputs.pairs < expected:
        now = time.monotonic()
        quiet = outputs.last_at is not None and now - max(outputs.last_at, began) > quiet_s
        if quiet or now - began > timeout_s:
            return False
        await asyncio.sleep(0.1)
    return True


# --------------------------------------------------------------------------------------------
# the phases


class Bench:
    """One run: the broker's settings (``secured``: its SASL_SSL listener's), the options, where
    scratch state and logs go."""

    def __init__(self, options: JoinBenchOptions, settings: Settings, scratch: Path, log_dir: Path,
                 secured: Settings | None = None, broker_pid: int | None = None) -> None:
        self.options = options
        self.settings = settings
        self.secured = secured
        # The broker's CPU in a drain (over TLS it encrypts what it sends the worker).
        self.broker_pid = broker_pid
        self.scratch = scratch
        self.log_dir = log_dir
        self.run_id = new_epoch()
        self.frame_record_bytes = 0

    @property
    def quiet_s(self) -> float:
        return self.options.ttl_s + QUIET_AFTER_TTL_S

    def prefix(self, system: System, phase: str) -> str:
        return f"bench-{self.run_id}.{system.name}.{phase}."

    @contextlib.asynccontextmanager
    async def started(self, system: System, phase: str):
        """Fresh topics for the phase, the load's producer, and (once the caller has published
        what must be there first) the system's process, stopped on the way out."""
        topics = system.topics(self.prefix(system, phase))
        await system.create_topics(topics)
        producer = load_producer(system.settings)
        await producer.start()
        running: list[Running] = []

        def start() -> Running:
            logs = self.log_dir / f"{system.name}-{phase}"
            logs.mkdir(parents=True, exist_ok=True)
            running.append(system.start(topics, self.scratch / topics.prefix, logs))
            return running[0]

        try:
            load = PairLoad(producer, topics.frames, topics.results, system.key_of,
                            (self.options.width, self.options.height), Cameras(self.options.streams))
            yield topics, load, start
        finally:
            for process in running:
                await asyncio.to_thread(process.stop)
            await producer.stop()
            # Each phase writes gigabytes; the next system starts on a broker without them.
            await delete_topics(system.settings.replace(topic_prefix=topics.prefix))
            shutil.rmtree(self.scratch / topics.prefix, ignore_errors=True)

    async def backlog(self, system: System, phase: str = "backlog") -> dict:
        options = self.options
        async with self.started(system, phase) as (topics, load, start):
            first_ms = int(time.time() * 1000 - options.pairs / options.backlog_rate * 1000)
            published_s = await load.publish(options.pairs, 0,
                                             lambda index: first_ms + int(index * 1000 / options.backlog_rate))
            self.frame_record_bytes = load.frame_record_bytes
            await settle()
            began = time.monotonic()
            running = start()
            async with observing(system.settings, system, topics, running, load) as (outputs, sampler):
                await wait_ready(running, system.label)
                broker_pid = self.broker_pid
                ready_at, cpu_at_ready = time.monotonic(), cpu_seconds_of(running.pid)
                broker_cpu_at_ready = cpu_seconds_of(broker_pid) if broker_pid else None
                await wait_drained(outputs, options.pairs, self.quiet_s, options.drain_timeout_s)
                cpu_s = cpu_seconds_of(running.pid) - cpu_at_ready
                broker_cpu_s = (cpu_seconds_of(broker_pid) - broker_cpu_at_ready
                                if broker_pid and broker_cpu_at_ready is not None else None)
                counters = await asyncio.to_thread(running.counters)
                await asyncio.sleep(SAMPLE_INTERVAL_S)  # one more sample of the settled state
        return join_report.backlog_summary({
            "pairs": options.pairs, "published_s": round(published_s, 2), "startup_s": ready_at - began,
            "startup_cpu_s": cpu_at_ready,
            "drain_s": (outputs.last_at or ready_at) - ready_at, "cpu_s": cpu_s, "broker_cpu_s": broker_cpu_s,
            "pairs_out": outputs.pairs,
            "joined": sum(outputs.outcomes.values()), "frames_out_twice": outputs.frames_out_twice,
            "counters": counters, "samples": sampler.samples},
            system.joins)

    async def live(self, system: System) -> dict:
        steps: list[dict] = []
        async with self.started(system, "live") as (topics, load, start):
            await settle()
            running = start()
            async with observing(system.settings, system, topics, running, load) as (outputs, sampler):
                await wait_ready(running, system.label)
                await self.warm_up(load, outputs)
                for rate in self.rates_to_try(steps):
                    steps.append(join_report.step_summary(await self.step(load, outputs, sampler, rate), system.joins))
                counters = await asyncio.to_thread(running.counters)
        return {"steps": steps, "max_sustained": join_report.max_sustained(steps),
                "max_latency_held": join_report.max_latency_held(steps), "counters": counters,
                "samples": sampler.samples}

    def rates_to_try(self, steps: list[dict]) -> Iterator[float]:
        """The ladder's rates while each is sustained (higher rates are tried only while the system
        and the load keep up), then up to ``refine_steps`` rates between the highest sustained and
        the lowest not, each once the system has caught up with the step before. Each rate is
        tried again, up to ``retries`` times, while it is not sustained."""
        for rate in self.options.rates:
            yield from self.tries(rate, steps)
            if not steps[-1]["sustained"]:
                break
        for _ in range(self.options.refine_steps):
            refined = join_report.refine_rate(steps)
            if refined is None or not steps[-1]["drained"]:
                return
            yield from self.tries(refined, steps)

    def tries(self, rate: float, steps: list[dict]) -> Iterator[float]:
        """``rate``, then again while its last try was not sustained, the load offered it and the
        system caught up afterwards (one still behind would start the next try with a backlog)."""
        yield rate
        for _ in range(self.options.retries):
            last = steps[-1]
            if last["sustained"] or not last["offered"] or not last["drained"]:
                return
            yield rate

    async def warm_up(self, load: PairLoad, outputs: Outputs) -> None:
        rate = self.options.rates[0]
        await load.publish(max(1, round(rate * self.options.warmup_s)), rate)
        await wait_drained(outputs, load.next_index, self.quiet_s, self.options.drain_timeout_s)

    async def step(self, load: PairLoad, outputs: Outputs, sampler: Sampler, rate: float) -> dict:
        start, count = load.next_index, max(1, round(rate * self.options.live_seconds))
        began, cpu_before = sampler.now(), self.cpu_seconds(sampler.running)
        publish_s = await load.publish(count, rate)
        ended, cpu_after = sampler.now(), self.cpu_seconds(sampler.running)
        drained = await wait_drained(outputs, load.next_index, self.quiet_s, self.options.drain_timeout_s)
        indexes = range(start, start + count)
        steady = range(start + int(count * WARMUP_FRACTION), start + count)
        return {"rate": rate, "pairs": count, "publish_s": publish_s, "lag": sampler.lag_between(began, ended),
                "drained": drained, "pairs_out": sum(1 for index in indexes if index in outputs.outcomes),
                "joined": sum(1 for index in indexes if outputs.outcomes.get(index)),
                "latencies_s": [outputs.latencies[index] for index in steady if index in outputs.latencies],
                "cpu_s": {role: cpu_after[role] - cpu_before[role] for role in cpu_after}}

    @staticmethod
    def cpu_seconds(running: Running) -> dict[str, float]:
        """CPU used so far by the system and by this process (the load and the output reader):
        on a small machine they share the cores."""
        return {"system": cpu_seconds_of(running.pid), "load": cpu_seconds_of(os.getpid())}

    async def balanced_drains(self, systems: list[System], rounds: int, phase: str) -> list[dict]:
        """Each system's backlog drain, ``rounds`` times in the order given and then reversed
        (A B C C B A): a system early in one pass is late in the next."""
        order = [*systems, *reversed(systems)] * rounds
        return [{"system": system.name, **await self.backlog(system, f"{phase}-{number}")}
                for number, system in enumerate(order, start=1)]

    async def tls_drains(self) -> dict:
        """The worker's backlog drains over PLAINTEXT (A) and SASL_SSL (B), ``tls_rounds`` times
        in the order A B B A, after one of each that is not counted (they warm the broker, its TLS
        path and the page cache): in single drains the later of a run was the faster, by as much
        as TLS costs, and the first over SASL_SSL the slowest (see :func:`.join_report.balanced_tls`)."""
        plain = StreamappJoin(self.settings, self.secured)
        tls = StreamappJoinOverTls(self.settings, self.secured)
        try:
            for system in (plain, tls):
                await self.backlog(system, "tls-warm-up")
            drains = await self.balanced_drains([plain, tls], self.options.tls_rounds, "tls-drain")
        except Exception as exc:  # noqa: BLE001 - the systems' numbers stand without these
            return {"error": f"{type(exc).__name__}: {exc}"}
        return join_report.balanced_tls(drains)

    async def drain_rounds(self, names: list[str]) -> dict:
        """``drain_rounds`` rounds of the named systems' backlog drains, order balanced. Each has
        drained and run live once before, so none of them is the first on a cold broker."""
        systems = [SYSTEM_TYPES[name](self.settings, self.secured) for name in names]
        try:
            drains = await self.balanced_drains(systems, self.options.drain_rounds, "drain")
        except Exception as exc:  # noqa: BLE001 - the systems' numbers stand without these
            return {"error": f"{type(exc).__name__}: {exc}"}
        return join_report.balanced_drains(drains, names)

    async def run_system(self, name: str) -> dict:
        system_type = SYSTEM_TYPES[name]
        result: dict = {"label": system_type.label, "pending_measure": system_type.pending_measure}
        try:
            system = system_type(self.settings, self.secured)
            result["backlog"] = await self.backlog(system)
            result["live"] = await self.live(system)
        except Exception as exc:  # noqa: BLE001 - one system failing must not lose the others' numbers
            result["error"] = f"{type(exc).__name__}: {exc}"
        return result


# --------------------------------------------------------------------------------------------
# the run


def run_join_bench(options: JoinBenchOptions, command: str, notify: Callable[[str], None] = print) -> dict:
    """Run every system in turn; write report.json, report.md and join.png under ``options.out``."""
    out = options.out.resolve()
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    machine_at_start = join_report.describe_machine()
    systems: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-join-") as scratch, contextlib.ExitStack() as brokers:
        security = None
        if any(SYSTEM_TYPES[name].secured for name in options.systems):
            # One broker, two listeners: both workers read the same warmed-up JVM and page cache.
            security = BrokerSecurity(Path(scratch) / "broker" / "security", plaintext_port=free_port())
        broker = own_broker(Path(scratch) / "broker", notify=notify, security=security)
        brokers.callback(broker.stop)
        plaintext = f"127.0.0.1:{security.plaintext_port}" if security else broker.bootstrap
        settings = Settings.from_env().replace(broker=f"kafka://{plaintext}", join_ttl_s=options.ttl_s)
        secured = settings.replace(broker=f"kafka://{broker.bootstrap}", security=Settings.from_env(
            security.client_env(broker.bootstrap, ADMIN)).security) if security else None
        bench = Bench(options, settings, Path(scratch), log_dir, secured, broker.status().pid)
        for name in options.systems:
            notify(f"bench join: {SYSTEM_TYPES[name].label}")
            systems[name] = asyncio.run(bench.run_system(name))
        tls = None
        if {"streamapp", TLS_SYSTEM} <= set(options.systems):
            notify(f"bench join: the worker over PLAINTEXT and SASL_SSL, {options.tls_rounds} × A B B A")
            tls = asyncio.run(bench.tls_drains())
        drains = None
        if options.drain_rounds:
            ran = [name for name in options.systems if not systems[name].get("error")]
            notify(f"bench join: {options.drain_rounds} × every system's drain, order balanced")
            drains = asyncio.run(bench.drain_rounds(ran))
    report = join_report.build_report(report_options(options, command, settings, bench), versions(),
                                      systems, machine_at_start, tls, drains)
    write_json(out / "report.json", report)
    (out / "report.md").write_text(join_report.markdown(report))
    join_report.draw_chart(out / "join.png", report)
    return report


def report_options(options: JoinBenchOptions, command: str, settings: Settings, bench: Bench) -> dict:
    return {**dataclasses.asdict(options), "out": str(options.out), "rates": list(options.rates),
            "systems": list(options.systems), "command": command, "partitions": settings.partitions,
            "bucket_size": settings.bucket_size, "result_lag": RESULT_LAG,
            "frame_record_bytes": bench.frame_record_bytes}


def versions() -> dict:
    java = subprocess.run([check_java(), "-version"], capture_output=True, text=True, timeout=60)
    return {"kafka_broker": KAFKA_VERSION, "kafka_streams": kstreams.KAFKA_STREAMS_VERSION,
            "kstreams_jvm": shlex.join(kstreams.JVM_OPTIONS[:2]),
            "java": (java.stderr or java.stdout).splitlines()[0], "python": platform.python_version(),
            "faust": importlib.metadata.version("faust-streaming"), "aiokafka": importlib.metadata.version("aiokafka"),
            "quixstreams": installed_version("quixstreams"), "confluent_kafka": installed_version("confluent-kafka")}


def installed_version(distribution: str) -> str | None:
    """The version of an optional dependency (the bench extra), None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
