"""The ``streamapp`` command.

Each subcommand is one :class:`Command` in :data:`COMMANDS`: a name, a one-line help, a function
that adds its arguments to its ``argparse`` parser and a handler ``(args) -> exit code``. Adding a
subcommand is adding one entry.

Every expected failure is a :class:`~streamapp.errors.StreamappError`, printed as one line
``streamapp: error: <what> — <fix>`` without a traceback; the command exits with its code
(:class:`~streamapp.errors.ExitCode`: 2 for a bad flag or setting, 3 ``broker status`` when no
broker runs, 4 no Java, 5 no Maven, 6 no broker answers, 7 port busy, 1 anything else).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from streamapp import assets
from streamapp.errors import ExitCode, StreamappError, UsageError, one_line
from streamapp.kafka import client as kafkaclient
from streamapp.settings import Settings
from streamapp.tools import chaos, upgrade
from streamapp.tools.arguments import (
    count_arg,
    fps_arg,
    port_arg,
    resolution_arg,
    seconds_arg,
    size_arg,
    stages_arg,
)
from streamapp.tools.bench import disk_command, infer as infer_bench, join_command, soak_command
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.cluster import CLUSTER_NODES, LocalCluster, default_cluster_dir
from streamapp.tools.localkafka.common import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PORT, KAFKA_VERSION
from streamapp.tools.localkafka.locations import default_data_dir, kafka_home
from streamapp.tools.localkafka.processes import read_properties
from streamapp.tools.localkafka.security import (
    ADMIN,
    MUTUAL_TLS,
    PIPELINE,
    SASL_SSL,
    SECURITY_MODES,
    USERS,
    BrokerSecurity,
    export_lines,
)
from streamapp.tools.replay import commands as replay_commands
from streamapp.units import format_bytes
from streamapp.wire import parse_stream_id

if TYPE_CHECKING:
    from streamapp.tools.demo import Source


class CommandError(StreamappError, RuntimeError):
    """A subcommand failed in an expected way; the message is shown as is."""


EXPECTED_ERRORS: tuple[type[Exception], ...] = (StreamappError,)


class Parser(argparse.ArgumentParser):
    """A bad flag is one line like every other error: what is wrong, and where the flags are."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, f"see `{self.prog} --help`")


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _note(message: str) -> None:
    print(f"streamapp: {message}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# streamapp broker start|stop|status


def configure_broker(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"A local single-node Apache Kafka {KAFKA_VERSION} broker (KRaft) on 127.0.0.1, or with "
        f"--nodes {CLUSTER_NODES} a three-node cluster (every topic on all three, min.insync.replicas 2), "
        f"run from the Maven Central jars (fetched once into {kafka_home()}/libs; set "
        f"STREAMAPP_KAFKA_HOME to move them). Needs Java 17+, and Maven for the first start."
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="{start,stop,status,env}")
    for action, help_text in (("start", "start the broker and wait until it answers"),
                              ("stop", "stop the broker (SIGTERM, then SIGKILL after --timeout)"),
                              ("status", "show whether the broker runs (exit code 3 if not)"),
                              ("env", "print the STREAMAPP_* settings of a user of a broker started with "
                                      "--security, as export lines")):
        sub = actions.add_parser(action, help=help_text, description=help_text)
        sub.add_argument("--port", type=port_arg, default=None,
                         help=f"client port on 127.0.0.1 (default {DEFAULT_PORT}); the controller takes "
                              f"the next free port. A cluster's nodes listen on PORT, PORT+1, PORT+2 "
                              f"and their controllers on PORT+3 to PORT+5")
        sub.add_argument("--nodes", type=int, choices=(1, CLUSTER_NODES), default=1,
                         help=f"1 broker (default) or a cluster of {CLUSTER_NODES}")
        sub.add_argument("--data-dir", type=Path, default=None,
                         help="where the broker keeps its logs, pid file and topics (default "
                              f"{default_data_dir(DEFAULT_PORT).parent}/broker-PORT, or cluster-PORT "
                              f"holding node-1 to node-{CLUSTER_NODES})")
        if action == "start":
            sub.add_argument("--timeout", type=seconds_arg, default=90.0,
                             help="seconds to wait for the broker to answer (default 90)")
            sub.add_argument("--max-message-bytes", type=size_arg, default=DEFAULT_MAX_MESSAGE_BYTES,
                             help=f"largest record batch the broker accepts "
                                  f"(default {format_bytes(DEFAULT_MAX_MESSAGE_BYTES)})")
            sub.add_argument("--security", choices=SECURITY_MODES, default="plaintext",
                             help="sasl_ssl: clients connect over TLS with SCRAM-SHA-512; ssl: over TLS with a "
                                  "client certificate, the broker requiring one (a CA, the broker's certificate, "
                                  "the users' passwords and client certificates generated into DATA_DIR/security); "
                                  "prints the settings a client needs (default plaintext)")
            sub.add_argument("--acls", action="store_true",
                             help="with --security: authorize by ACLs, admin the super user and "
                                  "the pipeline user holding only what the pipeline of the STREAMAPP_* "
                                  "settings in the environment needs")
            sub.add_argument("--oauth", action="store_true",
                             help="with --security sasl_ssl on one node: the listener also takes OAUTHBEARER "
                                  "tokens of a local OAuth token endpoint started beside the broker (client "
                                  "credentials, a client per user), and the settings printed use it")
        elif action == "env":
            sub.add_argument("--user", choices=USERS, default=PIPELINE, help=f"default {PIPELINE}")
        elif action == "stop":
            sub.add_argument("--timeout", type=seconds_arg, default=30.0,
                             help="seconds to wait after SIGTERM before killing it (default 30)")


def run_broker(args: argparse.Namespace) -> int:
    port = args.port if args.port is not None else DEFAULT_PORT
    max_message_bytes = getattr(args, "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
    data_dir = args.data_dir or (default_cluster_dir(port) if args.nodes > 1 else default_data_dir(port))
    security = _broker_security(args, Path(data_dir).expanduser().resolve())
    if args.nodes > 1:
        cluster = LocalCluster(data_dir, port, nodes=args.nodes, notify=_note, security=security,
                               max_message_bytes=max_message_bytes)
        return run_cluster(cluster, args)
    broker = LocalBroker(data_dir, port, notify=_note, security=security, max_message_bytes=max_message_bytes)
    if args.action == "env":
        return _print_env(broker.bootstrap, security, args.user)
    if args.action == "start":
        began = time.monotonic()
        broker.start(timeout=args.timeout)
        print(f"broker {broker.status().describe()}; started in {time.monotonic() - began:.1f}s")
        _print_env(broker.bootstrap, security, PIPELINE)
        return 0
    if args.action == "stop":
        outcome = broker.stop(timeout=args.timeout)
        print(f"broker {outcome} (data dir {broker.data_dir})")
        return 0
    status = broker.status()
    print(f"broker {status.describe()}")
    return 0 if status.running else ExitCode.NOT_RUNNING


def _broker_security(args: argparse.Namespace, data_dir: Path) -> BrokerSecurity | None:
    """The security of ``broker start --security MODE [--acls] [--oauth]``, or of an existing
    secured broker's data dir for ``broker env`` (as its server.properties say)."""
    acls, oauth = getattr(args, "acls", False), getattr(args, "oauth", False)
    mode = getattr(args, "security", "plaintext")
    if args.action == "env":
        mode, oauth = _recorded_security(data_dir if args.nodes == 1 else data_dir / "node-1")
    elif mode == "plaintext" and acls:
        raise UsageError("--acls needs --security sasl_ssl or ssl", "add one of them")
    if oauth and (mode != SASL_SSL or args.nodes > 1):
        raise UsageError("--oauth needs --security sasl_ssl on one node", "add it, or drop --oauth")
    if mode == "plaintext":
        return None
    return BrokerSecurity(data_dir / "security", Settings.from_env() if acls else None, mode=mode, oauth=oauth)


def _recorded_security(data_dir: Path) -> tuple[str, bool]:
    """The client listener and OAUTHBEARER of the broker last started from ``data_dir``."""
    try:
        properties = read_properties(data_dir / "server.properties")
    except OSError:
        return SASL_SSL, False
    mode = MUTUAL_TLS if properties.get("ssl.client.auth") == "required" else SASL_SSL
    return mode, "OAUTHBEARER" in properties.get("sasl.enabled.mechanisms", "")


def _print_env(bootstrap: str, security: BrokerSecurity | None, user: str) -> int:
    if security is None:
        return 0
    if not security.generated():
        raise CommandError(f"no broker in {security.directory.parent} was started with --security",
                           "start it with `streamapp broker start --security sasl_ssl` (or ssl)")
    if user == PIPELINE:
        print(f"# the {user} user's settings (the admin's: `streamapp broker env --user {ADMIN}` "
              f"with the same --nodes, --port and --data-dir)")
    print(export_lines(security.client_env(bootstrap, user)))
    return 0


def run_cluster(cluster: LocalCluster, args: argparse.Namespace) -> int:
    """``broker start|stop|status|env --nodes N``: the same actions on every node; status exits 3
    unless all of them run."""
    if args.action == "env":
        return _print_env(cluster.bootstrap, cluster.security, args.user)
    if args.action == "start":
        began = time.monotonic()
        cluster.start(timeout=args.timeout)
        _print_nodes(cluster)
        print(f"cluster started in {time.monotonic() - began:.1f}s; point the pipeline at it with\n"
              f"  STREAMAPP_BROKER=kafka://{cluster.bootstrap} STREAMAPP_REPLICATION_FACTOR={cluster.replication}")
        _print_env(cluster.bootstrap, cluster.security, PIPELINE)
        return 0
    if args.action == "stop":
        for node, outcome in zip(cluster.nodes, cluster.stop(timeout=args.timeout), strict=True):
            print(f"node {node.node_id} {outcome} (data dir {node.data_dir})")
        return 0
    _print_nodes(cluster)
    return 0 if cluster.running() else ExitCode.NOT_RUNNING


def _print_nodes(cluster: LocalCluster) -> None:
    for node, status in zip(cluster.nodes, cluster.status(), strict=True):
        print(f"node {node.node_id} {status.describe()}")


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
    from streamapp.topics import DOCUMENTED_LAYOUTS, disk_plan, ensure_topics

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
    from streamapp.groundtruth import GroundTruthWriter
    from streamapp.tools.harness import synthetic_streams
    from streamapp.tools.progress import Progress
    from streamapp.tools.publisher import FramePublisher
    from streamapp.wire import new_epoch

    settings = Settings.from_env()
    epoch = new_epoch()
    sources: list[Source]
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
        for path in assets.ensure(files, notify=_note):
            print(path)
        return 0

    return Command(name, f"fetch {what} (once) and print where they are", configure, run)


# --------------------------------------------------------------------------------------------
# streamapp demo


def configure_demo(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run the whole pipeline on a local broker (started if none listens on "
                          "--port), one worker per stage: by default the two sample videos through "
                          "YOLOv3-tiny (model and videos fetched first, see `streamapp model` and "
                          "`streamapp samples`); with --synthetic, synthetic streams checked against "
                          "their true boxes. Checks every frame came out exactly once and writes "
                          "videos, contact_sheet.png and summary.json to --out. It uses topics of its "
                          "own, deleted at the end, unless STREAMAPP_TOPIC_PREFIX names topics an admin "
                          "made (for a user who may not create topics); it connects as the STREAMAPP_* "
                          "security settings say, by the host of STREAMAPP_BROKER.")
    parser.add_argument("--synthetic", action="store_true",
                        help="synthetic scenes with known boxes and the colour detector (no downloads)")
    parser.add_argument("--video", type=Path, action="append", dest="videos", default=[],
                        help="a video to use instead of the samples (repeat for more streams)")
    parser.add_argument("--streams", type=count_arg, default=2, help="synthetic streams (default 2)")
    parser.add_argument("--frames", type=count_arg, default=300,
                        help="frames per stream (default 300; a video may end sooner)")
    parser.add_argument("--size", type=resolution_arg, default=(640, 480),
                        help="synthetic frame size (default 640x480)")
    parser.add_argument("--fps", type=fps_arg, default=None,
                        help="per stream; 0 = as fast as possible (default: 15 synthetic, 3 for videos)")
    parser.add_argument("--out", type=Path, default=Path("out"), help="output folder (default out/)")
    parser.add_argument("--port", type=port_arg, default=DEFAULT_PORT, help=f"broker port (default {DEFAULT_PORT})")
    parser.add_argument("--timeout", type=seconds_arg, default=600.0,
                        help="seconds to wait for every frame to leave the join (default 600)")


def run_demo(args: argparse.Namespace) -> int:
    from streamapp.tools.demo import DemoOptions, run_demo as demo

    if args.synthetic and args.videos:
        raise UsageError("--synthetic and --video exclude each other", "give one of them")
    width, height = args.size
    options = DemoOptions(synthetic=args.synthetic, videos=tuple(args.videos), streams=args.streams,
                          frames=args.frames, width=width, height=height, fps=args.fps, out=args.out,
                          broker_port=args.port, timeout_s=args.timeout)
    try:
        summary = demo(options)
    except TimeoutError as exc:
        raise CommandError(str(exc)) from None
    print(json.dumps(summary, indent=2))
    return 0


# --------------------------------------------------------------------------------------------
# streamapp bench <name>: long measurements that write a report; each is one Command in BENCHES.


BENCHES: list[Command] = [
    Command("chaos", "kill stages at random under load, restart them, count lost and duplicate frames",
            chaos.configure, chaos.run),
    Command("join", join_command.HELP, join_command.configure, join_command.run),
    Command("soak", soak_command.HELP, soak_command.configure, soak_command.run),
    Command("infer", infer_bench.HELP, infer_bench.configure, infer_bench.run),
    Command("disk", disk_command.HELP, disk_command.configure, disk_command.run),
]


def configure_bench(parser: argparse.ArgumentParser) -> None:
    parser.description = "Long-running measurements of the whole pipeline; each writes a report."
    benches = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for bench in BENCHES:
        sub = benches.add_parser(bench.name, help=bench.help, description=bench.help)
        bench.configure(sub)
        sub.set_defaults(run_bench=bench.run)


def run_bench(args: argparse.Namespace) -> int:
    return args.run_bench(args)


# --------------------------------------------------------------------------------------------

COMMANDS: list[Command] = [
    Command("broker", "run a local Kafka broker for development and tests", configure_broker, run_broker),
    Command("topics", "create the pipeline's topics and check co-partitioning", configure_topics, run_topics),
    Command("produce", "publish a synthetic scene or a video file to the frames topic",
            configure_produce, run_produce),
    fetch_command("model", assets.MODEL, "the YOLOv3-tiny model files (STREAMAPP_DETECTOR=yolo)"),
    fetch_command("samples", assets.SAMPLES, "the sample videos (vtest.avi, bikes.mp4)"),
    Command("demo", "run the whole pipeline on a local broker and check the output", configure_demo, run_demo),
    Command("bench", "long-running measurements (chaos: crashes under load; join: against Kafka Streams; "
                     "soak: memory and disk; disk: every disk budget on small file systems)",
            configure_bench, run_bench),
    Command("record", "record topics (or synthetic cameras) to a recording file",
            replay_commands.configure_record, replay_commands.run_record),
    Command("replay", "publish recordings to topics, paced, through seeded scenario transforms",
            replay_commands.configure_replay, replay_commands.run_replay),
    Command("check-upgrade", upgrade.HELP, upgrade.configure, upgrade.run),
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
    parser = build_parser()
    try:
        kafkaclient.install()
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("a command is required", "see `streamapp --help`")
        return args.run(args)
    except SystemExit as exc:  # --help, which argparse has printed
        return exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    except EXPECTED_ERRORS as exc:
        print(f"streamapp: error: {one_line(exc)}", file=sys.stderr)
        return getattr(exc, "exit_code", ExitCode.FAILURE)
    except KeyboardInterrupt:
        print("streamapp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
