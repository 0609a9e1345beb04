"""``streamapp record`` and ``streamapp replay`` on the real broker: what is recorded from a topic
comes back on another with the same keys, values, headers and partitions."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.cli.main import main
from streamapp.tools.replay.format import Recording

pytestmark = pytest.mark.replay


async def create(bootstrap: str, *topics: tuple[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name, partitions in topics])
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for number in range(count):
            key = None if number % 5 == 0 else f"key-{number % 7}".encode()
            await producer.send_and_wait(topic, f"value-{number}".encode(), key=key, partition=number % 3,
                                         headers=[("n", str(number).encode()), ("none", None)])
    finally:
        await producer.stop()


async def consume(bootstrap: str, topic: str, count: int) -> list:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    found = []
    try:
        while len(found) < count:
            for records in (await consumer.getmany(timeout_ms=10_000)).values():
                found += records
    finally:
        await consumer.stop()
    return found


def test_recorded_topics_replay_with_keys_headers_and_partitions(kafka_bootstrap, unique_topic, tmp_path,
                                                                 monkeypatch, capsys):
    source, copy, wider = unique_topic, f"{unique_topic}-copy", f"{unique_topic}-wider"
    asyncio.run(create(kafka_bootstrap, (source, 3), (copy, 3), (wider, 6)))
    asyncio.run(produce(kafka_bootstrap, source, 30))
    monkeypatch.setenv("STREAMAPP_BROKER", f"kafka://{kafka_bootstrap}")
    recording = tmp_path / "topic.rec"

    assert main(["record", "--topics", source, "--out", str(recording)]) == 0
    recorded = list(Recording(recording))
    assert len(recorded) == 30 and Recording(recording).header.topics == {source: 3}
    assert sorted((r.partition, r.offset) for r in recorded) == sorted(
        (number % 3, number // 3) for number in range(30))
    assert all(r.headers == (("n", r.value.removeprefix(b"value-")), ("none", None)) for r in recorded)

    assert main(["replay", str(recording), "--rename", f"{source}={copy}", "--speed", "max"]) == 0
    replayed = asyncio.run(consume(kafka_bootstrap, copy, 30))
    by_value = sorted((m.value, m.partition, m.key, tuple(m.headers)) for m in replayed)
    assert by_value == sorted((r.value, r.partition, r.key, r.headers) for r in recorded)

    assert main(["replay", str(recording), "--rename", f"{source}={wider}"]) == 1
    assert "recorded with 3 partitions but" in capsys.readouterr().err

    assert main(["record", "--topics", source, "--max-records", "7", "--out", str(recording)]) == 0
    assert len(list(Recording(recording))) == 7
    assert main(["record", "--topics", source, "--follow", "--duration", "2s", "--out", str(recording)]) == 0
    assert len(list(Recording(recording))) == 30
    assert main(["record", "--topics", "no-such-topic-here", "--out", str(tmp_path / "x.rec")]) == 1
    assert "does not exist" in capsys.readouterr().err
