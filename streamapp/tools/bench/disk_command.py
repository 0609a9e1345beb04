"""``streamapp bench disk``: its arguments, and the verdict on stdout (exit 1 if it failed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamapp.cli.arguments import count_arg, resolution_arg, size_arg, steady_fps_arg
from streamapp.tools.bench.disk_scenario import FILESYSTEMS, DiskBenchOptions
from streamapp.units import UnitError, parse_duration

HELP = "the whole pipeline on small real file systems through an inference stall and a slow sink"


def duration_arg(text: str) -> float:
    """A duration with its unit (``90s``, ``20min``), above zero."""
    try:
        seconds = parse_duration(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration above 0, got {text!r}")
    return seconds


def share_arg(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}") from None
    if not 0 < share < 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1 (exclusive), got {text}")
    return share


def filesystem_arg(text: str) -> str:
    if text not in FILESYSTEMS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(FILESYSTEMS)}, got {text!r}")
    return text


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = DiskBenchOptions()
    parser.description = (
        "As root: mount a small file system (--fs) for the broker's log dir, the join's data dir and the "
        "sink's out dir, each sized from its budget; run a local broker and one worker per stage; play "
        "synthetic cameras while inference is stopped (SIGSTOP) for --stall and then the sink is slowed "
        "(stopped --sink-stopped of every 4 s) for --slow-sink, in the middle of --duration; sample every "
        "file system's used bytes and every process's RSS once a second; unmount everything; write "
        "report.json and disk.png to --out. "
        "Exits 1 unless no worker died, every disk plateaued below its budget and every frame is accounted for.")
    parser.add_argument("--duration", type=duration_arg, default=defaults.duration_s,
                        help="how long the cameras play, e.g. 20min or 3min (default 20min)")
    parser.add_argument("--stall", type=duration_arg, default=defaults.stall_s,
                        help="how long inference is stopped (default 5min)")
    parser.add_argument("--slow-sink", type=duration_arg, default=defaults.slow_s,
                        help="how long the sink is slowed, right after the stall (default 5min)")
    parser.add_argument("--sink-stopped", type=share_arg, default=defaults.sink_stopped_share,
                        help="share of every 4 s the slowed sink is stopped (default 0.75)")
    parser.add_argument("--drain", type=duration_arg, default=defaults.drain_timeout_s,
                        help="the longest to wait, once the cameras stop, for every frame to leave the join "
                             "and the sink to read all of it (default 10min)")
    parser.add_argument("--streams", type=count_arg, default=defaults.streams, help="synthetic cameras (default 2)")
    parser.add_argument("--fps", type=steady_fps_arg, default=defaults.fps,
                        help="frames per second per camera (default 15)")
    parser.add_argument("--size", type=resolution_arg, default=(defaults.width, defaults.height),
                        help="frame size WIDTHxHEIGHT (default 320x240)")
    parser.add_argument("--partitions", type=count_arg, default=defaults.partitions,
                        help="STREAMAPP_PARTITIONS of every topic (default 2)")
    parser.add_argument("--broker-budget", type=size_arg, default=defaults.broker_budget_bytes,
                        help="STREAMAPP_BROKER_DISK_BUDGET (default 1536MiB: at the default rate the frames topic "
                             "keeps about 6 minutes)")
    parser.add_argument("--join-budget", type=size_arg, default=defaults.join_budget_bytes,
                        help="STREAMAPP_DISK_BUDGET of the join (default 128MiB)")
    parser.add_argument("--sink-budget", type=size_arg, default=defaults.sink_budget_bytes,
                        help="sink disk per stream; STREAMAPP_SINK_DISK_BUDGET is --streams x it (default 128MiB)")
    parser.add_argument("--reserve", type=size_arg, default=defaults.reserve_bytes,
                        help="STREAMAPP_DISK_RESERVE, also added to each file system (default 64MiB)")
    parser.add_argument("--max-frame-bytes", type=size_arg, default=defaults.max_frame_bytes,
                        help="STREAMAPP_MAX_FRAME_BYTES (default 1MiB)")
    parser.add_argument("--fs", type=filesystem_arg, default=defaults.filesystem,
                        help="what each small disk is: tmpfs, or ext4 made in a sparse image file under --work and "
                             "loop-mounted (needs mkfs.ext4); all removed afterwards (default tmpfs)")
    parser.add_argument("--out", type=Path, default=defaults.out,
                        help="report and chart (default docs/benchmarks/disk)")
    parser.add_argument("--work", type=Path, default=defaults.work,
                        help="mount points and worker logs; emptied at the start (default out/bench-disk)")


def options_from(args: argparse.Namespace) -> DiskBenchOptions:
    width, height = args.size
    return DiskBenchOptions(
        streams=args.streams, fps=args.fps, width=width, height=height, duration_s=args.duration,
        stall_s=args.stall, slow_s=args.slow_sink, sink_stopped_share=args.sink_stopped,
        partitions=args.partitions, max_frame_bytes=args.max_frame_bytes, broker_budget_bytes=args.broker_budget,
        join_budget_bytes=args.join_budget, sink_budget_bytes=args.sink_budget, reserve_bytes=args.reserve,
        drain_timeout_s=args.drain, out=args.out, work=args.work, filesystem=args.fs)


def run(args: argparse.Namespace) -> int:
    from streamapp.settings import Settings
    from streamapp.tools.bench.disk import run_disk_bench
    from streamapp.tools.bench.disk_scenario import check_options

    options = options_from(args)
    settings = check_options(options, Settings.from_env())
    report = run_disk_bench(options, settings)
    print(json.dumps({key: report[key] for key in ("passed", "disk", "frames", "workers_died", "peak_rss_bytes",
                                                   "stages")}, indent=2))
    return 0 if report["passed"] else 1
