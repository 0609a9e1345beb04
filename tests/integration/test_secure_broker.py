"""The broker started with ``--security sasl_ssl --acls`` (the ``secure_kafka`` fixture): TLS
with the generated CA, SCRAM-SHA-512 users, and a pipeline user that holds only its ACLs."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from streamapp.settings import Settings
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.localkafka.security import ADMIN, PIPELINE
from streamapp.tools.workers import READY_MARKER, Process, wait_until
from streamapp.topics import topic_names

TOPIC_AUTHORIZATION_FAILED = 29


async def create_topics(secure_kafka, user: str, *names: str) -> dict[str, int]:
    """Each topic's error code when ``user`` creates it (0: created), with the pipeline's partition
    count: the session's other tests create or verify the same topics on this broker."""
    admin = AIOKafkaAdminClient(bootstrap_servers=secure_kafka.bootstrap, **secure_kafka.client_options(user))
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, secure_kafka.settings.partitions, 1) for name in names])
    finally:
        await admin.close()
    return {error["topic"]: error["error_code"] for error in response.to_object()["topic_errors"]}


async def refusal(secure_kafka, topic: str, group_id: str) -> type[Exception] | None:
    """The authorization error the pipeline user meets consuming ``topic`` in ``group_id``."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=secure_kafka.bootstrap, group_id=group_id,
                                **secure_kafka.client_options(PIPELINE))
    try:
        await consumer.start()
        await consumer.getmany(timeout_ms=5000)
    except (TopicAuthorizationFailedError, GroupAuthorizationFailedError) as exc:
        return type(exc)
    finally:
        await consumer.stop()
    return None


def test_the_certificate_names_localhost_only(secure_kafka):
    port = int(secure_kafka.bootstrap.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=str(secure_kafka.ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with context.wrap_socket(sock, server_hostname="localhost") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch|doesn't match"):
            context.wrap_socket(sock, server_hostname="127.0.0.1")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # a CA it does not know
        with pytest.raises(ssl.SSLCertVerificationError, match="self-signed|local issuer"):
            ssl.create_default_context().wrap_socket(sock, server_hostname="localhost")


def test_pipeline_user_holds_its_acls_and_no_more(secure_kafka):
    """The admin creates topics; the pipeline user writes and reads the frames in its consumer
    group, and can neither create a topic nor touch one or a group outside its ACLs."""
    frames = topic_names(secure_kafka.settings)["frames"]
    group = secure_kafka.settings.replace(stages=("resize",)).group_id
    pipeline = secure_kafka.client_options(PIPELINE)

    async def scenario():
        created = await create_topics(secure_kafka, ADMIN, frames, "not-the-pipelines")
        assert set(created.values()) <= {0, 36}, created  # 36: made by an earlier test of this session
        assert await create_topics(secure_kafka, PIPELINE, "made-by-pipeline") == {
            "made-by-pipeline": TOPIC_AUTHORIZATION_FAILED}

        producer = AIOKafkaProducer(bootstrap_servers=secure_kafka.bootstrap, acks="all", **pipeline)
        await producer.start()
        try:
            sent = await producer.send_and_wait(frames, b"frame", key=b"stream-1")
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait("not-the-pipelines", b"frame")
        finally:
            await producer.stop()

        consumer = AIOKafkaConsumer(frames, bootstrap_servers=secure_kafka.bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False, **pipeline)
        await consumer.start()
        try:
            async with asyncio.timeout(60):
                while True:
                    batches = await consumer.getmany(timeout_ms=1000)
                    if any(record.offset == sent.offset for records in batches.values() for record in records):
                        break
            await consumer.commit()
        finally:
            await consumer.stop()

        assert await refusal(secure_kafka, "not-the-pipelines", group) is TopicAuthorizationFailedError
        assert await refusal(secure_kafka, frames, "not-the-pipelines-group") is GroupAuthorizationFailedError

    asyncio.run(scenario())


def test_a_worker_logging_at_debug_shows_no_sasl_password(secure_kafka, tmp_path):
    """PLAIN sends the password in its authentication request, which aiokafka logs whole at DEBUG."""
    base = {name: value for name, value in os.environ.items() if not name.startswith("STREAMAPP_")}
    settings = Settings.from_env({
        **secure_kafka.env(ADMIN), "STREAMAPP_SASL_MECHANISM": "PLAIN", "STREAMAPP_STAGES": "resize",
        "STREAMAPP_TOPIC_PREFIX": f"debuglog-{uuid.uuid4().hex[:8]}.", "STREAMAPP_DATA_DIR": str(tmp_path / "data"),
        "STREAMAPP_WEB_PORT": str(free_port())})
    argv = [str(Path(sys.executable).with_name("faust")), "-A", "streamapp.app", "worker", "-l", "debug",
            "--web-port", str(settings.web_port)]
    worker = Process("debug-logging worker", argv, tmp_path / "worker.log", READY_MARKER,
                     env={**base, **settings.to_env()})
    try:
        wait_until(worker.ready, 120, "the worker to be ready")
    finally:
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert secure_kafka.passwords[ADMIN] not in log
    assert "SaslAuthenticateRequest_v1(***)" in log  # the exchange was logged, at DEBUG
