"""A cluster of local brokers: three KRaft nodes from one directory, every topic on all three."""
from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamapp.tools.localkafka.acls import add_pipeline_acls
from streamapp.tools.localkafka.broker import BrokerStatus, LocalBroker
from streamapp.tools.localkafka.common import DEFAULT_PORT, BrokerError, Notify
from streamapp.tools.localkafka.locations import default_data_dir
from streamapp.tools.localkafka.processes import ephemeral_ports, new_cluster_id, run_async
from streamapp.tools.localkafka.security import BrokerSecurity
from streamapp.units import milliseconds

CLUSTER_NODES = 3


def default_cluster_dir(port: int = DEFAULT_PORT) -> Path:
    """Data directory of ``streamapp broker --nodes 3`` when none is given: one per first port."""
    return default_data_dir(port).with_name(f"cluster-{port}")


class LocalCluster:
    """Three KRaft nodes on 127.0.0.1 sharing one cluster id, each in ``data_dir/node-N``.

    Node N (1-based) listens for clients on ``port + N - 1`` and for the quorum on
    ``port + nodes + N - 1``, so the ports follow from the first one: 9092-9094 for clients and
    9095-9097 for the controllers by default. Topics get three copies and
    ``min.insync.replicas`` 2. With ``security`` (kept in ``data_dir/security``) every node has
    the same CA, certificate and users, and the ACLs are added once the cluster runs.

    The ports must lie outside the system's ephemeral range: while a node is down, another
    node's connection attempt to its port can be given that very port as its own local port and
    connect to itself (TCP simultaneous open), which kills the connecting node's quorum client
    and keeps the restarted node from binding.
    """

    def __init__(self, data_dir: Path | str, port: int = DEFAULT_PORT, *, nodes: int = CLUSTER_NODES,
                 notify: Notify | None = None, security: BrokerSecurity | None = None,
                 **broker_options) -> None:
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
        self.security = security
        controller_ports = [port + nodes + number for number in range(nodes)]
        voters = ",".join(f"{number + 1}@127.0.0.1:{controller}" for number, controller in enumerate(controller_ports))
        self.nodes = [
            LocalBroker(self.data_dir / f"node-{number + 1}", port + number, controller_port=controller,
                        node_id=number + 1, voters=voters, replication=min(3, nodes), notify=notify,
                        security=security, **broker_options)
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
            if self.security and self.security.acls:
                add_pipeline_acls(self.bootstrap, self.security)
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
        return run_async(lambda: count_under_replicated(self.bootstrap, timeout_s, self.nodes[0].client_options()))


async def count_under_replicated(bootstrap: str, timeout_s: float = 10.0,
                                 client_options: Mapping[str, Any] | None = None) -> int:
    """Partitions of every topic on the cluster at ``bootstrap`` with fewer in-sync copies than
    replicas; -1 when the cluster cannot be asked."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=milliseconds(timeout_s),
                                **(client_options or {}))
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
