"""What this project changes in aiokafka, installed together by every process of it that talks to
Kafka (workers, the ``streamapp`` command, the benchmark's copy): responses read whole
(:mod:`streamapp.kafka.read`), produce requests written unjoined (:mod:`streamapp.kafka.write`),
record batch checksums by the processor's CRC instruction (:mod:`streamapp.kafka.crc`). The bytes
on the wire are aiokafka's either way. Its debug log shows no SASL credentials
(:mod:`streamapp.kafka.sasllog`)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer

from streamapp.kafka import crc as kafkacrc, read as kafkaread, sasllog, seams, write as kafkawrite


def install() -> None:
    """Check every seam (streamapp.kafka.seams: SeamMovedError when a library moved under one),
    then install. Idempotent: each part installs itself once."""
    seams.require_all()
    kafkaread.install()
    kafkawrite.install()
    kafkacrc.install()
    sasllog.install()


async def learn_topics(consumer: AIOKafkaConsumer) -> None:
    """Have ``consumer`` fetch the cluster's metadata now: aiokafka learns of topics lazily."""
    await consumer._client.force_metadata_update()
