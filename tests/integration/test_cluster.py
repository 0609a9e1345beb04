"""The pipeline on a local three-node cluster (every topic on all three nodes, min.insync.replicas
2, producers acks=all) while frames stream: a node killed with SIGKILL and started again, and a
rolling restart of every node, lose no frame, write none twice, stop no worker, and the nodes
that came back catch up (every partition has its three copies in sync again).

The cluster is the module's own (never the session's broker); the faults come from
``streamapp bench chaos`` with no stage kills, so the bench's accounting is what is checked.
"""

import pytest

from streamapp.settings import Settings
from streamapp.tools.chaos import ChaosOptions, run_chaos
from streamapp.tools.localkafka.cluster import LocalCluster
from streamapp.tools.localkafka.processes import free_port_block

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

NODES = 3


@pytest.fixture(scope="module")
def cluster(kafka_bootstrap, tmp_path_factory):
    # Depends on the session broker only to be skipped or failed with it (same jars, same Java).
    own = LocalCluster(tmp_path_factory.mktemp("cluster"), free_port_block(2 * NODES), nodes=NODES, heap="512m")
    own.start(timeout=180)
    try:
        yield own
    finally:
        own.stop()


def chaos_on(cluster: LocalCluster, tmp_path, **faults) -> dict:
    options = ChaosOptions(kills=0, streams=1, fps=8.0, pause_s=(2.0, 4.0), join_ttl_s=30.0, seed=3,
                           out=tmp_path / "chaos", **faults)
    return run_chaos(options, Settings(partitions=2), cluster)


def assert_nothing_lost(report: dict) -> None:
    assert report["frames_produced"] > 0
    assert report["lost"] == 0, report["lost_examples"]
    assert report["joined_missing"] == 0
    assert report["sink_duplicates"] == 0
    assert report["workers_exited"] == [], "no worker may stop because a broker did"
    assert report["brokers_in_sync_s"]["not_in_sync"] == 0, report["broker_log"]


def test_a_broker_killed_under_load_loses_nothing_and_catches_up(cluster, tmp_path):
    report = chaos_on(cluster, tmp_path, broker_kills=1)
    assert report["broker_kills"] == 1
    assert_nothing_lost(report)
    assert cluster.under_replicated_partitions() == 0


def test_a_rolling_restart_of_every_broker_under_load_loses_nothing(cluster, tmp_path):
    report = chaos_on(cluster, tmp_path, rolling_restarts=1)
    assert sorted(fault["node"] for fault in report["broker_log"]) == [1, 2, 3]
    assert report["broker_restarts"] == NODES
    assert_nothing_lost(report)
