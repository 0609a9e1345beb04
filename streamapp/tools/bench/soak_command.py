"""``streamapp bench soak``: its arguments, and a summary per scenario on stdout."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamapp.cli.arguments import count_arg, fps_arg, resolution_arg, seconds_arg, size_arg

SCENARIOS = ("steady", "stall", "slow-sink", "4k")


HELP = "frame/result pairs through the join worker, memory and disk sampled every second"


def configure(soak: argparse.ArgumentParser) -> None:

    soak.description = ("Start a local broker and a join worker, publish frame/result pairs, sample RSS, "
                        "pending state, RocksDB and topic bytes once a second, and write report.json and "
                        "rss.png, disk.png, pending.png per scenario under --out.")
    soak.add_argument("--pairs", type=count_arg, default=100_000, help="frame/result pairs (default 100000)")
    soak.add_argument("--size", type=resolution_arg, default=(640, 480),
                      help="frame size WIDTHxHEIGHT, e.g. 640x480 or 1280x720 (default 640x480; 4k uses 3840x2160)")
    soak.add_argument("--rate", type=fps_arg, default=150.0,
                      help="pairs per second, e.g. 10 cameras at 15 fps; 0 = as fast as possible (default 150)")
    soak.add_argument("--scenario", choices=SCENARIOS + ("all",), default="steady",
                      help="steady, stall (no results for --stall seconds), slow-sink (a reader of joined "
                           "at a third of the rate), 4k (3840x2160, a 50th of the pairs at a 25th of the rate), "
                           "or all of them in turn (default steady)")
    soak.add_argument("--stall", type=seconds_arg, default=60.0, help="seconds inference stalls (default 60)")
    soak.add_argument("--baseline", choices=["naive"], help="also run a naive in-memory dict join on the same input")
    soak.add_argument("--memory-budget", type=size_arg, default=512 * 1024**2,
                      help="STREAMAPP_MEMORY_BUDGET of the join worker (default 512MiB)")
    soak.add_argument("--out", type=Path, default=Path("docs/benchmarks/soak"),
                      help="where reports and charts go (default docs/benchmarks/soak)")
    soak.add_argument("--bootstrap", help="use this broker instead of starting one (topic bytes are then not measured)")


def run(args: argparse.Namespace) -> int:
    from streamapp.tools.bench.soak import run_soak
    from streamapp.tools.bench.soak_state import SoakOptions

    width, height = args.size
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    for scenario in scenarios:
        report = run_soak(SoakOptions(
            pairs=args.pairs, width=width, height=height, rate=args.rate, scenario=scenario,
            stall_s=args.stall, baseline=args.baseline, memory_budget_bytes=args.memory_budget,
            out=args.out, bootstrap=args.bootstrap))
        print(json.dumps({"scenario": scenario, "targets": report["targets"], "ours": report["ours"],
                          "naive": report.get("naive")}, indent=2))
    return 0
