"""``streamapp bench disk``: the whole pipeline with every disk it writes on a small real file system.

A local broker and one worker per stage run as deployed, with the broker's log dir, the join's
data dir and the sink's out dir each on its own small file system, sized from the budgets
(:func:`~streamapp.tools.bench.disk_scenario.filesystem_bytes`): a tmpfs, or with ``--fs ext4`` an ext4
file system in a sparse image file, loop-mounted. The bench mounts them and unmounts them (and
deletes the images) at the end whatever happens (an error, Ctrl-C, SIGTERM). Synthetic cameras play at a steady rate
(the chaos bench's source) while two faults come one after the other in the middle of the run:

* inference stalls: the infer worker is stopped with SIGSTOP, and continued (SIGCONT) after
  ``--stall``; its consumer-group session times out meanwhile, so it rejoins the group;
* the sink is slowed: for ``--slow-sink`` it is stopped for ``--sink-stopped`` of every
  ``sink_period_s`` seconds and continued for the rest, so it reads below the input rate and the
  ``joined`` topic holds its backlog.

Once a second the bench samples the used bytes of each file system, the join's and the sink's
own byte gauges, and every process's RSS; it reads the ``joined`` topic as it goes (retention
deletes old records, so it cannot be read at the end). It writes ``report.json`` and
``disk.png``; :mod:`streamapp.tools.bench.disk_scenario` holds the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from streamapp import wire
from streamapp.errors import ExitCode, StreamappError
from streamapp.settings import STAGES, Settings
from streamapp.tools.bench.disk_scenario import (
    COMPONENTS,
    FILESYSTEMS,
    SLOW_SINK,
    STALL,
    DiskBenchOptions,
    Phase,
    accounting,
    budgets,
    deleted_unread_of,
    disk_verdict,
    filesystem_bytes,
    passed,
    phase_at,
    phases,
)
from streamapp.tools.bench.plot import line_image, write_png
from streamapp.tools.bench.report import machine, write_json
from streamapp.tools.bench.sampler import rss_of
from streamapp.tools.harness import JoinedTopic, Pipeline, SteadyCameras, follow, wait_for
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker
from streamapp.topics import topic_names
from streamapp.wire import new_epoch

# What a run makes under --work: the broker's dir (its log dir a mount), the two other mount
# points, the ext4 images, the workers' logs and their data dirs.
WORK_DIRS = ("broker", "join", "sink", "images", "logs", ".data")
# ext4 keeps about 6 % of a small file system for its journal and inode tables (-m 0: no blocks
# reserved for root): an image this much larger holds at least the bytes asked for, as a tmpfs does.
EXT4_OVERHEAD_SHARE = 1 / 12
EXT4_OVERHEAD_BYTES = 16 * 1024**2
STATS_TIMEOUT_S = 0.5   # a sample does not wait for a busy worker
FINAL_STATS_TIMEOUT_S = 10.0


class NeedsRoot(StreamappError, PermissionError):
    exit_code = ExitCode.NEEDS_ROOT


class DiskBenchError(StreamappError, RuntimeError):
    """A small file system could not be mounted, one is left from an earlier run, or the
    pipeline did not start."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise NeedsRoot("`streamapp bench disk` mounts small file systems (tmpfs or ext4) and needs root",
                        "run it as root, e.g. with sudo")


# --- small disks ------------------------------------------------------------------------------


def ext4_image_bytes(size_bytes: int) -> int:
    """The image for an ext4 file system with at least ``size_bytes`` free once made."""
    return size_bytes + int(size_bytes * EXT4_OVERHEAD_SHARE) + EXT4_OVERHEAD_BYTES


