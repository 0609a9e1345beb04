"""The ``streamapp`` command.

Each subcommand is one :class:`~streamapp.cli.command.Command` in :data:`COMMANDS`: a name, a
one-line help, a function that adds its arguments to its ``argparse`` parser and a handler
``(args) -> exit code``. Adding a subcommand is adding one entry. The commands that run the
pipeline in production are here; the local broker, the demo, the benchmarks, record and replay
come with the tools distribution (``streamapp[tools]``, :data:`TOOL_COMMANDS`).

Every expected failure is a :class:`~streamapp.errors.StreamappError`, printed as one line
``streamapp: error: <what> — <fix>`` without a traceback; the command exits with its code
(:class:`~streamapp.errors.ExitCode`, docs/operations.md, Errors and exit codes).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from streamapp import assets
from streamapp.cli import upgrade
from streamapp.cli.arguments import count_arg, fps_arg, resolution_arg, stages_arg
from streamapp.cli.command import Command, CommandError, Configure, Run, note
from streamapp.errors import ExitCode, StreamappError, UsageError, one_line
from streamapp.kafka import client as kafkaclient
from streamapp.settings import Settings
from streamapp.wire import parse_stream_id

if TYPE_CHECKING:
    from streamapp.cli.publisher import Stream


class Parser(argparse.ArgumentParser):
    """A bad flag is one line like every other error: what is wrong, and where the flags are."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, f"see `{self.prog} --help`")


# --------------------------------------------------------------------------------------------
# streamapp topics create


def configure_topics(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Create the pipeline's topics with their partitions and configs "
                          "(settings from STREAMAPP_* variables) and check they are co-partitioned. "
                          "Prints how STREAMAPP_BROKER_DISK_BUDGET is split over the topics, and "
                          "refuses a budget they cannot fit in. It also creates the join table's "
                          "changelog of each stage set the workers will run the join in (each has its "
                          "own), so that a worker whose user may not create topics finds it. Topics "
                          "that exist are verified, not changed.")
    parser.add_argument("action", choices=["create"])
    parser.add_argument("--stages", action="append", type=stages_arg, dest="layouts", metavar="STAGES",
                        help="the STREAMAPP_STAGES of a kind of worker the pipeline will run, e.g. `join` or "
                             "`resize,infer,join,sink`; repeat it for each (default: all four stages in one "
                             "worker, one worker per stage, and this process's STREAMAPP_STAGES)")


def run_topics(args: argparse.Namespace) -> int:
    from streamapp.topicadmin import ensure_topics
    from streamapp.topics import DOCUMENTED_LAYOUTS, disk_plan

    settings = Settings.from_env()
    print(disk_plan(settings).describe())  # refuses a plan that cannot fit before touching the broker
    layouts = args.layouts or [*DOCUMENTED_LAYOUTS, settings.stages]
    created = asyncio.run(ensure_topics(settings, layouts=layouts))
    print(f"topics ready on {settings.bootstrap_servers}; created: {', '.join(created) or 'none'}")
    return 0


# --------------------------------------------------------------------------------------------
# streamapp produce


def configure_produce(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Publish frames to the frames topic: a synthetic scene with known boxes, "
                          "or a video file. Every run is a new epoch. Settings from STREAMAPP_*.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--synthetic", action="store_true", help="moving coloured objects")
    source.add_argument("--video", type=Path, help="any video file OpenCV can read")
    parser.add_argument("--streams", type=count_arg, default=1, help="synthetic streams (default 1)")
    parser.add_argument("--frames", type=count_arg, default=300, help="frames per stream (default 300)")
    parser.add_argument("--fps", type=fps_arg, default=15.0,
                        help="frames per second per stream; 0 = as fast as possible (default 15)")
    parser.add_argument("--size", type=resolution_arg, default=(640, 480),
                        help="synthetic frame size WIDTHxHEIGHT (default 640x480)")
    parser.add_argument("--stream", default="cam", help="stream id, or prefix when numbered (default cam)")
    parser.add_argument("--ground-truth", type=Path, help="write the true boxes as JSON lines here")


