"""``streamapp bench chaos``: SIGKILL stages at random moments under load, restart them, count.

One worker process per stage runs on its own topics (prefix ``chaos-<run>.``) while synthetic
streams are published at a steady rate. Every few seconds a random stage is killed with SIGKILL
and restarted at once; every other kill of the join also deletes its RocksDB store, so it must
recover from the changelog alone. When the kills are done the source stops, and the report
compares what was produced with what came out:

* ``lost``: produced frames without a frame file at the sink (must be 0);
* ``sink_duplicates``: frames the sink wrote more than once (must be 0), and
  ``joined_redelivered``: extra copies in the ``joined`` topic that the idempotent sink absorbed;
* ``duplicates_by_topic``: extra committed copies of a frame in each topic a stage writes
  (``frames.scaled``, ``detections``, ``joined``), read ``read_committed`` as a downstream
  consumer would (0 under exactly-once; at least once, a kill leaves redelivered copies);
* ``recovery``: per kill, seconds until the new process was ready and until it processed again;
* ``workers_exited``: workers that ended without being killed (must be 0).

A restarted worker rejoins its consumer group as the same static member, so it takes its
partitions back without waiting for the killed member's session to time out.

With ``--broker-kills N`` or ``--rolling-restarts N`` the pipeline runs on a local three-node
cluster (topics replicated three times, ``min.insync.replicas`` 2): a broker kill SIGKILLs a random
node, keeps it down for a few seconds under load and starts it again; a rolling restart stops and
starts every node in turn. After each, the bench waits until every partition has all its copies in
sync again (``broker_log``: seconds until the node answered and until it had caught up).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

from streamapp import wire
from streamapp.cli.arguments import count_arg, count_or_zero_arg, port_arg, steady_fps_arg
from streamapp.settings import PROCESSING_GUARANTEES, STAGES, Settings
from streamapp.sinkfiles import frame_path
from streamapp.tools.harness import (
    POLL_S,
    JoinedTopic,
    Pipeline,
    SteadyCameras,
    ensure_broker,
    processed,
    read_joined,
    read_topic,
    wait_for,
)
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.cluster import LocalCluster, count_under_replicated, default_cluster_dir
from streamapp.tools.localkafka.common import DEFAULT_PORT
from streamapp.topics import topic_names
from streamapp.units import parse_duration
from streamapp.wire import new_epoch


@dataclasses.dataclass(frozen=True)
class ChaosOptions:
    kills: int = 20
    stages: tuple[str, ...] = STAGES
    streams: int = 2
    fps: float = 10.0  # per stream
    width: int = 320
    height: int = 240
    pause_s: tuple[float, float] = (2.0, 6.0)  # after a restarted stage works again, before the next kill
    wipe_join_store_every: int = 2  # 0 never deletes the join's store
    join_ttl_s: float = 30.0
    processing_guarantee: str = "at_least_once"
    seed: int = 0
    out: Path = Path("out/chaos")
    broker_port: int = DEFAULT_PORT
    recovery_timeout_s: float = 120.0
    settle_timeout_s: float = 300.0
    broker_kills: int = 0  # SIGKILL a random node of the cluster, restart it after a pause
    rolling_restarts: int = 0  # stop and start every node of the cluster in turn

    @property
    def needs_cluster(self) -> bool:
        return self.broker_kills > 0 or self.rolling_restarts > 0


@dataclasses.dataclass
class Kill:
    stage: str
    at_s: float
    store_wiped: bool
    ready_s: float | None = None
    processing_s: float | None = None


@dataclasses.dataclass
class BrokerFault:
    node: int
    kind: str  # "kill" (SIGKILL) or "restart" (SIGTERM, part of a rolling restart)
    at_s: float
    ready_s: float | None = None  # from the fault until the node answered again
    in_sync_s: float | None = None  # ... until every partition had all its copies in sync


BROKER = "broker"


class ChaosRun:
    def __init__(self, options: ChaosOptions, files: FrameFiles, cluster: LocalCluster | None = None) -> None:
        self.options = options
        self.files = files
        self.cluster = cluster
        self.random = random.Random(options.seed)
        self.kills: list[Kill] = []
        self.broker_faults: list[BrokerFault] = []
        self.workers_exited: set[str] = set()
        self.join_kills = 0

    @property
    def _broker_cluster(self) -> LocalCluster:
        """The cluster whose nodes the broker faults hit (options.needs_cluster)."""
        if self.cluster is None:
            raise ValueError("broker kills and rolling restarts need a LocalCluster")
        return self.cluster

    async def run(self, pipeline: Pipeline, source: SteadyCameras) -> None:
        began = time.monotonic()
        producing = asyncio.create_task(source.run())

        async def pause() -> None:
            await asyncio.sleep(self.random.uniform(*self.options.pause_s))
            if producing.done():
                producing.result()  # the source failed: report why
            self.workers_exited |= pipeline.exited()

        try:
            for target in self._kill_order():
                await pause()
                at_s = time.monotonic() - began
                if target == BROKER:
                    node = self.random.choice(self._broker_cluster.nodes)
                    self.broker_faults.append(await self._broker_fault(node, "kill", at_s))
                else:
                    self.kills.append(await self._kill_and_restart(pipeline, target, at_s))
            for _ in range(self.options.rolling_restarts):
                for node in self._broker_cluster.nodes:
                    await pause()
                    self.broker_faults.append(await self._broker_fault(node, "restart", time.monotonic() - began))
            await asyncio.sleep(self.options.pause_s[1])  # load continues after the last recovery
            self.workers_exited |= pipeline.exited()
        finally:
            source.stopping.set()
            await producing

    def _kill_order(self) -> list[str]:
        """Every stage as often as the others (give or take one), and the broker kills, in random order."""
        stages = list(self.options.stages)
        order = [stages[number % len(stages)] for number in range(self.options.kills)]
        order += [BROKER] * self.options.broker_kills
        self.random.shuffle(order)
        return order

    async def _broker_fault(self, node: LocalBroker, kind: str, at_s: float) -> BrokerFault:
        """Kill (or stop) one node, keep it down for a pause under load, start it again, and wait
        until it has caught up. The blocking broker calls run in a thread: the source goes on."""
        fault = BrokerFault(node.node_id, kind, round(at_s, 2))
        began = time.monotonic()
        await asyncio.to_thread(node.kill if kind == "kill" else node.stop)
        if kind == "kill":
            await asyncio.sleep(self.random.uniform(*self.options.pause_s))
        await asyncio.to_thread(node.start, self.options.recovery_timeout_s)
        fault.ready_s = round(time.monotonic() - began, 2)
        deadline = time.monotonic() + self.options.recovery_timeout_s
        while time.monotonic() < deadline:
            if await count_under_replicated(self._broker_cluster.bootstrap) == 0:
                fault.in_sync_s = round(time.monotonic() - began, 2)
                break
            await asyncio.sleep(POLL_S)
        return fault

    async def _kill_and_restart(self, pipeline: Pipeline, stage: str, at_s: float) -> Kill:
        wipe = False
        if stage == "join":
            self.join_kills += 1
            every = self.options.wipe_join_store_every
            wipe = every > 0 and self.join_kills % every == 0
        self.files.check()
        pipeline.kill(stage, wipe_store=wipe)
        killed_at = time.monotonic()
        worker = pipeline.start(stage)
        kill = Kill(stage, round(at_s, 2), wipe)
        timeout = self.options.recovery_timeout_s
        if await wait_for(worker.ready, timeout) is not None:
            kill.ready_s = round(time.monotonic() - killed_at, 2)
            if await wait_for(lambda: processed(worker) > 0, timeout) is not None:
                kill.processing_s = round(time.monotonic() - killed_at, 2)
        return kill


class FrameFiles:
    """Watches the sink's frame files: a file replaced after it was first seen was written twice.

    The sink writes a frame by renaming a new file into place, so a second write of the same
    frame shows as a new inode under the same path. Checked at every kill and at the end.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.inodes: dict[str, int] = {}
        self.rewritten = 0

    def check(self) -> None:
        for frames_dir in self.out.glob("*/*/frames"):
            for entry in os.scandir(frames_dir):
                if not entry.name.endswith(".jpg"):
                    continue
                inode = entry.inode()
                if self.inodes.setdefault(entry.path, inode) != inode:
                    self.rewritten += 1
                    self.inodes[entry.path] = inode


