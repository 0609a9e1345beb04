"""The ``streamapp`` command.

Each subcommand is one :class:`Command` in :data:`COMMANDS`: a name, a one-line help, a function
that adds its arguments to its ``argparse`` parser and a handler ``(args) -> exit code``. Adding a
subcommand is adding one entry.

Exit codes: 0 success, 1 runtime error, 2 usage error (argparse's), 3 ``broker status`` when no
broker runs. Expected errors (:data:`EXPECTED_ERRORS`) are printed as ``streamapp: error: <message>``
without a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from streamapp.broker import (DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PORT, KAFKA_VERSION, BrokerError,
                              LocalBroker, default_data_dir, kafka_home)
from streamapp.settings import SettingsError
from streamapp.units import UnitError, format_bytes, parse_bytes


class CommandError(RuntimeError):
    """A subcommand failed in an expected way; the message is shown as is."""


EXPECTED_ERRORS: tuple[type[Exception], ...] = (CommandError, BrokerError, SettingsError, UnitError)


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _note(message: str) -> None:
    print(f"streamapp: {message}", file=sys.stderr)


def size_arg(text: str) -> int:
    """An argparse ``type`` for byte sizes written as in settings: ``16MiB``, ``17MB``, ``1048576``."""
    try:
        return parse_bytes(text, name="size")
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --------------------------------------------------------------------------------------------
# streamapp broker start|stop|status


def configure_broker(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"A local single-node Apache Kafka {KAFKA_VERSION} broker (KRaft) on 127.0.0.1, run from "
        f"the Maven Central jars (fetched once into {kafka_home()}/libs; set STREAMAPP_KAFKA_HOME "
        f"to move them). Needs Java 17+, and Maven for the first start."
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="{start,stop,status}")
    for action, help_text in (("start", "start the broker and wait until it answers"),
                              ("stop", "stop the broker (SIGTERM, then SIGKILL after --timeout)"),
                              ("status", "show whether the broker runs (exit code 3 if not)")):
        sub = actions.add_parser(action, help=help_text, description=help_text)
        sub.add_argument("--port", type=int, default=None,
                         help=f"client port on 127.0.0.1 (default {DEFAULT_PORT}); "
                              f"the controller takes the next free port")
        sub.add_argument("--data-dir", type=Path, default=None,
                         help="where the broker keeps its logs, pid file and topics "
                              f"(default {default_data_dir(DEFAULT_PORT).parent}/broker-PORT)")
        if action == "start":
            sub.add_argument("--timeout", type=float, default=90.0,
                             help="seconds to wait for the broker to answer (default 90)")
            sub.add_argument("--max-message-bytes", type=size_arg, default=DEFAULT_MAX_MESSAGE_BYTES,
                             help=f"largest record batch the broker accepts "
                                  f"(default {format_bytes(DEFAULT_MAX_MESSAGE_BYTES)})")
        elif action == "stop":
            sub.add_argument("--timeout", type=float, default=30.0,
                             help="seconds to wait after SIGTERM before killing it (default 30)")


def run_broker(args: argparse.Namespace) -> int:
    port = args.port if args.port is not None else DEFAULT_PORT
    data_dir = args.data_dir if args.data_dir is not None else default_data_dir(port)
    broker = LocalBroker(data_dir, port, notify=_note,
                         max_message_bytes=getattr(args, "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES))
    if args.action == "start":
        began = time.monotonic()
        broker.start(timeout=args.timeout)
        print(f"broker {broker.status().describe()}; started in {time.monotonic() - began:.1f}s")
        return 0
    if args.action == "stop":
        outcome = broker.stop(timeout=args.timeout)
        print(f"broker {outcome} (data dir {broker.data_dir})")
        return 0
    status = broker.status()
    print(f"broker {status.describe()}")
    return 0 if status.running else 3


# --------------------------------------------------------------------------------------------

COMMANDS: list[Command] = [
    Command("broker", "run a local Kafka broker for development and tests", configure_broker, run_broker),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamapp", description="Video analytics on Faust and Kafka.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("streamapp: error: a command is required", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except EXPECTED_ERRORS as exc:
        print(f"streamapp: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("streamapp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
