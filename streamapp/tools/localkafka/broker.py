"""One local broker: :class:`LocalBroker` runs ``kafka.Kafka`` in KRaft mode from its data directory."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from streamapp.connect import quiet_logger
from streamapp.tools.localkafka.acls import add_pipeline_acls
from streamapp.tools.localkafka.common import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PORT,
    NODE_ID,
    BrokerError,
    Notify,
    PortInUse,
    write_private,
)
from streamapp.tools.localkafka.jars import check_java, ensure_jars, packaged
from streamapp.tools.localkafka.oauth import TokenEndpoint
from streamapp.tools.localkafka.processes import (
    answers_metadata,
    cmdline_of,
    free_port,
    last_error_line,
    new_cluster_id,
    pid_alive,
    port_in_use,
    read_properties,
    run_async,
)
from streamapp.tools.localkafka.security import ADMIN, BROKER_HOST, BrokerSecurity

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    port: int
    data_dir: Path
    log_file: Path
    host: str = "127.0.0.1"
    protocol: str = "PLAINTEXT"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def describe(self) -> str:
        if self.running:
            secured = "" if self.protocol == "PLAINTEXT" else f"{self.protocol} "
            return (f"running: {secured}{self.bootstrap} (pid {self.pid}), data dir {self.data_dir}, "
                    f"log {self.log_file}")
        return f"not running (port {self.port}, data dir {self.data_dir})"


class LocalBroker:
    """One KRaft broker listening on 127.0.0.1, its state kept in ``data_dir``: a single-node
    cluster by default, or node ``node_id`` of the quorum ``voters`` (``id@host:port,...``, the
    controller ports of every node) with ``replication`` copies of every topic.

    ``security``: clients connect over SASL_SSL as its users (see :mod:`.security`), the
    ACLs of :func:`.acls.pipeline_acls` added at every start when it says ``acls``.
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
        security: BrokerSecurity | None = None,
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
        self.security = security
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
        # A secured broker's certificate names localhost only.
        return f"{BROKER_HOST if self.security else '127.0.0.1'}:{self.port}"

    def client_options(self, user: str = ADMIN) -> dict[str, object]:
        """aiokafka options to connect as ``user`` (none for a PLAINTEXT broker)."""
        return self.security.client_options(user) if self.security else {}

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ---------------------------------------------------------------------------------------
    def status(self) -> BrokerStatus:
        """Whether a broker runs from this data dir; a stale pid file is removed (and reported)."""
        pid = self._running_pid()
        protocol, host, port = self._recorded_listener() or ("PLAINTEXT", "127.0.0.1", self.port)
        return BrokerStatus(pid is not None, pid, port, self.data_dir, self.log_file, host, protocol)

    def start(self, timeout: float = 90.0) -> LocalBroker:
        """Start the broker and return once it answers a metadata request on :attr:`bootstrap`."""
        deadline = time.monotonic() + timeout
        self.launch()
        self.wait_ready(deadline, timeout)
        if self.security and self.security.acls:
            try:
                add_pipeline_acls(self.bootstrap, self.security)
            except BrokerError:
                self.stop()
                raise
        return self

    def launch(self) -> None:
        """Start the broker process without waiting for it to answer (a cluster node cannot
        answer before a majority of the quorum runs)."""
        running = self._running_pid()
        if running is not None:
            recorded = self._recorded_listener()
            raise BrokerError(
                f"a broker is already running from {self.data_dir} (pid {running}, port "
                f"{recorded[2] if recorded else '?'}); stop it first with "
                f"`streamapp broker stop --data-dir {self.data_dir}`"
            )
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BrokerError(f"cannot create the broker data dir {self.data_dir}: {exc}") from None
        cluster_id = self._check_cluster_id()
        if self.security:
            self._check_security_formatted()
            self.security.ensure()
        if port_in_use(self.port):
            raise PortInUse(
                f"port {self.port} on 127.0.0.1 is already in use (another Kafka broker?)",
                "choose another with --port, or stop what listens there"
            )
        controller_port = self._pick_controller_port()
        java = check_java()
        libs = ensure_jars(self.kafka_home, notify=self.notify)
        if self.security and self.security.oauth:
            self.security.token_endpoint.start()  # before the broker, which fetches its keys at start

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
                 *(self.security.jvm_options() if self.security else []),
                 *self._java_classpath_args(libs), "kafka.Kafka", str(self.properties_file)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.data_dir, start_new_session=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")

    def stop(self, timeout: float = 30.0) -> str:
        """Stop the broker, then its OAuth token endpoint if it has one: ``"stopped"``,
        ``"killed"`` (did not exit in time) or ``"not running"``."""
        try:
            return self._stop_broker(timeout)
        finally:
            self._token_endpoint().stop()

    def _token_endpoint(self) -> TokenEndpoint:
        """The OAuth token endpoint of this data dir (``broker stop`` is not told the security)."""
        return self.security.token_endpoint if self.security else TokenEndpoint(self.data_dir / "security")

    def _stop_broker(self, timeout: float) -> str:
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
        cmdline = cmdline_of(pid)
        if cmdline is not None and not ("kafka.Kafka" in cmdline and str(self.properties_file) in cmdline):
            self.pid_file.unlink(missing_ok=True)
            self.notify(f"removed the stale pid file {self.pid_file}: pid {pid} is another process, "
                        f"not this broker")
            return None
        return pid

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        return pid_alive(pid)

    def _recorded_listener(self) -> tuple[str, str, int] | None:
        """Protocol, host and port of the client listener it runs (or last ran) with."""
        try:
            listeners = read_properties(self.properties_file).get("advertised.listeners", "")
        except OSError:
            return None
        match = re.match(r"(\w+)://([^,:]*):(\d+)", listeners)
        return (match.group(1), match.group(2), int(match.group(3))) if match else None

    def _check_security_formatted(self) -> None:
        """SCRAM users exist only if created when the log dir was formatted."""
        assert self.security is not None
        if (self.log_dirs / "meta.properties").exists() and not self.security.generated():
            raise BrokerError(
                f"the data dir {self.data_dir} was formatted without SASL users, so it cannot run "
                f"with --security sasl_ssl",
                f"use a new --data-dir, or delete {self.data_dir} to start afresh (its topics are lost)")

    def _check_cluster_id(self) -> str | None:
        """The cluster id this data dir belongs to (None: not formatted yet), or BrokerError."""
        meta_file = self.log_dirs / "meta.properties"
        recorded = self.cluster_id_file.read_text().strip() if self.cluster_id_file.exists() else None
        if not meta_file.exists():
            return recorded
        meta = read_properties(meta_file)
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
            voters = read_properties(self.properties_file).get("controller.quorum.voters", "")
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
            **(self.security.broker_properties(self.port, controller_port) if self.security else {}),
            **self.extra_properties,
        }

    def _write_properties(self, controller_port: int) -> None:
        lines = ["# Written by streamapp.tools.localkafka.broker at every start; edits are overwritten."]
        lines += [f"{key}={value}" for key, value in self.properties(controller_port).items()]
        # Owner-only: a secured broker's file holds the admin password.
        write_private(self.properties_file, ("\n".join(lines) + "\n").encode())

    def _java_classpath_args(self, libs: Path) -> list[str]:
        log4j = self.data_dir / "log4j2.yaml"
        log4j.write_bytes(packaged("log4j2.yaml"))
        return ["-cp", f"{libs}/*", f"-Dlog4j2.configurationFile={log4j}"]

    def _format(self, java: str, libs: Path, cluster_id: str) -> None:
        # The tool and its arguments from an owner-only argument file, which the java launcher
        # reads: on the command line (/proc/<pid>/cmdline), the SCRAM passwords would show.
        arguments = ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.properties_file),
                     *(self.security.scram_arguments() if self.security else [])]
        argument_file = self.data_dir / "format.args"
        write_private(argument_file, "\n".join(_java_argument(argument) for argument in arguments).encode())
        try:
            proc = subprocess.run([java, *self._java_classpath_args(libs), f"@{argument_file}"],
                                  capture_output=True, text=True, cwd=self.data_dir)
        finally:
            argument_file.unlink()
        if proc.returncode != 0:
            log_file = self.data_dir / "format.log"
            # Owner-only: the tool's output may echo its arguments, the SCRAM passwords among them.
            write_private(log_file, (proc.stdout + proc.stderr).encode())
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
                    if run_async(functools.partial(answers_metadata, self.bootstrap, self.node_id,
                                                   min(5.0, max(remaining, 0.5)), self.client_options())):
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
        self._token_endpoint().stop()
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


def _java_argument(argument: str) -> str:
    """``argument`` as a line of a java launcher argument file: quoted, its backslashes doubled."""
    return '"' + argument.replace("\\", "\\\\") + '"'