class SmallDisks:
    """The small file systems of one run, each a tmpfs or (``filesystem="ext4"``) an ext4 file
    system in a sparse image file under ``images``, loop-mounted; :meth:`unmount_all` removes
    every one it made, images included."""

    def __init__(self, filesystem: str = "tmpfs", images: Path | None = None) -> None:
        if filesystem not in FILESYSTEMS:
            raise DiskBenchError(f"unknown file system {filesystem!r}", f"choose one of {', '.join(FILESYSTEMS)}")
        if filesystem == "ext4" and not shutil.which("mkfs.ext4"):
            raise DiskBenchError("--fs ext4 needs mkfs.ext4, which is not installed",
                                 "install e2fsprogs (`apt-get install e2fsprogs`) or use --fs tmpfs")
        self.filesystem = filesystem
        self.images = images or Path("images")
        self.mounted: list[tuple[Path, Path | None]] = []

    def mount(self, directory: Path, size_bytes: int) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(directory):
            raise DiskBenchError(f"{directory} is already a mount point", f"unmount it (`umount {directory}`)")
        image = None if self.filesystem == "tmpfs" else self._make_ext4_image(directory, size_bytes)
        command = (["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)] if image is None
                   else ["mount", "-t", "ext4", "-o", "loop", str(image), str(directory)])
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            if image is not None:
                image.unlink(missing_ok=True)
            raise DiskBenchError(f"cannot mount a {self.filesystem} of {size_bytes} bytes at {directory}: "
                                 f"{result.stderr.strip() or result.returncode}")
        self.mounted.append((directory, image))
        if image is not None:  # Kafka refuses a log dir holding anything but topic partitions
            (directory / "lost+found").rmdir()
        return directory

    def _make_ext4_image(self, directory: Path, size_bytes: int) -> Path:
        self.images.mkdir(parents=True, exist_ok=True)
        image = self.images / f"{len(self.mounted)}-{directory.name}.ext4"
        with open(image, "wb") as file:
            file.truncate(ext4_image_bytes(size_bytes))  # sparse: blocks are taken as ext4 writes them
        result = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True, text=True)
        if result.returncode != 0:
            image.unlink(missing_ok=True)
            raise DiskBenchError(f"mkfs.ext4 failed on {image}: {result.stderr.strip() or result.returncode}")
        return image

    def unmount_all(self) -> None:
        while self.mounted:
            directory, image = self.mounted.pop()
            if subprocess.run(["umount", str(directory)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "--lazy", str(directory)], check=False)
            with contextlib.suppress(OSError):
                directory.rmdir()
            if image is not None:  # its loop device went with the mount (mount -o loop sets autoclear)
                image.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.images.rmdir()


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory`` (from /proc/mounts)."""
    prefix = str(directory.resolve())
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    return [point for point in points if point == prefix or point.startswith(prefix + "/")]


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM ends the run as Ctrl-C does, so the mounts and processes are cleaned up: inside
    ``asyncio.run`` its SIGINT handler cancels the run's tasks in order. Ctrl-C works even where a
    shell started the bench in the background, with SIGINT ignored."""
    def interrupt(signum, frame):
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
    previous = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


# --- the pipeline -----------------------------------------------------------------------------


class OnSmallDisks(Pipeline):
    """The harness's pipeline with the join's store on ``join_disk``; one stage at a time
    can be stopped (SIGSTOP) and continued."""

    def __init__(self, settings: Settings, work: Path, join_disk: Path) -> None:
        super().__init__(settings, work)
        self.join_disk = join_disk
        # Replaced, never changed in place: the sampler's thread reads it while stages stop and go.
        self.stopped: frozenset[str] = frozenset()

    def data_dir(self, stage: str) -> Path:
        return self.join_disk if stage == "join" else super().data_dir(stage)

    def pause(self, stage: str) -> None:
        os.killpg(self.workers[stage].process.pid, signal.SIGSTOP)
        self.stopped |= {stage}

    def resume(self, stage: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.workers[stage].process.pid, signal.SIGCONT)
        self.stopped -= {stage}

    def stop(self) -> None:
        for stage in self.stopped:
            self.resume(stage)  # a stopped process does not act on SIGTERM
        super().stop()


