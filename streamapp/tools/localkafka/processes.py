"""Ports and processes: free ports, whether a pid is still the broker, a broker's properties and log."""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import os
import re
import socket
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamapp.tools.localkafka.common import BrokerError
from streamapp.units import milliseconds


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on (or holds) ``host:port``, so a broker could not bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the JVM does: a port left in TIME_WAIT by a stopped broker counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def ephemeral_ports() -> range:
    """The ports this system hands to outgoing connections (Linux: ip_local_port_range)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_port_block(count: int, start: int = 20000) -> int:
    """A first port such that it and the ``count - 1`` after it are free, below the ephemeral
    range (see :class:`LocalCluster` for why)."""
    stop = ephemeral_ports().start - count
    for first in range(start, stop, count):
        if not any(port_in_use(port) for port in range(first, first + count)):
            return first
    raise BrokerError(f"no {count} consecutive free ports between {start} and {stop + count}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited, it only waits for its parent to notice
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def cmdline_of(pid: int) -> str | None:
    """The command line of ``pid``, or None when it cannot be read on this system."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return ""
    except OSError:
        return None
    try:
        proc = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
    except OSError:
        return None
    return proc.stdout if proc.returncode == 0 else ""


def read_properties(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


# A line of the broker's log that says why it stopped; its exceptions name the setting or file.
_ERROR_LINE = re.compile(r"\b(ERROR|FATAL)\b|Exception:")


def last_error_line(log_file: Path, max_chars: int = 400) -> str | None:
    """The broker's last error in its log, for a one-line message (the log has the rest)."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [line.strip() for line in lines if _ERROR_LINE.search(line)]
    return errors[-1][:max_chars] if errors else None


def new_cluster_id() -> str:
    """A Kafka cluster id (what ``kafka-storage random-uuid`` prints), without starting a JVM."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka avoids ids that look like command-line options
            return text


def run_async(factory):
    """Run ``factory()``'s coroutine to completion, also when called from inside an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


async def answers_metadata(bootstrap: str, node_id: int, timeout_s: float,
                           client_options: Mapping[str, Any] | None = None) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=milliseconds(timeout_s),
                                **(client_options or {}))
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return any(broker["node_id"] == node_id for broker in cluster["brokers"])
    except Exception:  # noqa: BLE001 - any failure only means "not ready yet"
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
