"""The broker started with ``--security sasl_ssl --acls`` (the ``secure_kafka`` fixture): TLS
with the generated CA, SCRAM-SHA-512 users, and a pipeline user that holds only its ACLs."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from streamapp.tools.localkafka.security import ADMIN, PIPELINE
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