def stats_of(worker: Worker, timeout_s: float = STATS_TIMEOUT_S) -> dict:
    """The worker's stats page, or {} if it does not answer in time (busy, stopped)."""
    try:
        return worker.stats(timeout_s)
    except (OSError, ValueError):
        return {}


# --- the run ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Observed:
    """What the bench saw: the samples, the joined topic as read live, workers that died."""

    started: float = dataclasses.field(default_factory=time.monotonic)
    samples: list[dict] = dataclasses.field(default_factory=list)
    joined: JoinedTopic = dataclasses.field(default_factory=JoinedTopic)
    died: set[str] = dataclasses.field(default_factory=set)
    final_stats: dict[str, dict] = dataclasses.field(default_factory=dict)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class DiskRun:
    def __init__(self, options: DiskBenchOptions, settings: Settings, pipeline: OnSmallDisks,
                 broker: LocalBroker, disks: dict[str, Path]) -> None:
        self.options = options
        self.settings = settings
        self.pipeline = pipeline
        self.disks = disks
        self.plan = phases(options)
        self.broker_pid = broker.status().pid
        self.budgets = budgets(options)
        self.source = SteadyCameras(settings, options.streams, options.width, options.height, options.fps)
        self.observed = Observed()

    async def run(self) -> Observed:
        observed = self.observed
        background = [asyncio.create_task(self._sample_every_second()),
                      asyncio.create_task(self._read_joined())]
        producing = asyncio.create_task(self.source.run())
        background.append(asyncio.create_task(self._faults()))
        try:
            await asyncio.wait([background[-1], producing], return_when=asyncio.FIRST_COMPLETED)
            if producing.done():
                producing.result()  # the source failed: say why
            self.source.stopping.set()
            await producing
            await wait_for(self._drained, self.options.drain_timeout_s)
            await asyncio.sleep(2)  # a last sample of the settled state
            observed.final_stats = {stage: await asyncio.to_thread(stats_of, worker, FINAL_STATS_TIMEOUT_S)
                                    for stage, worker in self.pipeline.workers.items()}
        finally:
            self.source.stopping.set()
            for task in background + [producing]:
                task.cancel()
            await asyncio.gather(*background, producing, return_exceptions=True)
        return observed

    async def _faults(self) -> None:
        for phase in self.plan:
            if phase.name == STALL:
                await self._until(phase.start_s)
                self.pipeline.pause("infer")
                await self._until(phase.end_s)
                self.pipeline.resume("infer")
            elif phase.name == SLOW_SINK:
                await self._slow_sink(phase)
        await self._until(self.options.duration_s)

    async def _slow_sink(self, phase: Phase) -> None:
        period, stopped = self.options.sink_period_s, self.options.sink_period_s * self.options.sink_stopped_share
        await self._until(phase.start_s)
        while self.observed.elapsed() < phase.end_s:
            self.pipeline.pause("sink")
            await asyncio.sleep(min(stopped, max(0.0, phase.end_s - self.observed.elapsed())))
            self.pipeline.resume("sink")
            await asyncio.sleep(period - stopped)

    async def _until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - self.observed.elapsed()))

    def _drained(self) -> bool:
        """Every frame sent left the join, and the sink has read everything the join wrote."""
        joined = self.observed.joined
        sink = self.observed.samples[-1]["sink"] if self.observed.samples else {}
        return (self.source.produced <= set(joined.copies)
                and (sink.get("records_in") or 0) >= sum(joined.copies.values()))

    async def _sample_every_second(self) -> None:
        while True:
            began = time.monotonic()
            self.observed.samples.append(await asyncio.to_thread(self.sample))
            self.observed.died |= self.pipeline.exited()
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))

    def sample(self) -> dict:
        t = self.observed.elapsed()
        join, sink = (self._stats("join"), self._stats("sink"))
        return {
            "t": round(t, 2),
            "phase": phase_at(self.plan, t),
            "frames_sent": len(self.source.produced),
            "frames_out_of_join": len(self.observed.joined.copies),
            "broker": self._disk("broker"),
            "join": {**self._disk("join"), "rocksdb_disk_bytes": join.get("rocksdb_disk_bytes"),
                     "pending_bytes": join.get("join_pending_bytes"), "paused": join.get("disk_full_paused")},
            "sink": {**self._disk("sink"), "kept_bytes": sink.get("sink_disk_bytes"),
                     "records_in": sink.get("sink_records_in_total"), "paused": sink.get("sink_disk_full_paused")},
            "rss_bytes": {**{stage: rss_of(worker.process.pid) for stage, worker in self.pipeline.workers.items()},
                          "broker": rss_of(self.broker_pid) if self.broker_pid else 0},
            "stopped": sorted(self.pipeline.stopped),
        }

    def _disk(self, component: str) -> dict[str, int]:
        return {"used_bytes": shutil.disk_usage(self.disks[component]).used,
                "budget_bytes": self.budgets[component]}

    def _stats(self, stage: str) -> dict:
        if stage in self.pipeline.stopped:
            return {}  # a stopped worker answers nothing; its gauges are left out of this sample
        return stats_of(self.pipeline.workers[stage])

    async def _read_joined(self) -> None:
        def add(records: list) -> None:
            for record in records:
                self.observed.joined.add(wire.decode_joined(record.value))
        await follow(self.settings, topic_names(self.settings)["joined"], add, isolation_level="read_committed")


