"""Shared fixtures. ``kafka_bootstrap`` is a real Kafka broker for the whole test session;
``secure_kafka`` another one that takes SASL_SSL clients and authorizes them by ACLs;
``mtls_kafka`` (client certificates) and ``oauth_kafka`` (OAUTHBEARER) others, per module."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamapp import assets
from streamapp.settings import Settings
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.localkafka.common import BrokerError
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.localkafka.security import ADMIN, MUTUAL_TLS, USERS, BrokerSecurity

BROKER_FIXTURES = {"kafka_bootstrap", "secure_kafka", "mtls_kafka", "oauth_kafka"}
# The OAUTHBEARER broker's tokens live this long, so a test sees them refreshed.
SHORT_TOKEN_LIFETIME_S = 20.0


def pytest_collection_modifyitems(items):
    # Whatever uses a broker is a kafka test, so `-m "not kafka"` leaves all of them out.
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
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
    with _running(broker):
        yield broker.bootstrap


@dataclasses.dataclass(frozen=True)
class SecureKafka:
    """A broker whose one client listener is secured as :attr:`security` says (by default
    SASL_SSL with SCRAM-SHA-512), with ACLs: ``admin`` is a super user, ``pipeline`` holds
    :func:`~streamapp.tools.localkafka.acls.pipeline_acls` of :attr:`settings` (the default
    settings: app id ``streamapp``, no topic prefix)."""

    bootstrap: str  # "localhost:PORT", the only name in the broker's certificate
    ca_file: Path
    passwords: dict[str, str]  # {"admin": ..., "pipeline": ...}
    settings: Settings
    security: BrokerSecurity

    def env(self, user: str) -> dict[str, str]:
        """STREAMAPP_BROKER and the STREAMAPP_* security settings of ``user`` (password from a file)."""
        return self.security.client_env(self.bootstrap, user)

    def admin_env(self) -> dict[str, str]:
        return self.env(ADMIN)

    def client_options(self, user: str) -> dict[str, Any]:
        """aiokafka keyword arguments that connect as ``user``."""
        return self.security.client_options(user)


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory) -> Iterator[SecureKafka]:
    """A secured broker on a free port, started once per session like ``kafka_bootstrap``."""
    yield from _secured(tmp_path_factory, "kafka-secure")


@pytest.fixture(scope="module")
def mtls_kafka(tmp_path_factory) -> Iterator[SecureKafka]:
    """A broker whose client listener is SSL requiring a client certificate (mutual TLS)."""
    yield from _secured(tmp_path_factory, "kafka-mtls", mode=MUTUAL_TLS)


@pytest.fixture(scope="module")
def oauth_kafka(tmp_path_factory) -> Iterator[SecureKafka]:
    """A SASL_SSL broker whose users are OAUTHBEARER clients of a local token endpoint, each token
    valid SHORT_TOKEN_LIFETIME_S."""
    yield from _secured(tmp_path_factory, "kafka-oauth", oauth=True, token_lifetime_s=SHORT_TOKEN_LIFETIME_S)


def _secured(tmp_path_factory, name: str, **security_options) -> Iterator[SecureKafka]:
    data_dir = tmp_path_factory.mktemp(name)
    settings = Settings()
    security = BrokerSecurity(data_dir / "security", acls_for=settings, **security_options)
    broker = LocalBroker(data_dir, free_port(), security=security, heap="512m")
    with _running(broker):
        yield SecureKafka(broker.bootstrap, security.ca_file, {user: security.password(user) for user in USERS},
                          settings, security)


@contextlib.contextmanager
def _running(broker: LocalBroker):
    """The broker started (or the test failed with why not), stopped at the end, its topics deleted."""
    try:
        broker.start(timeout=120)
    except BrokerError as exc:
        pytest.fail(f"cannot start the test Kafka broker: {exc}", pytrace=False)
    try:
        yield broker
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
