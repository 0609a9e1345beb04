"""``streamapp bench join``: its arguments, and the markdown report on stdout."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

from streamapp.cli.arguments import (
    count_arg,
    count_or_zero_arg,
    rates_arg,
    resolution_arg,
    seconds_arg,
    steady_fps_arg,
)
from streamapp.tools.bench.join import (
    DEFAULT_RATES,
    EOS_SYSTEM,
    KSTREAMS_EOS_SYSTEM,
    LIBRDKAFKA_COPY_SYSTEM,
    SYSTEMS,
    TLS_SYSTEM,
    JoinBenchOptions,
    run_join_bench,
)
from streamapp.tools.bench.join_report import markdown

HELP = ("the join side by side with Kafka Streams, Quix Streams and a plain copy, on one broker and the "
        "same bytes")


def configure(join: argparse.ArgumentParser) -> None:
    join.description = (
        "Start a local broker and run, one after the other on the same bytes: a plain aiokafka "
        "consumer->producer copy (the limit), a Kafka Streams KStream-KStream join (built with Maven on "
        "first use), a Quix Streams interval join (the bench extra) and this project's join worker. Each "
        "drains a preloaded backlog, then takes paced "
        "live input at rising rates. Writes report.json, report.md and join.png under --out.")
    join.add_argument("--pairs", type=count_arg, default=20_000,
                      help="frame/result pairs in the backlog (default 20000)")
    join.add_argument("--rates", type=rates_arg, default=DEFAULT_RATES,
                      help="rising live rates in pairs per second, comma-separated; a system stops at its first "
                           f"rate not sustained (default {','.join(f'{rate:g}' for rate in DEFAULT_RATES)})")
    join.add_argument("--live-seconds", type=seconds_arg, default=10.0, help="seconds at each live rate (default 10)")
    join.add_argument("--warmup", type=seconds_arg, default=5.0,
                      help="seconds at the first live rate before the measured steps (default 5)")
    join.add_argument("--backlog-rate", type=steady_fps_arg, default=150.0,
                      help="the backlog's event time advances as if recorded live at this many pairs per "
                           "second (default 150)")
    join.add_argument("--refine", type=count_or_zero_arg, default=2,
                      help="after a system's first rate not sustained, this many steps halfway between its "
                           "highest rate sustained and its lowest not (default 2)")
    join.add_argument("--retries", type=count_or_zero_arg, default=1,
                      help="times a step not sustained is tried again once the system has caught up; a rate "
                           "counts as sustained when one of its tries is (default 1)")
    join.add_argument("--ttl", type=seconds_arg, default=5.0,
                      help="join window of Kafka Streams and Quix Streams, and STREAMAPP_JOIN_TTL of the worker "
                           "(default 5)")
    join.add_argument("--streams", type=count_arg, default=1,
                      help="cameras sharing each rate, e.g. 10 for 150 pairs/s as 10 cameras at 15 fps (default 1)")
    join.add_argument("--size", type=resolution_arg, default=(640, 480),
                      help="frame size WIDTHxHEIGHT (default 640x480)")
    join.add_argument("--systems", nargs="+",
                      choices=[*SYSTEMS, LIBRDKAFKA_COPY_SYSTEM, TLS_SYSTEM, EOS_SYSTEM, KSTREAMS_EOS_SYSTEM],
                      default=list(SYSTEMS),
                      help=f"which systems to run, in this order (default: the first four); {LIBRDKAFKA_COPY_SYSTEM} "
                           "is the plain copy on librdkafka (the bench extra), the limit of that client here; "
                           f"{TLS_SYSTEM} is "
                           "the worker over SASL_SSL (SCRAM-SHA-512) on a second listener of the same broker "
                           "(the load and the reader stay on PLAINTEXT), e.g. "
                           f"`--systems streamapp {TLS_SYSTEM}` for the cost of TLS and SASL; {EOS_SYSTEM} is "
                           f"the worker under exactly-once and {KSTREAMS_EOS_SYSTEM} Kafka Streams under "
                           "exactly_once_v2, their output read read_committed, e.g. "
                           f"`--systems streamapp {EOS_SYSTEM}` for the cost of exactly-once")
    join.add_argument("--tls-rounds", type=count_arg, default=1,
                      help=f"with both streamapp and {TLS_SYSTEM}: rounds of their backlog drains in the order "
                           "A B B A after an uncounted one of each, the TLS ratios being the geometric mean of each "
                           "pair's (default 1)")
    join.add_argument("--drain-rounds", type=count_or_zero_arg, default=0,
                      help="after every system has run: rounds of all their backlog drains, each round the systems "
                           "in order and then reversed (A B C D D C B A); the balanced ratios are the geometric "
                           "mean of each pass's, so a drift over the run cancels (default 0: none)")
    join.add_argument("--drain-timeout", type=seconds_arg, default=300.0,
                      help="seconds a backlog or a live step may take to come out (default 300)")
    join.add_argument("--out", type=Path, default=Path("out/bench-join"),
                      help="where report.json, report.md, join.png and logs/ go (default out/bench-join)")


def command_line(options) -> str:
    """The command that reruns these options, for the report."""
    return shlex.join([
        "streamapp", "bench", "join", "--pairs", str(options.pairs),
        "--rates", ",".join(f"{rate:g}" for rate in options.rates), "--live-seconds", f"{options.live_seconds:g}",
        "--warmup", f"{options.warmup_s:g}", "--refine", str(options.refine_steps),
        "--retries", str(options.retries),
        "--backlog-rate", f"{options.backlog_rate:g}", "--ttl", f"{options.ttl_s:g}",
        "--streams", str(options.streams), "--size", f"{options.width}x{options.height}",
        "--systems", *options.systems, "--tls-rounds", str(options.tls_rounds),
        "--drain-rounds", str(options.drain_rounds), "--out", str(options.out)])


def run(args: argparse.Namespace) -> int:
    width, height = args.size
    options = JoinBenchOptions(pairs=args.pairs, rates=args.rates, live_seconds=args.live_seconds,
                               warmup_s=args.warmup, refine_steps=args.refine, retries=args.retries,
                               backlog_rate=args.backlog_rate, ttl_s=args.ttl, streams=args.streams,
                               systems=tuple(args.systems),
                               width=width, height=height, out=args.out, drain_timeout_s=args.drain_timeout,
                               tls_rounds=args.tls_rounds, drain_rounds=args.drain_rounds)
    # SIGTERM unwinds like Ctrl-C, so the broker and the systems' processes are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    report = run_join_bench(options, command_line(options),
                            notify=lambda message: print(f"streamapp: {message}", file=sys.stderr))
    print(markdown(report))
    failed = [system for system in report["systems"].values() if system.get("error")]
    return 1 if failed else 0
