"""The broker manager against a real broker process: start, status, restart with the same data,
stop, and a broker that dies during start."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.cli.main import main
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.common import BrokerError
from streamapp.tools.localkafka.processes import free_port

pytestmark = pytest.mark.kafka


async def has_topic(bootstrap: str, name: str, create: bool = False) -> bool:
    """Whether the broker lists `name` within 30 s: a new topic reaches the broker's metadata
    cache a moment after create_topics returns."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if create:
            await admin.create_topics([NewTopic(name, 1, 1)])
        for _ in range(300):
            if name in await admin.list_topics():
                return True
            await asyncio.sleep(0.1)
        return False
    finally:
        await admin.close()


def test_start_status_restart_stop(tmp_path):
    notes = []
    broker = LocalBroker(tmp_path / "broker", free_port(), notify=notes.append)
    try:
        broker.start(timeout=120)
        status = broker.status()
        assert status.running and status.port == broker.port and status.bootstrap == broker.bootstrap
        assert broker.pid_file.read_text().strip() == str(status.pid)
        assert asyncio.run(has_topic(broker.bootstrap, "kept", create=True))

        with pytest.raises(BrokerError, match="already running"):
            LocalBroker(broker.data_dir, free_port()).start()

        assert broker.stop() == "stopped"
        assert not broker.status().running and not broker.pid_file.exists()

        broker.start(timeout=120)  # same data dir: same cluster, topics still there
        assert asyncio.run(has_topic(broker.bootstrap, "kept"))
    finally:
        broker.stop()
    assert not any("killed" in note for note in notes), notes


def test_cli_start_status_stop(tmp_path, capsys):
    port, data_dir = str(free_port()), str(tmp_path / "cli")
    try:
        assert main(["broker", "start", "--port", port, "--data-dir", data_dir]) == 0
        assert f"running: 127.0.0.1:{port}" in capsys.readouterr().out
        assert main(["broker", "status", "--data-dir", data_dir]) == 0
        assert f"127.0.0.1:{port}" in capsys.readouterr().out
    finally:
        assert main(["broker", "stop", "--data-dir", data_dir]) == 0
    assert "stopped" in capsys.readouterr().out
    assert main(["broker", "status", "--data-dir", data_dir]) == 3


def test_a_broker_that_dies_during_start_is_reported_with_its_log(tmp_path):
    broker = LocalBroker(tmp_path / "broker", free_port())
    broker.start(timeout=120)
    broker.stop()
    broken = LocalBroker(broker.data_dir, broker.port, extra_properties={"log.segment.bytes": 1})
    with pytest.raises(BrokerError) as info:
        broken.start(timeout=60)
    message = str(info.value)
    assert "exited with code" in message and str(broken.log_file) in message
    assert "log.segment.bytes" in message  # the broker's own words, from the tail of its log
    assert not broken.pid_file.exists()
