"""``streamapp record`` and ``streamapp replay``: the command-line side of recordings and replay."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path

from streamapp.cli.arguments import count_arg, fps_arg, resolution_arg
from streamapp.errors import UsageError
from streamapp.settings import Settings
from streamapp.tools.replay.capture import RecordLimits, record_topics, synthetic_records
from streamapp.tools.replay.format import RecordingWriter
from streamapp.tools.replay.predict import predict
from streamapp.tools.replay.publish import publish
from streamapp.tools.replay.scenario import ReplayPlan, Scenario
from streamapp.tools.replay.transforms import SPEC_HELP
from streamapp.topics import topic_names
from streamapp.units import UnitError, milliseconds, parse_duration
from streamapp.wire import parse_stream_id

# Where synthetic recordings start; fixed, so that a regenerated recording has the same keys.
SYNTHETIC_START_MS = 1_800_000_000_000


def duration_arg(text: str) -> float:
    try:
        return parse_duration(text, name="duration")
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def speed_arg(text: str) -> float | None:
    if text == "max":
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--speed must be a number > 0 or 'max', got {text!r}")
    return value


def stream_prefix_arg(text: str) -> str:
    try:
        return parse_stream_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rename_arg(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError(f"--rename takes OLD=NEW, got {text!r}")
    return old, new


# --------------------------------------------------------------------------------------------
# streamapp record


def configure_record(parser: argparse.ArgumentParser) -> None:

    parser.description = (
        "Record topics (every partition, from the beginning; keys, headers, timestamps, "
        "partitions and offsets) to a recording file, one record at a time. Stops at the end "
        "the topics had when recording started, or after --max-records / --duration. "
        "With --synthetic, records what the pipeline's frames and detections topics would hold "
        "for synthetic cameras, computed in-process without a broker. Format: docs/recording-format.md.")
    parser.add_argument("--out", type=Path, required=True, help="the recording file to write")
    parser.add_argument("--topics", nargs="+", metavar="TOPIC",
                        help="topics to record (default: the join's inputs, frames and detections, "
                             "with STREAMAPP_TOPIC_PREFIX)")
    parser.add_argument("--max-records", type=count_arg, help="stop after this many records")
    parser.add_argument("--duration", type=duration_arg, help="stop after this long, e.g. 30s")
    parser.add_argument("--follow", action="store_true",
                        help="keep recording new records past the current end (until --max-records, "
                             "--duration or Ctrl-C)")
    synthetic = parser.add_argument_group("synthetic recordings")
    synthetic.add_argument("--synthetic", action="store_true", help="record synthetic cameras instead of topics")
    synthetic.add_argument("--streams", type=count_arg, default=2, help="how many cameras (default 2)")
    synthetic.add_argument("--stream", type=stream_prefix_arg, default="cam",
                           help="camera name prefix: cam1, cam2, ... (default cam)")
    synthetic.add_argument("--frames", type=count_arg, default=120, help="frames per camera (default 120)")
    synthetic.add_argument("--size", type=resolution_arg, default=(160, 120), help="default 160x120")
    synthetic.add_argument("--fps", type=fps_arg, default=15.0, help="per camera (default 15)")
    synthetic.add_argument("--latency", type=duration_arg, default=0.1,
                           help="how long after its frame each result is stamped (default 100ms)")


def run_record(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    began = time.monotonic()
    if args.synthetic:
        if args.topics or args.follow or args.max_records or args.duration:
            raise UsageError("--synthetic takes no --topics, --follow, --max-records or --duration",
                             "see `streamapp record --help`")
        try:
            parse_stream_id(f"{args.stream}{args.streams}")
        except ValueError as exc:
            raise UsageError(str(exc), "see `streamapp record --help`") from None
        names = topic_names(settings)
        width, height = args.size
        records = synthetic_records(settings, streams=args.streams, frames=args.frames, width=width,
                                    height=height, fps=args.fps or 15.0,
                                    latency_ms=milliseconds(args.latency), start_ms=SYNTHETIC_START_MS,
                                    prefix=args.stream)
        renamed = (_renamed(record, names) for record in records)
        partitions = {names["frames"]: settings.partitions, names["detections"]: settings.partitions}
        note = (f"synthetic: {args.streams} cameras ({args.stream}1...) x {args.frames} frames, {width}x{height}, "
                f"{args.fps} fps, results {args.latency * 1000:.0f} ms after their frames")
        with RecordingWriter(args.out, partitions, note=note) as writer:
            count = writer.write_all(renamed)
    else:
        if args.follow and not (args.max_records or args.duration):
            print("streamapp: recording until Ctrl-C")
        names = topic_names(settings)
        topics = args.topics or [names["frames"], names["detections"]]
        limits = RecordLimits(args.max_records, args.duration, args.follow)
        count = asyncio.run(record_topics(settings, topics, args.out, limits))
    size = args.out.stat().st_size
    print(f"recorded {count} records ({size / 1024**2:.1f} MiB) to {args.out} in {time.monotonic() - began:.1f}s")
    return 0


def _renamed(record, names: dict[str, str]):
    return dataclasses.replace(record, topic=names[record.topic])


# --------------------------------------------------------------------------------------------
# streamapp replay


def configure_replay(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Publish one or more recordings (several are interleaved by time) to their topics or "
        "renamed ones, keeping keys, headers and partitions, at the recorded pace x --speed. "
        "Transforms (applied in order, seeded):\n" + SPEC_HELP)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("recordings", nargs="*", type=Path, metavar="RECORDING")
    parser.add_argument("--scenario", type=Path,
                        help="a scenario file: its recordings (unless given), transforms, seed and speed")
    parser.add_argument("-t", "--transform", action="append", default=[], metavar="SPEC",
                        help="a transform, e.g. drop:results:0.1 (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the transforms (default 0)")
    parser.add_argument("--speed", type=speed_arg, default=1.0,
                        help="pace factor: 2 is twice as fast, 'max' as fast as possible (default 1)")
    parser.add_argument("--rename", type=rename_arg, action="append", default=[], metavar="OLD=NEW",
                        help="publish the records of topic OLD to NEW (repeatable)")
    parser.add_argument("--by-key", action="store_true",
                        help="partition by key instead of keeping recorded partitions")
    parser.add_argument("--fresh-epochs", action="store_true",
                        help="move every epoch to now, so a replay is new to a join that saw it before")


def run_replay(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    plan = plan_from_args(args, settings)
    sent = asyncio.run(publish(plan.records(), settings, plan.target, speed=plan.speed))
    expected = predict(plan.records(), settings, speed=plan.speed)
    print(f"published {sent} records")
    if expected.counts["frames_in"] or expected.counts["results_in"]:
        print("the join should count: " + json.dumps(expected.counts))
    return 0


def plan_from_args(args: argparse.Namespace, settings: Settings) -> ReplayPlan:
    recordings, specs, seed, speed = list(args.recordings), list(args.transform), args.seed, args.speed
    if args.scenario is not None:
        scenario = Scenario.load(args.scenario)
        recordings = recordings or scenario.recordings
        specs = scenario.transforms + specs
        seed, speed = scenario.seed, scenario.speed
    return ReplayPlan(recordings, specs, seed=seed, speed=speed, settings=settings,
                      rename=dict(args.rename), by_key=args.by_key, fresh_epochs=args.fresh_epochs)