def run_disk_bench(options: DiskBenchOptions, settings: Settings) -> dict:
    """Run the scenario on fresh small file systems; returns the report (also written to
    ``<out>/report.json``, with ``<out>/disk.png``)."""
    require_root()
    work = options.work.resolve()
    if left := mounts_under(work):
        raise DiskBenchError(f"file systems from an earlier run are still mounted under {work}: {', '.join(left)}",
                         "unmount them first")
    for name in WORK_DIRS:  # only what an earlier run left: --work may hold other things
        shutil.rmtree(work / name, ignore_errors=True)
    sizes = filesystem_bytes(options)
    small_disks = SmallDisks(options.filesystem, work / "images")
    broker = LocalBroker(work / "broker", free_port())
    with terminate_as_interrupt(), contextlib.ExitStack() as cleanup:  # each step undone, last first
        cleanup.callback(small_disks.unmount_all)
        disks = {"broker": small_disks.mount(broker.log_dirs, sizes["broker"]),
                 "join": small_disks.mount(work / "join", sizes["join"]),
                 "sink": small_disks.mount(work / "sink", sizes["sink"])}
        cleanup.callback(broker.stop)
        broker.start(timeout=120)
        settings = settings.replace(broker=f"kafka://{broker.bootstrap}", topic_prefix=f"disk-{new_epoch()}.",
                                    stages=STAGES, out_dir=disks["sink"])
        pipeline = OnSmallDisks(settings, work, disks["join"])
        cleanup.callback(pipeline.stop)
        try:
            pipeline.start_all(timeout_s=180)
        except TimeoutError as error:
            raise DiskBenchError("the workers were not ready after 180 s",
                                 f"see their logs in {work / 'logs'}") from error
        load_before = os.getloadavg()
        observed = asyncio.run(DiskRun(options, settings, pipeline, broker, disks).run())
        observed.died |= pipeline.exited()
    report = build_report(options, sizes, observed, {"before": load_before, "after": os.getloadavg()},
                          topic_names(settings)["frames"])
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "report.json", report)
    draw_chart(out / "disk.png", report)
    return report


# --- the report -------------------------------------------------------------------------------

