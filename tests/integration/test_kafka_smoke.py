"""The real broker carries what the pipeline needs: large records with keys and headers, and
topics created with explicit configs (auto-creation is off)."""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streamapp.kafka import client as kafkaclient, crc as kafkacrc, read as kafkaread, write as kafkawrite
from streamapp.tools.localkafka.security import ADMIN

pytestmark = pytest.mark.kafka

MIB = 1024**2
COUNT = 200


def payload(index: int) -> bytes:
    return random.Random(index).randbytes(MIB)


@pytest.fixture(params=["PLAINTEXT", "SASL_SSL"])
def connection(request) -> tuple[str, dict]:
    """Bootstrap servers and aiokafka options of the plain test broker, or of the secured one as
    its admin: the project's changes to aiokafka's connection must hold over TLS too."""
    if request.param == "PLAINTEXT":
        return request.getfixturevalue("kafka_bootstrap"), {}
    secure = request.getfixturevalue("secure_kafka")
    return secure.bootstrap, secure.client_options(ADMIN)


async def create_topic(bootstrap: str, topic: NewTopic, options: dict | None = None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(options or {}))
    await admin.start()
    try:
        response = await admin.create_topics([topic])
        errors = [e for e in response.to_object()["topic_errors"] if e["error_code"]]
        assert not errors, errors
    finally:
        await admin.close()


async def topic_configs(bootstrap: str, topic: str) -> dict[str, tuple[str, int]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    [resource] = response.to_object()["resources"]
    assert resource["error_code"] == 0, resource
    return {e["config_names"]: (e["config_value"], e["config_source"]) for e in resource["config_entries"]}


def test_200_records_of_1mib_with_keys_and_headers_round_trip(connection, unique_topic, monkeypatch):
    """Read and written as the worker does: fetches of up to 32 MiB decoded from the socket's reads
    (streamapp.kafka.read), produce requests whose record batches go to the socket unjoined
    (streamapp.kafka.write), batches built and checked with the CPU's CRC-32C (streamapp.kafka.crc):
    the broker checks every batch's checksum, so a wrong one would be refused. Over PLAINTEXT and
    over SASL_SSL. Each change counts its calls, made by aiokafka's public producer and consumer:
    each is on their path."""
    bootstrap, options = connection
    kafkaclient.install()
    calls = {"chunked responses": 0, "produce requests": 0, "batches built": 0, "batch checksums": 0}
    _count_calls(monkeypatch, calls)

    async def scenario():
        await create_topic(bootstrap, NewTopic(unique_topic, 3, 1), options)
        sent = {}
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    max_request_size=4 * MIB, linger_ms=5, **options)
        await producer.start()
        try:
            pending = []
            for i in range(COUNT):
                key = f"stream-{i % 7}:frame-{i:05d}".encode()
                body = payload(i)
                headers = [("index", str(i).encode()), ("sha256", hashlib.sha256(body).digest()),
                           ("empty", b"")]
                sent[key] = (hashlib.sha256(body).hexdigest(), headers)
                pending.append(await producer.send(unique_topic, body, key=key, headers=headers))
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

        received = {}
        consumer = AIOKafkaConsumer(unique_topic, bootstrap_servers=bootstrap, group_id=None,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    max_partition_fetch_bytes=4 * MIB, fetch_max_bytes=32 * MIB, **options)
        await consumer.start()
        try:
            async with asyncio.timeout(120):
                while len(received) < COUNT:
                    batches = await consumer.getmany(timeout_ms=1000)
                    for records in batches.values():
                        for record in records:
                            assert record.key not in received, f"duplicate {record.key!r}"
                            assert len(record.value) == MIB
                            received[record.key] = (hashlib.sha256(record.value).hexdigest(),
                                                    list(record.headers))
        finally:
            await consumer.stop()
        return sent, received

    sent, received = asyncio.run(scenario())
    assert set(received) == set(sent)
    assert all(calls.values()), calls
    for key, (digest, headers) in sent.items():
        got_digest, got_headers = received[key]
        assert got_digest == digest, key
        assert [(name, bytes(value)) for name, value in got_headers] == headers, key


def _count_calls(monkeypatch: pytest.MonkeyPatch, calls: dict[str, int]) -> None:
    """Each change of streamapp.kafka counts its calls into ``calls`` and does what it did."""

    def counted(name, function):
        def call(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return call

    class CountedChunksReader(kafkaread.ChunksReader):
        def __init__(self, chunks):
            calls["chunked responses"] += 1
            super().__init__(chunks)

    monkeypatch.setattr(kafkaread, "ChunksReader", CountedChunksReader)
    monkeypatch.setattr(kafkawrite, "produce_request_pieces",
                        counted("produce requests", kafkawrite.produce_request_pieces))
    monkeypatch.setattr(kafkacrc.LeanBatchBuilder, "build", counted("batches built", kafkacrc.LeanBatchBuilder.build))
    monkeypatch.setattr(kafkacrc, "batch_crc_ok", counted("batch checksums", kafkacrc.batch_crc_ok))


def test_compact_delete_topic_with_explicit_configs(kafka_bootstrap, unique_topic):
    configs = {
        "cleanup.policy": "compact,delete",
        "retention.ms": "3600000",
        "retention.bytes": str(256 * MIB),
        "segment.bytes": str(8 * MIB),
        "max.message.bytes": str(17 * MIB),
        "min.compaction.lag.ms": "1000",
    }
    asyncio.run(create_topic(kafka_bootstrap, NewTopic(unique_topic, 2, 1, topic_configs=configs)))
    described = asyncio.run(topic_configs(kafka_bootstrap, unique_topic))
    DYNAMIC_TOPIC_CONFIG = 1  # set on this topic, not inherited from the broker
    for name, value in configs.items():
        assert described[name] == (value, DYNAMIC_TOPIC_CONFIG), name


def test_broker_accepts_frames_of_16mib(kafka_bootstrap):
    async def broker_configs():
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            node = (await admin.describe_cluster())["brokers"][0]["node_id"]
            [response] = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, str(node))])
        finally:
            await admin.close()
        [resource] = response.to_object()["resources"]
        return {e["config_names"]: e["config_value"] for e in resource["config_entries"]}

    configs = asyncio.run(broker_configs())
    assert int(configs["message.max.bytes"]) >= 16 * MIB
    assert int(configs["replica.fetch.max.bytes"]) >= 16 * MIB
    assert configs["auto.create.topics.enable"] == "false"
