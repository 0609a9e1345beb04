"""What every part of the local broker manager shares: the Kafka version, defaults and errors."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from streamapp.errors import ExitCode, StreamappError

KAFKA_VERSION = "4.1.1"
MIN_JAVA = 17
DEFAULT_PORT = 9092
# The pipeline's frames go up to 16 MiB (STREAMAPP_MAX_FRAME_BYTES); a record batch carries
# some framing on top, hence the headroom.
DEFAULT_MAX_MESSAGE_BYTES = 17 * 1024**2
NODE_ID = 1

Notify = Callable[[str], None]


class BrokerError(StreamappError, RuntimeError):
    """The local broker cannot be installed, started, stopped or inspected; the message says why."""


class JavaNotFound(BrokerError):
    """No Java, or one too old, to run the broker."""

    exit_code = ExitCode.NO_JAVA


class MavenNotFound(BrokerError):
    """The Kafka jars are not cached and Maven is not there to fetch them."""

    exit_code = ExitCode.NO_MAVEN


class PortInUse(BrokerError):
    """A port the broker must listen on is taken."""

    exit_code = ExitCode.PORT_BUSY


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file only its owner can read (created so, never widened)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
