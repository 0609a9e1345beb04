"""``streamapp bench soak``: frame/result pairs through the join for a long time, memory and disk
sampled once a second, next to a naive in-memory join fed the same records.

The join runs as its own ``faust`` worker process, exactly as deployed. This process is the load:
it publishes frames and detection results (bucket-keyed, a few frames apart, as inference
would), reads the joined output to measure latency, and samples every second the RSS of each
process, the join's pending state and RocksDB bytes, and the bytes of every topic on the broker.
It writes ``report.json`` and three charts (RSS, disk, pending state) per scenario.

Scenarios: ``steady``; ``stall`` (no results for ``--stall`` seconds from 40 % of the run: the
frames of that window never get one); ``slow-sink`` (a consumer of ``joined`` reading a third of
the input rate); ``4k`` (3840x2160 frames).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from pathlib import Path

from streamapp import wire
from streamapp.settings import Settings
from streamapp.tools.bench.naive import NaiveJoin, naive_topic
from streamapp.tools.bench.pairs import Cameras, PairLoad, create_plain_topics, load_producer
from streamapp.tools.bench.report import build_report, draw_charts, write_json
from streamapp.tools.bench.sampler import Sampler
from streamapp.tools.bench.soak_state import STALL_AT, Progress, SoakOptions
from streamapp.tools.harness import follow, output_consumer, own_broker
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker, wait_until
from streamapp.topicadmin import ensure_topics
from streamapp.topics import topic_names
from streamapp.wire import new_epoch

# --------------------------------------------------------------------------------------------
# the run


def run_soak(options: SoakOptions, settings: Settings | None = None) -> dict:
    """Run one scenario; returns its report (also written to ``<out>/<scenario>/report.json``)."""
    out = (options.out / options.scenario).resolve()
    scratch = [out / "broker", out / "data"]  # gigabytes after a long run; only the results stay
    _remove(scratch)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    broker = None
    processes: list = []
    try:
        if not options.bootstrap:
            broker = own_broker(out / "broker")
        bootstrap = options.bootstrap if broker is None else broker.bootstrap
        settings = (settings or Settings.from_env()).replace(
            broker=f"kafka://{bootstrap}", topic_prefix=f"soak-{new_epoch()}.", stages=("join",),
            data_dir=out / "data" / "join", web_port=free_port(),
            memory_budget_bytes=options.memory_budget_bytes)
        asyncio.run(_create_topics(settings, options))
        join = Worker("join", settings, out / "logs")
        processes.append(join)
        naive = NaiveJoin(settings, out) if options.baseline == "naive" else None
        if naive is not None:
            processes.append(naive)
        wait_until(join.ready, 120, "the join worker to start")
        sampler = Sampler(settings, join, naive, out, broker)
        progress = asyncio.run(_drive(options, settings, sampler))
    finally:
        for process in reversed(processes):
            process.stop()
        if broker is not None:
            broker.stop()
        _remove(scratch)
    report = build_report(options, settings, progress, sampler.samples)
    write_json(out / "report.json", report)
    draw_charts(out, report, sampler.samples)
    return report


async def _create_topics(settings: Settings, options: SoakOptions) -> None:
    await ensure_topics(settings, layouts=[settings.stages])
    if options.baseline == "naive":
        await create_plain_topics(settings, [naive_topic(settings)])


async def _drive(options: SoakOptions, settings: Settings, sampler: Sampler) -> Progress:
    names = topic_names(settings)
    producer = load_producer(settings)
    await producer.start()
    stall = StallWindow(int(options.pair_count * STALL_AT), options.stall_s if options.scenario == "stall" else 0)
    load = PairLoad(producer, names["frames"], names["detections"],
                    lambda frame_id: frame_id.bucket_key(settings.bucket_size), options.size, Cameras(1),
                    withhold=stall.withholds)
    progress = Progress(load)
    engines = {"ours": names["joined"]}
    if options.baseline == "naive":
        engines["naive"] = naive_topic(settings)
    background = [asyncio.create_task(sampler.run(progress))]
    background += [asyncio.create_task(_read_joined(settings, engine, topic, progress))
                   for engine, topic in engines.items()]
    if options.scenario == "slow-sink":
        background.append(asyncio.create_task(_slow_sink(settings, options, progress)))
    try:
        try:
            await load.publish(options.pair_count, options.pair_rate)
        finally:
            progress.sending_done = progress.elapsed()
        deadline = time.monotonic() + options.drain_timeout_s
        while time.monotonic() < deadline and not _drained(progress, engines):
            await asyncio.sleep(0.5)
        await asyncio.sleep(2 * settings.sweep_interval_s)  # a last sample of the settled state
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await producer.stop()
    return progress


def _drained(progress: Progress, engines: dict[str, str]) -> bool:
    """Every frame left our join; the naive join matched every pair that has both sides."""
    done = progress.out["ours"] >= progress.pairs_sent
    if "naive" in engines:
        done = done and progress.out["naive"] >= progress.results_sent
    return done


# --------------------------------------------------------------------------------------------
# the load


@dataclasses.dataclass
class StallWindow:
    """Inference stops at the ``start``-th frame for ``seconds``: those frames get no result."""

    start: int
    seconds: float
    _until: float | None = None

    def withholds(self, index: int) -> bool:
        if not self.seconds or index < self.start:
            return False
        if self._until is None:
            self._until = time.monotonic() + self.seconds
        return time.monotonic() < self._until


async def _read_joined(settings: Settings, engine: str, topic: str, progress: Progress) -> None:
    def count(records: list) -> None:
        now = time.time()
        span = progress.output_span.setdefault(engine, [now, now])
        span[1] = now
        for record in records:
            joined = wire.decode_joined(record.value)
            progress.out[engine] += 1
            if joined.matched:
                progress.matched[engine] += 1
                sent = progress.result_sent_at.get(joined.frame.id.index)
                if sent is not None:
                    progress.latencies[engine].append(now - sent)

    await follow(settings, topic, count)


async def _slow_sink(settings: Settings, options: SoakOptions, progress: Progress) -> None:
    """A consumer group of ``joined`` that reads a third of the input rate (at least 1/s)."""
    consumer = output_consumer(settings, topic_names(settings)["joined"], group_id=f"{settings.topic_prefix}slow-sink",
                               enable_auto_commit=True, max_poll_records=16)
    rate = max(1.0, (options.pair_rate or 1000.0) / 3)
    await consumer.start()
    try:
        while True:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for _ in records:
                    progress.slow_sink_read += 1
                    await asyncio.sleep(1 / rate)
    finally:
        await consumer.stop()


def _remove(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
