"""``streamapp demo``: the whole pipeline on a local broker, on real footage or checked against
ground truth.

It starts what is missing (the broker, the topics, one worker process per stage), publishes
real videos (by default the two samples, through YOLOv3-tiny; their files are fetched first) or,
with ``synthetic``, synthetic streams whose true boxes are known, reads the ``joined`` topic until
every frame has left the join, and writes the annotated videos, a contact sheet and
``summary.json``. It stops everything it started and succeeds only if every produced frame came
out exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from streamapp import assets, wire
from streamapp.agents.sink import VideoAssembler
from streamapp.agents.source import video_file_frames
from streamapp.cli.publisher import FramePublisher, Stream, synthetic_streams
from streamapp.errors import StreamappError
from streamapp.groundtruth import TruthBox, match_boxes
from streamapp.settings import STAGES, Settings
from streamapp.sinkfiles import frame_path, video_segments
from streamapp.tools.contactsheet import save_contact_sheet
from streamapp.tools.harness import Pipeline, delete_topics, ensure_broker, read_joined_until
from streamapp.tools.workers import Worker, wait_until
from streamapp.wire import new_epoch

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    synthetic: bool = False
    videos: tuple[Path, ...] = ()  # real footage; the sample videos when empty
    streams: int = 2  # synthetic streams
    frames: int = 300  # per stream; a video may end sooner
    width: int = 640  # of synthetic frames
    height: int = 480
    fps: float | None = None  # per stream; 0 publishes as fast as possible
    out: Path = Path("out")
    broker_port: int = 9092
    broker_dir: Path | None = None
    timeout_s: float = 300.0


class DemoFailed(StreamappError, RuntimeError):
    """The demo ran, but its output is not what it checks for."""


SYNTHETIC_FPS = 15.0
# Per video: what one YOLO infer worker keeps up with for two videos on a busy 2-core machine
# that also runs the other stages and the broker (see docs/benchmarks.md, Measurements).
REAL_FPS = 3.0


@dataclasses.dataclass
class Produced:
    # The true boxes of each frame published, None for real footage.
    truth: dict[wire.FrameId, list[TruthBox] | None] = dataclasses.field(default_factory=dict)
    started: float = 0.0


@dataclasses.dataclass
class Outcome:
    seen: Counter = dataclasses.field(default_factory=Counter)
    joined: int = 0
    unmatched: int = 0
    mismatches: int = 0
    foreign: int = 0
    ious: list[float] = dataclasses.field(default_factory=list)
    labels: Counter = dataclasses.field(default_factory=Counter)
    frames_with_boxes: int = 0


def run_demo(options: DemoOptions, settings: Settings | None = None) -> dict:
    """Run the demo; returns the summary (also written to ``<out>/summary.json``)."""
    out = options.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    run = new_epoch()
    given = settings or Settings.from_env()
    # Topics of its own, deleted at the end, unless STREAMAPP_TOPIC_PREFIX names topics an admin
    # made for it (a user who may not create topics).
    own_topics = not given.topic_prefix
    base = given.replace(topic_prefix=given.topic_prefix or f"demo-{run}.", out_dir=out, stages=STAGES)
    if not options.synthetic:
        options = dataclasses.replace(options, videos=options.videos or tuple(_fetch(assets.SAMPLES)))
        _fetch(assets.MODEL)
        base = base.replace(detector="yolo")
    # Outside the clean-up below: a broker that never started has no topics to delete.
    broker, base = ensure_broker(base, options.broker_port, options.broker_dir)
    pipeline = Pipeline(base, out, restart_logs=False)
    try:
        pipeline.start_all()
        workers = list(pipeline.workers.values())
        _announce_web_pages(workers)
        with StageClock(workers) as clock:
            produced = asyncio.run(_produce(options, base))
            outcome = asyncio.run(_collect(options, base, produced))
            elapsed = time.monotonic() - produced.started
            wait_until(lambda: _sink_caught_up(out, produced), 60, "the sink to write every frame")
        stats = {worker.stage: worker.stats() for worker in workers}
        pipeline.stop()
        summary = _summary(options, base, produced, outcome, stats, elapsed)
        summary["frames_per_s_per_stage"] = clock.rates(produced.started)
        _write_outputs(out, produced, summary)
    finally:
        pipeline.stop()
        if broker is not None:
            broker.stop()  # its data dir, topics included, stays for the next run
        elif own_topics:
            asyncio.run(delete_topics(base))
    if not summary["exactly_once"]:
        raise DemoFailed(f"not every frame came out exactly once; see {out / 'summary.json'}")
    return summary


def _fetch(files: tuple[assets.Asset, ...]) -> list[Path]:
    try:
        return assets.ensure(files, notify=lambda message: print(f"streamapp: {message}", file=sys.stderr))
    except assets.AssetError as exc:
        raise DemoFailed(f"{exc}\n`streamapp demo --synthetic` runs the pipeline without downloads") from None


class StageClock:
    """Samples how many frames each stage has finished, twice a second while the demo runs, so
    each stage's rate is its frames over the time it took to finish them (not the whole run's)."""

    FINISHED = {
        "resize": ("resize_frames_out_total",),
        "infer": ("infer_results_total",),
        "join": ("join_joined_total", "join_unmatched_frames_total"),
        "sink": ("sink_frames_written_total",),
    }

    def __init__(self, workers: list[Worker], interval_s: float = 0.5) -> None:
        self._workers = workers
        self._interval_s = interval_s
        self._done = threading.Event()
        # stage -> (frames finished, when that count was first seen)
        self._latest: dict[str, tuple[float, float]] = {}
        self._thread = threading.Thread(target=self._sample, name="stage-clock", daemon=True)

    def __enter__(self) -> StageClock:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            for worker in self._workers:
                with contextlib.suppress(OSError, ValueError):  # a busy worker answers next time
                    stats = worker.stats()
                    count = sum(stats.get(name, 0) for name in self.FINISHED[worker.stage])
                    if count != self._latest.get(worker.stage, (None,))[0]:
                        self._latest[worker.stage] = (count, time.monotonic())
            if self._done.wait(self._interval_s):
                return

    def rates(self, started: float) -> dict[str, float]:
        """Frames per second of each stage from ``started`` until it finished its last frame."""
        return {stage: round(count / max(at - started, 1e-3), 1) for stage, (count, at) in self._latest.items()}


def _announce_web_pages(workers: list[Worker]) -> None:
    """Where to watch the run live: the sink's preview page and every stage's metrics."""
    pages = [f"{worker.stage} metrics: http://127.0.0.1:{worker.settings.web_port}/metrics" for worker in workers]
    sink = next(worker for worker in workers if worker.stage == "sink")
    pages.insert(0, f"live preview: http://127.0.0.1:{sink.settings.web_port}/preview/")
    print("\n".join(f"streamapp: {page}" for page in pages), file=sys.stderr, flush=True)


async def _produce(options: DemoOptions, settings: Settings) -> Produced:
    produced = Produced(started=time.monotonic())
    fps = options.fps if options.fps is not None else SYNTHETIC_FPS if options.synthetic else REAL_FPS

    def remember(frame: wire.Frame, truth: list[TruthBox] | None) -> None:
        produced.truth[frame.id] = truth

    async with FramePublisher(settings) as publisher:
        await publisher.play(_sources(options, new_epoch(), fps), fps, on_frame=remember)
    log.info("published %d frames", len(produced.truth))
    return produced


def _sources(options: DemoOptions, epoch: int, fps: float) -> list[Stream]:
    """One iterator of (frame, true boxes) per stream: synthetic scenes, or videos without truth.

    Capture times follow ``fps``, the publishing rate; as fast as possible (0) keeps each
    video's own rate.
    """
    if options.synthetic:
        return synthetic_streams(options.streams, options.width, options.height, frames=options.frames,
                                 fps=fps or SYNTHETIC_FPS, epoch=epoch)
    return [((frame, None) for frame in video_file_frames(path, stream, epoch, max_frames=options.frames,
                                                          fps=fps or None))
            for path, stream in zip(options.videos, _stream_ids(options.videos), strict=True)]


def _stream_ids(videos: tuple[Path, ...]) -> list[str]:
    """Each video's name as a stream id (letters, digits, ``_.-``), numbered where names repeat."""
    names = [re.sub(r"[^A-Za-z0-9_.-]", "-", video.stem).lstrip("_.-")[:60] or "video" for video in videos]
    repeated = {name for name in names if names.count(name) > 1}
    return [f"{name}-{number}" if name in repeated else name for number, name in enumerate(names, 1)]