# The counters of each stage's final stats that the report keeps.
REPORTED = {
    "resize": ("resize_frames_in_total", "resize_frames_out_total", "resize_dead_lettered_total",
               "budget_dropped_records_total"),
    "infer": ("infer_frames_in_total", "infer_results_total", "infer_dead_lettered_total",
              "budget_dropped_records_total"),
    "join": ("join_frames_in_total", "join_results_in_total", "join_joined_total", "join_unmatched_frames_total",
             "join_late_results_total", "join_orphan_results_total", "join_duplicates_total",
             "join_dead_lettered_total", "budget_dropped_records_total", "disk_early_expired_total",
             "disk_full_pauses_total", "join_input_pauses_total"),
    "sink": ("sink_records_in_total", "sink_frames_written_total", "sink_duplicates_total",
             "sink_dead_lettered_total", "sink_retention_deleted_files_total", "sink_retention_deleted_bytes_total",
             "sink_disk_full_pauses_total", "sink_disk_full_deleted_files_total", "budget_dropped_records_total"),
}


def build_report(options: DiskBenchOptions, sizes: dict[str, int], observed: Observed, load: dict,
                 frames_topic: str) -> dict:
    samples = observed.samples
    budget_of = budgets(options)
    verdict = disk_verdict(samples, budget_of)
    outcomes = observed.joined.outcomes
    join = observed.final_stats.get("join", {})
    frames = accounting(
        sent=samples[-1]["frames_sent"] if samples else 0,
        matched=sum("joined" in outcome for outcome in outcomes.values()),
        unmatched=sum(outcome == {"unmatched"} for outcome in outcomes.values()),
        shed=int(join.get("budget_dropped_records_total", 0)),
        dead_lettered=int(join.get("join_dead_lettered_total", 0)),
        deleted_unread=deleted_unread_of(join, frames_topic))
    died = sorted(observed.died)
    return {
        "passed": passed(verdict, frames, died),
        "options": {**dataclasses.asdict(options), "out": str(options.out), "work": str(options.work)},
        "machine": {**machine(), "load_average_1_5_15_min": load},
        "phases": [dataclasses.asdict(phase) for phase in phases(options)],
        "filesystem_bytes": sizes,
        "disk": verdict,
        "frames": frames,
        "joined_records": sum(observed.joined.copies.values()),
        "joined_redelivered": sum(count - 1 for count in observed.joined.copies.values()),
        "workers_died": died,
        "peak_rss_bytes": {name: max(sample["rss_bytes"].get(name, 0) for sample in samples)
                           for name in (samples[0]["rss_bytes"] if samples else {})},
        "stages": {stage: {name: observed.final_stats.get(stage, {}).get(name) for name in names}
                   for stage, names in REPORTED.items()},
        "samples": samples,
    }


def draw_chart(path: Path, report: dict) -> None:
    """One panel per component (used bytes of its file system against its budget), and RSS."""
    samples = report["samples"]
    faults = ", ".join(f"{phase['name']} {phase['start_s']:.0f}-{phase['end_s']:.0f}s"
                       for phase in report["phases"] if phase["name"] in (STALL, SLOW_SINK))
    label = {"broker": "broker log dir", "join": "join data dir", "sink": "sink out dir"}
    panels = [line_image(f"{label[component]} ({faults})",
                         {f"{label[component]} used": [(s["t"], s[component]["used_bytes"]) for s in samples]},
                         limits={"budget": report["disk"][component]["budget_bytes"],
                                 "file system": report["filesystem_bytes"][component]})
              for component in COMPONENTS]
    panels.append(line_image("frames sent, not yet out of the join",
                             {"frames waiting": [(s["t"], s["frames_sent"] - s["frames_out_of_join"])
                                                 for s in samples]},
                             unit="frames", scale=1))
    processes = samples[0]["rss_bytes"] if samples else {}
    panels.append(line_image("RSS per process", {f"{name} RSS": [(s["t"], s["rss_bytes"].get(name, 0)) for s in samples]
                                                  for name in processes}))
    write_png(path, *panels)