def sink_files(out: Path, produced: set[wire.FrameId]) -> int:
    return sum(frame_path(out, frame_id).exists() for frame_id in produced)


async def duplicates_by_topic(settings: Settings) -> dict[str, int]:
    """Extra committed copies of a frame in each topic a stage writes."""
    names = topic_names(settings)
    frame_ids = {
        "scaled": lambda value: wire.decode_frame(value, view=True).id,
        "detections": lambda value: wire.decode_detections(value).id,
        "joined": lambda value: wire.peek_joined(value)[0],
    }
    duplicates = {}
    for role, frame_id in frame_ids.items():
        records = await read_topic(settings, names[role], settings.partitions)
        copies = Counter(frame_id(record.value) for record in records)
        duplicates[names[role].removeprefix(settings.topic_prefix)] = sum(count - 1 for count in copies.values())
    return duplicates


def report(options: ChaosOptions, run: ChaosRun, source: SteadyCameras, joined: JoinedTopic, out: Path,
           elapsed_s: float, duplicates: dict[str, int]) -> dict:
    run.files.check()
    produced = source.produced
    lost = sorted((frame_id for frame_id in produced if not frame_path(out, frame_id).exists()),
                  key=lambda frame_id: (frame_id.stream, frame_id.index))
    recovery = [kill.processing_s for kill in run.kills if kill.processing_s is not None]
    join_recovery = [kill.processing_s for kill in run.kills if kill.stage == "join" and kill.processing_s is not None]
    in_sync = [fault.in_sync_s for fault in run.broker_faults if fault.in_sync_s is not None]
    return {
        "kills": len(run.kills),
        "kills_by_stage": dict(Counter(kill.stage for kill in run.kills)),
        "join_stores_wiped": sum(kill.store_wiped for kill in run.kills),
        "processing_guarantee": options.processing_guarantee,
        "frames_produced": len(produced),
        "frame_files": len(produced) - len(lost),
        "lost": len(lost),
        "lost_examples": [f"{frame_id.stream}:{frame_id.index}" for frame_id in lost[:20]],
        "sink_duplicates": run.files.rewritten,
        "joined_records": sum(joined.copies.values()),
        "joined_distinct": len(joined.copies),
        "joined_missing": len(produced - set(joined.copies)),
        "joined_redelivered": sum(count - 1 for count in joined.copies.values()),
        "duplicates_by_topic": duplicates,
        "joined_matched": sum("joined" in outcome for outcome in joined.outcomes.values()),
        "unmatched_frames": sum(outcome == {"unmatched"} for outcome in joined.outcomes.values()),
        "joined_and_unmatched": sum(len(outcome) > 1 for outcome in joined.outcomes.values()),
        "recovery_s": {
            "max": max(recovery, default=None),
            "median": statistics.median(recovery) if recovery else None,
            "not_recovered": len(run.kills) - len(recovery),
            "join_median": statistics.median(join_recovery) if join_recovery else None,
        },
        "workers_exited": sorted(run.workers_exited),
        "broker_kills": sum(fault.kind == "kill" for fault in run.broker_faults),
        "broker_restarts": sum(fault.kind == "restart" for fault in run.broker_faults),
        "brokers_in_sync_s": {
            "max": max(in_sync, default=None),
            "not_in_sync": len(run.broker_faults) - len(in_sync),
        },
        "kill_log": [dataclasses.asdict(kill) for kill in run.kills],
        "broker_log": [dataclasses.asdict(fault) for fault in run.broker_faults],
        "elapsed_s": round(elapsed_s, 1),
    }