async def _collect(options: DemoOptions, settings: Settings, produced: Produced) -> Outcome:
    """Read ``joined`` until every produced frame is out (or the timeout), judging each record."""
    outcome = Outcome()
    await read_joined_until(settings, len(produced.truth), options.timeout_s,
                            lambda joined: _judge(joined, produced, outcome))
    return outcome


def _judge(joined: wire.Joined, produced: Produced, outcome: Outcome) -> None:
    frame_id = joined.frame.id
    if frame_id not in produced.truth:
        outcome.foreign += 1
        return
    outcome.seen[frame_id] += 1
    if outcome.seen[frame_id] > 1:
        return
    detections = joined.detections
    if detections is None:
        outcome.unmatched += 1
        return
    outcome.joined += 1
    if detections.id != frame_id:
        outcome.foreign += 1
    outcome.labels.update(box.label for box in detections.boxes)
    outcome.frames_with_boxes += bool(detections.boxes)
    truth = produced.truth[frame_id]
    if truth is None:
        return
    match = match_boxes(detections.boxes, truth)
    outcome.ious.extend(match.ious)
    if not match.ok:
        outcome.mismatches += 1


def _sink_caught_up(out: Path, produced: Produced) -> bool:
    return all(frame_path(out, frame_id).exists() for frame_id in produced.truth)


