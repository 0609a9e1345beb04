"""``streamapp bench infer``: how fast YOLOv3-tiny infers, alone and as infer workers on a broker.

Two numbers per network input size: the detector's median time per frame in this process (one
frame per call, no broker), and the frames per second that ``--workers`` infer worker processes get
through a backlog of the clip's scaled frames. The backlog is made first (a resize worker scales
every frame before the infer workers start), so only inference is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

from streamapp import assets
from streamapp.agents.infer import YoloDetector, infer_frame
from streamapp.agents.resize import resize_frame
from streamapp.agents.source import video_file_frames
from streamapp.cli.arguments import count_arg
from streamapp.cli.publisher import FramePublisher
from streamapp.settings import Settings
from streamapp.tools.bench.report import write_json
from streamapp.tools.harness import own_broker
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker, wait_until
from streamapp.topicadmin import ensure_topics
from streamapp.wire import new_epoch

HELP = "YOLOv3-tiny per frame in process, and frames/s of infer workers through a backlog"
DETECTOR_FRAMES = 60  # frames timed in process per input size


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (HELP + ". Starts a local broker, publishes vtest.avi (fetched like "
                          "`streamapp samples`), and writes report.json under --out.")
    parser.add_argument("--inputs", type=count_arg, nargs="+", default=[320, 416],
                        help="network input sizes, multiples of 32 (default 320 416)")
    parser.add_argument("--workers", type=count_arg, nargs="+", default=[1, 2],
                        help="infer worker counts to time (default 1 2)")
    parser.add_argument("--frames", type=count_arg, default=400, help="frames of the clip (default 400)")
    parser.add_argument("--out", type=Path, default=Path("out/bench-infer"), help="default out/bench-infer")


def run(args: argparse.Namespace) -> int:
    video = assets.ensure([assets.VTEST])[0]
    assets.ensure(assets.MODEL)
    args.out.mkdir(parents=True, exist_ok=True)
    per_frame_ms: dict[int, float] = {}
    workers_fps: dict[str, float] = {}
    report = {"clip": f"{video.name}, {args.frames} frames", "per_frame_ms": per_frame_ms, "workers_fps": workers_fps}
    base = Settings(resize_width=320, resize_height=240)
    scaled = [resize_frame(frame, base.resize_width, base.resize_height)
              for frame in itertools.islice(video_file_frames(video, "bench", 1), DETECTOR_FRAMES)]
    for size in args.inputs:
        per_frame_ms[size] = round(_detector_ms(YoloDetector(input_size=size), scaled), 1)
    broker = own_broker(Path(tempfile.mkdtemp(prefix="broker-", dir=args.out)))
    try:
        for size, workers in itertools.product(args.inputs, args.workers):
            settings = base.replace(broker=f"kafka://{broker.bootstrap}", detector="yolo", yolo_input=size,
                                    topic_prefix=f"bench-infer-{new_epoch()}.")
            fps = _workers_fps(settings, video, args.frames, workers, args.out)
            workers_fps[f"input {size}, {workers} worker{'s' * (workers > 1)}"] = fps
            print(f"input {size}, {workers} infer worker(s): {fps} frames/s", flush=True)
    finally:
        broker.stop()
    write_json(args.out / "report.json", report)
    print(json.dumps(report, indent=2))
    return 0


def _detector_ms(detector: YoloDetector, frames) -> float:
    """The median time per frame, one frame per call: robust to other work on a shared machine."""
    infer_frame(frames[0], detector)  # the first pass allocates the network's buffers
    times = []
    for frame in frames:
        started = time.perf_counter()
        infer_frame(frame, detector)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _workers_fps(settings: Settings, video: Path, frames: int, count: int, out: Path) -> float:
    """Frames per second of ``count`` infer workers from their first result to their last."""
    asyncio.run(ensure_topics(settings))
    logs = Path(tempfile.mkdtemp(prefix="logs-", dir=out))
    resize = Worker("resize", settings.replace(stages=("resize",), web_port=free_port(),
                                               data_dir=logs / "resize"), logs)
    workers: list[Worker] = []
    try:
        published = asyncio.run(_publish(settings, video, frames))
        wait_until(lambda: resize.ready() and _total([resize], "resize_frames_out_total") >= published,
                   600, "the resize worker to scale every frame")
        workers = [Worker("infer", settings.replace(stages=("infer",), web_port=free_port(),
                                                    data_dir=logs / f"infer-{number}"), logs)
                   for number in range(count)]
        wait_until(lambda: _total(workers, "infer_results_total") > 0, 600, "the first result")
        first = time.monotonic(), _total(workers, "infer_results_total")
        wait_until(lambda: _total(workers, "infer_results_total") >= published, 1800, "every result")
        return round((published - first[1]) / (time.monotonic() - first[0]), 1)
    finally:
        for worker in [resize, *workers]:
            worker.stop()


def _total(workers: list[Worker], counter: str) -> int:
    return sum(_counter(worker, counter) for worker in workers if worker.ready())


def _counter(worker: Worker, counter: str) -> int:
    try:
        return int(worker.stats().get(counter, 0))
    except OSError:  # its web server is not up yet
        return 0


async def _publish(settings: Settings, video: Path, frames: int) -> int:
    async with FramePublisher(settings) as publisher:
        frames_of = video_file_frames(video, "bench", new_epoch(), max_frames=frames)
        await publisher.play([((frame, None) for frame in frames_of)], None)
        return publisher.published