def run_chaos(options: ChaosOptions, settings: Settings | None = None, cluster: LocalCluster | None = None) -> dict:
    """Run the chaos bench; returns the report (also written to ``<out>/chaos.json``).

    Broker faults need a ``cluster``: the one given, or else the local cluster at
    ``options.broker_port``, started (and stopped at the end) unless it runs already."""
    out = options.out.resolve()
    shutil.rmtree(out / ".data", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    base = (settings or Settings.from_env()).replace(
        topic_prefix=f"chaos-{new_epoch()}.", out_dir=out, stages=STAGES, join_ttl_s=options.join_ttl_s,
        processing_guarantee=options.processing_guarantee)
    broker: LocalBroker | LocalCluster | None
    if options.needs_cluster:
        broker, cluster = None, cluster or LocalCluster(default_cluster_dir(options.broker_port), options.broker_port)
        if not cluster.running():
            broker = cluster.start()
        base = base.replace(broker=f"kafka://{cluster.bootstrap}", replication_factor=cluster.replication)
    else:
        broker, base = ensure_broker(base, options.broker_port)
    pipeline = Pipeline(base, out)
    try:
        pipeline.start_all()
        began = time.monotonic()
        source = SteadyCameras(base, options.streams, options.width, options.height, options.fps)
        chaos = ChaosRun(options, FrameFiles(out), cluster)
        asyncio.run(chaos.run(pipeline, source))
        asyncio.run(wait_for(lambda: sink_files(out, source.produced) == len(source.produced),
                             options.settle_timeout_s))
        joined = asyncio.run(read_joined(base))
        duplicates = asyncio.run(duplicates_by_topic(base))
        summary = report(options, chaos, source, joined, out, time.monotonic() - began, duplicates)
    finally:
        pipeline.stop()
        if broker is not None:
            broker.stop()
    (out / "chaos.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# --- the command ------------------------------------------------------------------------------


def stages_arg(text: str) -> tuple[str, ...]:
    stages = tuple(stage.strip() for stage in text.split(",") if stage.strip())
    if not stages or set(stages) - set(STAGES):
        raise argparse.ArgumentTypeError(f"--stages: a comma list of {', '.join(STAGES)}, got {text!r}")
    return stages


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Kill pipeline stages with SIGKILL at random moments while synthetic "
                          "streams play, restart them, and report frames lost, duplicates at the "
                          "sink and recovery times (written to OUT/chaos.json). Exits 1 if a frame "
                          "was lost or written twice.")
    parser.add_argument("--kills", type=count_or_zero_arg, default=20, help="kills of stages (default 20)")
    parser.add_argument("--broker-kills", type=count_or_zero_arg, default=0,
                        help="SIGKILLs of a random broker of a local three-node cluster, each restarted "
                             "after a pause (default 0; any makes the bench run on the cluster at --port, "
                             "started if it does not run)")
    parser.add_argument("--rolling-restarts", type=count_or_zero_arg, default=0,
                        help="restarts of every broker of the cluster in turn (default 0)")
    parser.add_argument("--stages", type=stages_arg, default=STAGES, help="stages to kill (default all)")
    parser.add_argument("--streams", type=count_arg, default=2, help="synthetic streams (default 2)")
    parser.add_argument("--fps", type=steady_fps_arg, default=10.0, help="frames per second per stream (default 10)")
    parser.add_argument("--ttl", default="30s", help="join TTL (default 30s)")
    parser.add_argument("--guarantee", choices=PROCESSING_GUARANTEES, default="at_least_once",
                        help="processing guarantee of the workers (default at_least_once)")
    parser.add_argument("--wipe-join-store-every", type=count_or_zero_arg, default=2,
                        help="every N-th kill of the join deletes its store (default 2; 0 never)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill order and moments")
    parser.add_argument("--out", type=Path, default=Path("out/chaos"), help="default out/chaos")
    parser.add_argument("--port", type=port_arg, default=DEFAULT_PORT, help=f"broker port (default {DEFAULT_PORT})")


def run(args: argparse.Namespace) -> int:
    options = ChaosOptions(kills=args.kills, stages=args.stages, streams=args.streams, fps=args.fps,
                           join_ttl_s=parse_duration(args.ttl, name="--ttl"),
                           processing_guarantee=args.guarantee,
                           wipe_join_store_every=args.wipe_join_store_every, seed=args.seed,
                           out=args.out, broker_port=args.port, broker_kills=args.broker_kills,
                           rolling_restarts=args.rolling_restarts)
    summary = run_chaos(options)
    print(json.dumps({key: value for key, value in summary.items() if key != "kill_log"}, indent=2))
    healthy = not summary["workers_exited"] and summary["brokers_in_sync_s"]["not_in_sync"] == 0
    return 0 if summary["lost"] == 0 and summary["sink_duplicates"] == 0 and healthy else 1