def _summary(options: DemoOptions, settings: Settings, produced: Produced, outcome: Outcome, stats: dict,
             elapsed: float) -> dict:
    join = stats["join"]
    frames = len(produced.truth)
    duplicates_out = sum(count - 1 for count in outcome.seen.values())
    summary = {
        "frames_produced": frames,
        "results_produced": int(stats["infer"].get("infer_results_total", 0)),
        "joined": outcome.joined,
        "unmatched_frames": outcome.unmatched,
        "orphan_results": int(join.get("join_orphan_results_total", 0)),
        "late_results": int(join.get("join_late_results_total", 0)),
        "duplicates": int(join.get("join_duplicates_total", 0)) + duplicates_out,
        "frames_missing": frames - len(outcome.seen),
        "foreign_records": outcome.foreign,
        "detector": settings.detector,
        "detections_per_class": dict(outcome.labels.most_common()),
        "frames_with_detections": outcome.frames_with_boxes,
        "elapsed_s": round(elapsed, 2),
        "frames_per_s": round(frames / elapsed, 1) if elapsed else 0.0,
        "infer_frames_per_batch": round(stats["infer"].get("infer_frames_in_total", 0)
                                        / max(1, stats["infer"].get("infer_batches_total", 0)), 2),
        "peak_rss_mb": {stage: round(values["process_peak_resident_memory_bytes"] / 1024**2, 1)
                        for stage, values in stats.items()},
        "dead_lettered": {stage: int(sum(v for k, v in values.items() if k.endswith("dead_lettered_total")))
                          for stage, values in stats.items()},
        "exactly_once": len(outcome.seen) == frames and duplicates_out == 0 and outcome.foreign == 0,
        "sources": [str(video) for video in options.videos] if not options.synthetic else
                   f"{options.streams} synthetic streams of {options.width}x{options.height}",
    }
    if options.synthetic:
        summary.update({
            "ground_truth_mismatches": outcome.mismatches,
            "mean_iou": round(sum(outcome.ious) / len(outcome.ious), 4) if outcome.ious else 0.0,
            "min_iou": round(min(outcome.ious), 4) if outcome.ious else 0.0,
        })
    return summary


def _write_outputs(out: Path, produced: Produced, summary: dict) -> None:
    runs = sorted({(frame_id.stream, frame_id.epoch) for frame_id in produced.truth})
    for stream, epoch in runs:  # segments the sink had not closed (it closes them when stopped)
        VideoAssembler(out, stream, epoch).finish()
    summary["videos"] = [str(segment.relative_to(out)) for run in runs for segment in video_segments(out, *run)]
    save_contact_sheet(out / "contact_sheet.png", [frame_path(out, frame_id) for frame_id in _sheet_frames(produced)])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _sheet_frames(produced: Produced, tiles: int = 16) -> list[wire.FrameId]:
    """Frames spread evenly over each stream run, the same number from each."""
    runs: dict[tuple[str, int], list[wire.FrameId]] = {}
    for frame_id in sorted(produced.truth, key=lambda frame_id: frame_id.index):
        runs.setdefault((frame_id.stream, frame_id.epoch), []).append(frame_id)
    per_run = max(1, tiles // len(runs))
    return [frames[round(number * (len(frames) - 1) / max(1, per_run - 1))]
            for frames in runs.values() for number in range(min(per_run, len(frames)))]
