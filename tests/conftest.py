"""Shared fixtures. ``kafka_bootstrap`` is a real Kafka broker for the whole test session."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid

import pytest

from streamapp import assets
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.common import BrokerError
from streamapp.tools.localkafka.processes import free_port


def pytest_collection_modifyitems(items):
    # Whatever uses the broker is a kafka test, so `-m "not kafka"` leaves all of them out.
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    """``host:port`` of a Kafka broker: ``$KAFKA_BOOTSTRAP_SERVERS`` when set, else one started here.

    The broker started here listens on a free port, keeps its data in a temporary directory and
    is stopped at the end of the session; its topic data is then deleted, its log kept.
    """
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external.removeprefix("kafka://")
        return
    data_dir = tmp_path_factory.mktemp("kafka-broker")
    broker = LocalBroker(data_dir, free_port())
    try:
        broker.start(timeout=120)
    except BrokerError as exc:
        pytest.fail(f"cannot start the test Kafka broker: {exc}", pytrace=False)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
        shutil.rmtree(broker.log_dirs, ignore_errors=True)


@pytest.fixture
def small_disks(tmp_path):
    """``mount(name, size)``: a real file system (tmpfs) of ``size`` (64 MiB unless given, e.g.
    ``"8m"``) at ``tmp_path / name``; all unmounted afterwards. Needs root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = []

    def mount(name: str, size: str = "64m"):
        mount_point = tmp_path / name
        mount_point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
        mounted.append(mount_point)
        return mount_point

    try:
        yield mount
    finally:
        for mount_point in mounted:
            subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


@pytest.fixture
def small_disk(small_disks):
    return small_disks("disk")


def fill_disk(directory, leave_bytes: int = 0):
    """Fill the file system of ``directory`` with one file, leaving about ``leave_bytes`` free;
    returns the file (delete it to give the space back)."""
    filler = directory / "filler"
    with open(filler, "ab") as file:
        while shutil.disk_usage(directory).free > leave_bytes:
            try:
                file.write(b"\0" * min(1024**2, max(4096, shutil.disk_usage(directory).free - leave_bytes)))
                file.flush()
            except OSError:
                break
    return filler


@pytest.fixture
def unique_topic(request):
    """A topic name no other test (or earlier run against the same broker) uses."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:100]
    return f"test-{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def model_files():
    """The YOLOv3-tiny files, fetched into the cache (``streamapp model``) on first use."""
    return _fetched(assets.MODEL)


@pytest.fixture(scope="session")
def sample_videos():
    """``{name: path}`` of the sample videos, fetched into the cache (``streamapp samples``) on first use."""
    return dict(zip((asset.name for asset in assets.SAMPLES), _fetched(assets.SAMPLES), strict=True))


def _fetched(files):
    try:
        return assets.ensure(files)
    except assets.AssetError as exc:
        pytest.fail(f"cannot fetch {', '.join(asset.name for asset in files)}: {exc}", pytrace=False)
