"""What this project changes in aiokafka, installed together by every process of it that talks to
Kafka (workers, the ``streamapp`` command, the benchmark's copy): responses read whole
(:mod:`streamapp.kafkaread`), produce requests written unjoined (:mod:`streamapp.kafkawrite`),
record batch checksums by the processor's CRC instruction (:mod:`streamapp.kafkacrc`). The bytes
on the wire are aiokafka's either way."""

from __future__ import annotations

from streamapp import kafkacrc, kafkaread, kafkawrite


def install() -> None:
    """Idempotent: each part installs itself once."""
    kafkaread.install()
    kafkawrite.install()
    kafkacrc.install()
