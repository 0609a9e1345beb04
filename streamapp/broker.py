"""A local Apache Kafka broker, or a three-node cluster, for development, tests and CI.

The broker is the real thing: ``kafka.Kafka`` from the Apache Kafka jars published on Maven
Central, in KRaft mode (each process is both broker and controller; no ZooKeeper). Nothing else
has to be installed besides Java 17+ and, for the first run only, Maven:

* :func:`ensure_jars` copies the jars listed in ``streamapp/kafka/pom.xml`` into
  ``$STREAMAPP_KAFKA_HOME/libs`` (default ``~/.cache/streamapp/kafka-<version>/libs``) with
  ``mvn dependency:copy-dependencies``, once; a marker file written after a complete copy makes
  later runs reuse it.
* :class:`LocalBroker` keeps everything of one broker in its data directory: ``server.properties``,
  ``broker.pid``, ``broker.log`` (the broker's stdout/stderr; the previous run's is kept as
  ``broker.log.1``), ``cluster.id`` and the Kafka log directory ``logs/``.

``LocalBroker(data_dir, port).start()`` returns once the broker answers a metadata request;
``stop()`` sends SIGTERM and waits, killing the broker only when it does not exit in time.
:class:`LocalCluster` runs three such nodes from one directory (``node-1`` ... ``node-3``) as one
KRaft quorum, every topic replicated on all three and ``min.insync.replicas`` 2, so one node can
be killed without stopping or losing anything.
Every expected failure raises :class:`BrokerError` with a message that says what to do.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from pathlib import Path

from streamapp.connect import quiet_logger
from streamapp.errors import ExitCode, StreamappError

KAFKA_VERSION = "4.1.1"
MIN_JAVA = 17
DEFAULT_PORT = 9092
# The pipeline's frames go up to 16 MiB (STREAMAPP_MAX_FRAME_BYTES); a record batch carries
# some framing on top, hence the headroom.
DEFAULT_MAX_MESSAGE_BYTES = 17 * 1024**2
NODE_ID = 1

log = logging.getLogger(__name__)
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


# --------------------------------------------------------------------------------------------
# Locations


def kafka_home() -> Path:
    """Where the Kafka jars are cached: ``$STREAMAPP_KAFKA_HOME`` or the user's cache directory."""
    if os.environ.get("STREAMAPP_KAFKA_HOME"):
        return Path(os.environ["STREAMAPP_KAFKA_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "streamapp" / f"kafka-{KAFKA_VERSION}"


def default_data_dir(port: int = DEFAULT_PORT) -> Path:
    """Data directory of ``streamapp broker`` when none is given: one per port, per user."""
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "streamapp" / f"broker-{port}"


# --------------------------------------------------------------------------------------------
# Java and the jars


def parse_java_version(text: str) -> int:
    """The major version in ``java -version`` output: ``"17.0.15" -> 17``, ``"1.8.0_292" -> 8``."""
    match = re.search(r'version "([^"]+)"', text)
    if not match:
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise BrokerError(f"cannot read the Java version from `java -version`, which printed {first!r}")
    parts = re.split(r"[._+-]", match.group(1))
    try:
        major = int(parts[0])
        if major == 1 and len(parts) > 1:
            major = int(parts[1])
    except ValueError:
        raise BrokerError(f"cannot read the Java version {match.group(1)!r} printed by `java -version`") from None
    return major


def find_java() -> str:
    """``$JAVA_HOME/bin/java`` when it exists, else ``java`` on the PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise JavaNotFound(
            f"Java not found: the Kafka {KAFKA_VERSION} broker needs Java {MIN_JAVA}+",
            f"install a JDK {MIN_JAVA} or newer and put `java` on the PATH, or set JAVA_HOME"
        )
    return found


def check_java(java: str | None = None) -> str:
    """Return the ``java`` to run, after making sure it is Java 17 or newer."""
    java = java or find_java()
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise BrokerError(f"cannot run {java}: {exc}") from None
    major = parse_java_version(proc.stderr + proc.stdout)
    if major < MIN_JAVA:
        raise JavaNotFound(
            f"{java} is Java {major}; the Kafka {KAFKA_VERSION} broker needs Java {MIN_JAVA}+",
            f"install a JDK {MIN_JAVA} or newer, or point JAVA_HOME at one"
        )
    return java


def _packaged(name: str) -> bytes:
    return (resources.files("streamapp.kafka") / name).read_bytes()


def ensure_jars(home: Path | str | None = None, *, notify: Notify | None = None) -> Path:
    """Return the directory of Kafka jars, fetching them with Maven on first use."""
    home = Path(home) if home is not None else kafka_home()
    return copy_maven_dependencies(
        _packaged("pom.xml"), home, what=f"the Apache Kafka {KAFKA_VERSION} jars",
        expected_jar=f"kafka_2.13-{KAFKA_VERSION}.jar",
        cache_hint="set STREAMAPP_KAFKA_HOME to a directory whose libs/ already holds them",
        notify=notify)


def copy_maven_dependencies(pom: bytes, home: Path, *, what: str, expected_jar: str, cache_hint: str,
                            notify: Notify | None = None) -> Path:
    """Return ``home/libs`` holding the runtime dependencies of ``pom``, copied by Maven once.

    The copy is made in a scratch directory and moved into place with a marker file holding the
    pom's hash, so an interrupted copy is never used and a changed pom fetches again. A file
    lock keeps concurrent first runs from fetching twice.
    """
    notify = notify or log.info
    libs = home / "libs"
    digest = hashlib.sha256(pom).hexdigest()[:16]
    if _jars_complete(libs, digest):
        return libs
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BrokerError(f"cannot create the jar cache {home}: {exc} ({cache_hint})") from None
    with file_lock(home / ".lock"):
        if _jars_complete(libs, digest):
            return libs
        mvn = shutil.which("mvn")
        if not mvn:
            raise MavenNotFound(
                f"{what} are not in {libs} and Maven (`mvn`) is not installed to fetch them from "
                f"Maven Central", f"install Maven (needed once), or {cache_hint}"
            )
        notify(f"fetching {what} from Maven Central into {libs} (first run only)")
        work = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
        try:
            (work / "pom.xml").write_bytes(pom)
            fetched = work / "libs"
            proc = subprocess.run(
                [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                 f"-DoutputDirectory={fetched}", "-DincludeScope=runtime"],
                capture_output=True, text=True, cwd=work,
            )
            if proc.returncode != 0 or not list(fetched.glob(expected_jar)):
                log_file = home / "maven.log"
                log_file.write_text(proc.stdout + proc.stderr)
                raise BrokerError(
                    f"Maven could not fetch {what} (exit code {proc.returncode})",
                    f"check the network access to Maven Central; Maven's output is in {log_file}"
                )
            (fetched / ".complete").write_text(digest + "\n")
            if libs.exists():
                shutil.rmtree(libs)
            os.replace(fetched, libs)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return libs


def _jars_complete(libs: Path, digest: str) -> bool:
    try:
        return (libs / ".complete").read_text().strip() == digest
    except OSError:
        return False


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Ports and processes


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


def _pid_alive(pid: int) -> bool:
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


def _cmdline(pid: int) -> str | None:
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


def _read_properties(path: Path) -> dict[str, str]:
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


def _run_async(factory):
    """Run ``factory()``'s coroutine to completion, also when called from inside an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


async def _answers_metadata(bootstrap: str, node_id: int, timeout_s: float) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return any(broker["node_id"] == node_id for broker in cluster["brokers"])
    except Exception:  # noqa: BLE001 - any failure only means "not ready yet"
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


# --------------------------------------------------------------------------------------------
# The broker


@dataclasses.dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    port: int
    data_dir: Path
    log_file: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def describe(self) -> str:
        if self.running:
            return (f"running: {self.bootstrap} (pid {self.pid}), data dir {self.data_dir}, "
                    f"log {self.log_file}")
        return f"not running (port {self.port}, data dir {self.data_dir})"


class LocalBroker:
    """One KRaft broker listening on 127.0.0.1, its state kept in ``data_dir``: a single-node
    cluster by default, or node ``node_id`` of the quorum ``voters`` (``id@host:port,...``, the
    controller ports of every node) with ``replication`` copies of every topic.

    ``extra_properties`` are written into ``server.properties`` last, so they override anything.
    ``notify`` receives the messages meant for a person (stale pid file removed, fetching jars,
    broker killed); by default they are logged.
    """

    def __init__(
        self,
        data_dir: Path | str,
        port: int = DEFAULT_PORT,
        *,
        controller_port: int | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        heap: str = "1g",
        node_id: int = NODE_ID,
        voters: str | None = None,
        replication: int = 1,
        kafka_home: Path | str | None = None,
        extra_properties: Mapping[str, object] | None = None,
        notify: Notify | None = None,
    ) -> None:
        if not 0 < port < 65536:
            raise BrokerError(f"port {port} is not a TCP port (1-65535)")
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.port = port
        self.controller_port = controller_port
        self.max_message_bytes = max_message_bytes
        self.heap = heap
        self.node_id = node_id
        self.voters = voters
        self.replication = replication
        self.kafka_home = Path(kafka_home) if kafka_home is not None else None
        self.extra_properties = dict(extra_properties or {})
        self.notify = notify or log.info
        self._proc: subprocess.Popen | None = None

    # paths
    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def cluster_id_file(self) -> Path:
        return self.data_dir / "cluster.id"

    @property
    def log_dirs(self) -> Path:
        return self.data_dir / "logs"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ---------------------------------------------------------------------------------------
    def status(self) -> BrokerStatus:
        """Whether a broker runs from this data dir; a stale pid file is removed (and reported)."""
        pid = self._running_pid()
        port = self._recorded_port() or self.port  # the port it runs on, or last ran on
        return BrokerStatus(pid is not None, pid, port, self.data_dir, self.log_file)

    def start(self, timeout: float = 90.0) -> LocalBroker:
        """Start the broker and return once it answers a metadata request on :attr:`bootstrap`."""
        deadline = time.monotonic() + timeout
        self.launch()
        self.wait_ready(deadline, timeout)
        return self

    def launch(self) -> None:
        """Start the broker process without waiting for it to answer (a cluster node cannot
        answer before a majority of the quorum runs)."""
        running = self._running_pid()
        if running is not None:
            raise BrokerError(
                f"a broker is already running from {self.data_dir} (pid {running}, port "
                f"{self._recorded_port() or '?'}); stop it first with "
                f"`streamapp broker stop --data-dir {self.data_dir}`"
            )
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BrokerError(f"cannot create the broker data dir {self.data_dir}: {exc}") from None
        cluster_id = self._check_cluster_id()
        if port_in_use(self.port):
            raise PortInUse(
                f"port {self.port} on 127.0.0.1 is already in use (another Kafka broker?)",
                "choose another with --port, or stop what listens there"
            )
        controller_port = self._pick_controller_port()
        java = check_java()
        libs = ensure_jars(self.kafka_home, notify=self.notify)

        self._write_properties(controller_port)
        if not (self.log_dirs / "meta.properties").exists():
            cluster_id = cluster_id or new_cluster_id()
            self._format(java, libs, cluster_id)

        if self.log_file.exists():
            os.replace(self.log_file, self.log_file.with_name(self.log_file.name + ".1"))
        with open(self.log_file, "ab") as out:
            self._proc = subprocess.Popen(
                [java, f"-Xmx{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                 "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
                 *self._java_classpath_args(libs), "kafka.Kafka", str(self.properties_file)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.data_dir, start_new_session=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")

    def stop(self, timeout: float = 30.0) -> str:
        """Stop the broker: ``"stopped"``, ``"killed"`` (did not exit in time) or ``"not running"``."""
        pid = self._running_pid()
        if pid is None:
            return "not running"
        self._signal(pid, signal.SIGTERM)
        if self._wait_exit(pid, timeout):
            outcome = "stopped"
        else:
            self._signal(pid, signal.SIGKILL)
            self._wait_exit(pid, 10.0)
            outcome = "killed"
            self.notify(f"the broker (pid {pid}) did not stop within {timeout:g}s after SIGTERM; "
                        f"killed it (see {self.log_file})")
        self.pid_file.unlink(missing_ok=True)
        self._proc = None
        return outcome

    def kill(self) -> bool:
        """SIGKILL the broker, as a crash would (no controlled shutdown); False if it was not running."""
        pid = self._running_pid()
        if pid is None:
            return False
        self._signal(pid, signal.SIGKILL)
        self._wait_exit(pid, 10.0)
        self.pid_file.unlink(missing_ok=True)
        self._proc = None
        return True

    # ---------------------------------------------------------------------------------------
    def _running_pid(self) -> int | None:
        try:
            text = self.pid_file.read_text().strip()
        except FileNotFoundError:
            return None
        try:
            pid = int(text)
        except ValueError:
            self.pid_file.unlink(missing_ok=True)
            self.notify(f"removed the unreadable pid file {self.pid_file} ({text[:20]!r})")
            return None
        if not self._alive(pid):
            self.pid_file.unlink(missing_ok=True)
            self.notify(f"removed the stale pid file {self.pid_file}: pid {pid} is not running")
            return None
        cmdline = _cmdline(pid)
        if cmdline is not None and not ("kafka.Kafka" in cmdline and str(self.properties_file) in cmdline):
            self.pid_file.unlink(missing_ok=True)
            self.notify(f"removed the stale pid file {self.pid_file}: pid {pid} is another process, "
                        f"not this broker")
            return None
        return pid

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        return _pid_alive(pid)

    def _recorded_port(self) -> int | None:
        try:
            listeners = _read_properties(self.properties_file).get("advertised.listeners", "")
        except OSError:
            return None
        match = re.search(r"PLAINTEXT://[^,:]*:(\d+)", listeners)
        return int(match.group(1)) if match else None

    def _check_cluster_id(self) -> str | None:
        """The cluster id this data dir belongs to (None: not formatted yet), or BrokerError."""
        meta_file = self.log_dirs / "meta.properties"
        recorded = self.cluster_id_file.read_text().strip() if self.cluster_id_file.exists() else None
        if not meta_file.exists():
            return recorded
        meta = _read_properties(meta_file)
        formatted = meta.get("cluster.id")
        if recorded and formatted != recorded:
            raise BrokerError(
                f"the data dir {self.data_dir} is formatted for Kafka cluster {formatted!r} "
                f"({meta_file}), not for cluster {recorded!r} recorded in {self.cluster_id_file}; "
                f"use a new --data-dir, or delete {self.data_dir} to start afresh (its topics are lost)"
            )
        if meta.get("node.id", str(self.node_id)) != str(self.node_id):
            raise BrokerError(
                f"the data dir {self.data_dir} is formatted for Kafka node {meta.get('node.id')}, "
                f"not node {self.node_id}; use a new --data-dir, or delete {self.data_dir} to start afresh"
            )
        if formatted and not recorded:
            self.cluster_id_file.write_text(formatted + "\n")
        return formatted

    def _pick_controller_port(self) -> int:
        if self.controller_port is not None:
            if port_in_use(self.controller_port) or self.controller_port == self.port:
                raise PortInUse(f"controller port {self.controller_port} on 127.0.0.1 is already in use",
                                "choose another")
            return self.controller_port
        previous = None
        if self.properties_file.exists():
            voters = _read_properties(self.properties_file).get("controller.quorum.voters", "")
            match = re.search(r":(\d+)$", voters)
            previous = int(match.group(1)) if match else None
        for candidate in (previous, self.port + 1):
            if candidate and candidate != self.port and candidate < 65536 and not port_in_use(candidate):
                return candidate
        return free_port()

    def properties(self, controller_port: int) -> dict[str, object]:
        """The ``server.properties`` of this broker."""
        copies, min_in_sync = self.replication, max(1, self.replication - 1)
        return {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": self.voters or f"{self.node_id}@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": self.log_dirs,
            "num.partitions": 1,
            # On a cluster a write is acknowledged (acks=all) once all but one copy have it, so
            # one node can be down without stopping or losing anything.
            "default.replication.factor": copies,
            "min.insync.replicas": min_in_sync,
            "offsets.topic.replication.factor": copies,
            "transaction.state.log.replication.factor": copies,
            "transaction.state.log.min.isr": min_in_sync,
            "share.coordinator.state.topic.replication.factor": copies,
            "share.coordinator.state.topic.min.isr": min_in_sync,
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": 0,
            # Large frames: what a producer may send, what a fetch may return.
            "message.max.bytes": self.max_message_bytes,
            "replica.fetch.max.bytes": self.max_message_bytes,
            "fetch.max.bytes": max(self.max_message_bytes, 55 * 1024**2),
            "socket.request.max.bytes": max(self.max_message_bytes + 1024**2, 100 * 1024**2),
            # Retention and compaction act within seconds, so tests can see them act.
            "log.segment.bytes": 64 * 1024**2,
            "log.retention.check.interval.ms": 10_000,
            "log.cleaner.enable": "true",
            "log.cleaner.backoff.ms": 5_000,
            "log.cleaner.dedupe.buffer.size": 32 * 1024**2,
            **self.extra_properties,
        }

    def _write_properties(self, controller_port: int) -> None:
        lines = ["# Written by streamapp.broker at every start; edits are overwritten."]
        lines += [f"{key}={value}" for key, value in self.properties(controller_port).items()]
        self.properties_file.write_text("\n".join(lines) + "\n")

    def _java_classpath_args(self, libs: Path) -> list[str]:
        log4j = self.data_dir / "log4j2.yaml"
        log4j.write_bytes(_packaged("log4j2.yaml"))
        return ["-cp", f"{libs}/*", f"-Dlog4j2.configurationFile={log4j}"]

    def _format(self, java: str, libs: Path, cluster_id: str) -> None:
        proc = subprocess.run(
            [java, *self._java_classpath_args(libs), "kafka.tools.StorageTool", "format",
             "-t", cluster_id, "-c", str(self.properties_file)],
            capture_output=True, text=True, cwd=self.data_dir,
        )
        if proc.returncode != 0:
            log_file = self.data_dir / "format.log"
            log_file.write_text(proc.stdout + proc.stderr)
            raise BrokerError(f"formatting the Kafka log dir {self.log_dirs} failed",
                              f"the storage tool's output is in {log_file}")
        self.cluster_id_file.write_text(cluster_id + "\n")

    def wait_ready(self, deadline: float, timeout: float) -> None:
        """Return once the launched broker answers a metadata request that lists it, or fail
        (BrokerError with its log's tail, the process killed) at ``deadline``."""
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                self._fail(f"the broker exited with code {code} during start")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(f"the broker did not answer on {self.bootstrap} within {timeout:g}s")
            if self._accepts_connections():
                with quiet_logger("aiokafka"):
                    if _run_async(functools.partial(_answers_metadata, self.bootstrap, self.node_id,
                                                    min(5.0, max(remaining, 0.5)))):
                        return
            time.sleep(0.2)

    def _accepts_connections(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def _fail(self, reason: str) -> None:
        pid = self._proc.pid if self._proc else None
        if pid is not None and self._alive(pid):
            self._signal(pid, signal.SIGKILL)
            self._wait_exit(pid, 10.0)
        self.pid_file.unlink(missing_ok=True)
        self._proc = None
        said = last_error_line(self.log_file)
        raise BrokerError(f"{reason}: {said}" if said else reason, f"the broker's log is {self.log_file}")

    def _signal(self, pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)  # the broker leads its own process group (start_new_session)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True


# --------------------------------------------------------------------------------------------
# A cluster of local brokers

CLUSTER_NODES = 3


def default_cluster_dir(port: int = DEFAULT_PORT) -> Path:
    """Data directory of ``streamapp broker --nodes 3`` when none is given: one per first port."""
    return default_data_dir(port).with_name(f"cluster-{port}")


class LocalCluster:
    """Three KRaft nodes on 127.0.0.1 sharing one cluster id, each in ``data_dir/node-N``.

    Node N (1-based) listens for clients on ``port + N - 1`` and for the quorum on
    ``port + nodes + N - 1``, so the ports follow from the first one: 9092-9094 for clients and
    9095-9097 for the controllers by default. Topics get three copies and
    ``min.insync.replicas`` 2.

    The ports must lie outside the system's ephemeral range: while a node is down, another
    node's connection attempt to its port can be given that very port as its own local port and
    connect to itself (TCP simultaneous open), which kills the connecting node's quorum client
    and keeps the restarted node from binding.
    """

    def __init__(self, data_dir: Path | str, port: int = DEFAULT_PORT, *, nodes: int = CLUSTER_NODES,
                 notify: Notify | None = None, **broker_options) -> None:
        if nodes < 2:
            raise BrokerError(f"a cluster needs at least 2 nodes, got {nodes}")
        ports = range(port, port + 2 * nodes)
        if ports.stop > 65536:
            raise BrokerError(f"port {port}: a {nodes}-node cluster needs ports {port}-{ports.stop - 1}")
        ephemeral = ephemeral_ports()
        if ports.start < ephemeral.stop and ephemeral.start < ports.stop:
            raise BrokerError(
                f"ports {port}-{ports.stop - 1} overlap the ephemeral range {ephemeral.start}-{ephemeral.stop - 1} "
                f"that outgoing connections take their ports from, so a restarted node could find its port "
                f"taken; choose a --port below {ephemeral.start - 2 * nodes + 1} (default {DEFAULT_PORT})")
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.port = port
        controller_ports = [port + nodes + number for number in range(nodes)]
        voters = ",".join(f"{number + 1}@127.0.0.1:{controller}" for number, controller in enumerate(controller_ports))
        self.nodes = [
            LocalBroker(self.data_dir / f"node-{number + 1}", port + number, controller_port=controller,
                        node_id=number + 1, voters=voters, replication=min(3, nodes), notify=notify,
                        **broker_options)
            for number, controller in enumerate(controller_ports)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def replication(self) -> int:
        return self.nodes[0].replication

    @property
    def cluster_id_file(self) -> Path:
        return self.data_dir / "cluster.id"

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def status(self) -> list[BrokerStatus]:
        return [node.status() for node in self.nodes]

    def running(self) -> bool:
        return all(status.running for status in self.status())

    def start(self, timeout: float = 120.0) -> LocalCluster:
        """Start every node that is not running, and return once each answers."""
        deadline = time.monotonic() + timeout
        self._share_cluster_id()
        launched = []
        try:
            for node in self.nodes:
                if node.status().running:
                    continue
                node.launch()
                launched.append(node)
            for node in launched:
                node.wait_ready(deadline, timeout)
        except BrokerError:
            for node in launched:
                node.stop()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> list[str]:
        """Stop every node (SIGTERM to all, so no node waits on a quorum that is leaving)."""
        pids = [(node, node._running_pid()) for node in self.nodes]
        for node, pid in pids:
            if pid is not None:
                node._signal(pid, signal.SIGTERM)
        # A node that exited before its own stop() looked is "stopped" too.
        return [node.stop(timeout).replace("not running", "stopped") if pid is not None else "not running"
                for node, pid in pids]

    def _share_cluster_id(self) -> None:
        """Every node is formatted with the cluster's one id (kept in ``data_dir/cluster.id``)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.cluster_id_file.exists():
            self.cluster_id_file.write_text(new_cluster_id() + "\n")
        cluster_id = self.cluster_id_file.read_text().strip()
        for node in self.nodes:
            node.data_dir.mkdir(parents=True, exist_ok=True)
            if not node.cluster_id_file.exists():
                node.cluster_id_file.write_text(cluster_id + "\n")

    def under_replicated_partitions(self, timeout_s: float = 10.0) -> int:
        """:func:`count_under_replicated` on this cluster (0: every copy caught up)."""
        return _run_async(lambda: count_under_replicated(self.bootstrap, timeout_s))


async def count_under_replicated(bootstrap: str, timeout_s: float = 10.0) -> int:
    """Partitions of every topic on the cluster at ``bootstrap`` with fewer in-sync copies than
    replicas; -1 when the cluster cannot be asked."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await admin.start()
        described = await admin.describe_topics(await admin.list_topics())
        return sum(len(partition["isr"]) < len(partition["replicas"])
                   for topic in described for partition in topic["partitions"])
    except Exception:  # noqa: BLE001 - a node down or a leader moving: ask again later
        return -1
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
