"""One subcommand of ``streamapp``, and what the subcommands share (streamapp/cli/main.py lists them)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

from streamapp.errors import StreamappError


class CommandError(StreamappError, RuntimeError):
    """A subcommand failed in an expected way; the message is shown as is."""


# Adds a command's arguments to its parser; runs it and returns the exit code.
Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Configure
    run: Run


def note(message: str) -> None:
    """A line for the person running the command, on stderr."""
    print(f"streamapp: {message}", file=sys.stderr)