def run_produce(args: argparse.Namespace) -> int:
    from streamapp.agents.source import video_file_frames
    from streamapp.cli.progress import Progress
    from streamapp.cli.publisher import FramePublisher, synthetic_streams
    from streamapp.groundtruth import GroundTruthWriter
    from streamapp.wire import new_epoch

    settings = Settings.from_env()
    epoch = new_epoch()
    sources: list[Stream]
    try:
        if args.video:
            sources = [((frame, None) for frame in video_file_frames(
                args.video, parse_stream_id(args.stream), epoch, max_frames=args.frames))]
        else:
            width, height = args.size
            sources = synthetic_streams(args.streams, width, height, frames=args.frames, fps=args.fps or 15.0,
                                        epoch=epoch, prefix=args.stream)
    except ValueError as exc:  # a stream id
        raise UsageError(str(exc), "see `streamapp produce --help`") from None
    truth = GroundTruthWriter(args.ground_truth) if args.ground_truth else None

    async def publish() -> int:
        # A video may end before --frames; the bar then stops short of its total. Connected
        # first, so that no broker is an error without a bar.
        async with FramePublisher(settings) as publisher:
            with Progress("produce", total=args.frames * len(sources), unit="frames") as progress:
                def published(frame, boxes) -> None:
                    if truth is not None:
                        truth.write(frame.id, boxes)
                    progress.advance()

                await publisher.play(sources, args.fps, on_frame=published)
                return publisher.published

    try:
        began = time.monotonic()
        published = asyncio.run(publish())
    finally:
        if truth is not None:
            truth.close()
    print(f"published {published} frames (epoch {epoch}) to {settings.bootstrap_servers} "
          f"in {time.monotonic() - began:.1f}s")
    return 0


# --------------------------------------------------------------------------------------------
# streamapp model / streamapp samples: fetch pinned files once into the cache


def fetch_command(name: str, files: Sequence[assets.Asset], what: str) -> Command:
    """A command that fetches ``files`` (when missing or corrupt) and prints where they are."""

    def configure(parser: argparse.ArgumentParser) -> None:
        parser.description = (f"Fetch {what} once into {assets.assets_home()} (set "
                              f"STREAMAPP_ASSETS_HOME to move it), checked against pinned sha256 "
                              f"sums, each with its origin and license in <file>.ORIGIN.txt.")

    def run(args: argparse.Namespace) -> int:
        for path in assets.ensure(files, notify=note):
            print(path)
        return 0

    return Command(name, f"fetch {what} (once) and print where they are", configure, run)


# --------------------------------------------------------------------------------------------
# The tools distribution's commands (streamapp/tools/commands.py), named here so that without the
# tools `streamapp --help` still lists them and each says in one line what to install.

TOOLS = "streamapp.tools.commands"
TOOL_COMMANDS = {
    "broker": "run a local Kafka broker for development and tests",
    "demo": "run the whole pipeline on a local broker and check the output",
    "bench": "long-running measurements (chaos: crashes under load; join: against Kafka Streams; "
             "soak: memory and disk; disk: every disk budget on small file systems)",
    "record": "record topics (or synthetic cameras) to a recording file",
    "replay": "publish recordings to topics, paced, through seeded scenario transforms",
}


class ToolsMissing(CommandError):
    """A tool's command where only the production package is installed."""

    def __init__(self, command: str) -> None:
        super().__init__(f"`streamapp {command}` comes with the streamapp tools, which are not installed",
                         "pip install 'streamapp[tools]' (in a checkout: pip install ./streamapp/tools)")


def tool_handlers() -> dict[str, tuple[Configure, Run]] | None:
    """The tools' arguments and handler of each command, or None when the tools are not installed."""
    try:
        return importlib.import_module(TOOLS).HANDLERS
    except ModuleNotFoundError as exc:
        if exc.name not in ("streamapp.tools", TOOLS):  # the tools are there but something they need is not
            raise
        return None


def stand_in(name: str) -> Command:
    """A tool's command without the tools: listed, and refusing to run (:func:`main` refuses
    whatever follows its name, flags the stand-in cannot know included)."""

    def run(args: argparse.Namespace) -> int:
        raise ToolsMissing(name)

    return Command(name, f"{TOOL_COMMANDS[name]} [needs streamapp[tools]]", lambda parser: None, run)


TOOL_HANDLERS = tool_handlers()

# --------------------------------------------------------------------------------------------

COMMANDS: list[Command] = [
    Command("topics", "create the pipeline's topics and check co-partitioning", configure_topics, run_topics),
    Command("produce", "publish a synthetic scene or a video file to the frames topic",
            configure_produce, run_produce),
    fetch_command("model", assets.MODEL, "the YOLOv3-tiny model files (STREAMAPP_DETECTOR=yolo)"),
    fetch_command("samples", assets.SAMPLES, "the sample videos (vtest.avi, bikes.mp4)"),
    Command("check-upgrade", upgrade.HELP, upgrade.configure, upgrade.run),
    *(Command(name, help, *TOOL_HANDLERS[name]) if TOOL_HANDLERS else stand_in(name)
      for name, help in TOOL_COMMANDS.items()),
]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="streamapp", description="Video analytics on Faust and Kafka.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        kafkaclient.install()
        if TOOL_HANDLERS is None and argv and argv[0] in TOOL_COMMANDS:
            raise ToolsMissing(argv[0])  # whatever follows: the flags are the tools' to know
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("a command is required", "see `streamapp --help`")
        return args.run(args)
    except SystemExit as exc:  # --help, which argparse has printed
        return exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    except StreamappError as exc:
        print(f"streamapp: error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("streamapp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
