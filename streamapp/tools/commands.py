"""The commands of the tools distribution (``streamapp[tools]``, streamapp/tools/pyproject.toml):
the local broker, the demo, the benchmarks, record and replay. ``streamapp`` (streamapp/cli/main.py)
names them and takes each one's arguments and handler from :data:`HANDLERS`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from streamapp.cli.arguments import count_arg, fps_arg, port_arg, resolution_arg, seconds_arg, size_arg
from streamapp.cli.command import Command, CommandError, Configure, Run, note
from streamapp.errors import ExitCode, UsageError
from streamapp.settings import Settings
from streamapp.tools import chaos
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
        cluster = LocalCluster(data_dir, port, nodes=args.nodes, notify=note, security=security,
                               max_message_bytes=max_message_bytes)
        return run_cluster(cluster, args)
    broker = LocalBroker(data_dir, port, notify=note, security=security, max_message_bytes=max_message_bytes)
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

HANDLERS: dict[str, tuple[Configure, Run]] = {
    "broker": (configure_broker, run_broker),
    "demo": (configure_demo, run_demo),
    "bench": (configure_bench, run_bench),
    "record": (replay_commands.configure_record, replay_commands.run_record),
    "replay": (replay_commands.configure_replay, replay_commands.run_replay),
}
