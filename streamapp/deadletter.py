"""Dead letters: a record a stage cannot use goes here whole, with why and where it came from (R11).

The value is the original bytes untouched; headers say ``reason``, ``stage`` and the source
``topic``/``partition``/``offset``, so a record can be inspected or replayed from the topic alone.
"""

from __future__ import annotations

import logging

import faust
from faust.types import EventT

from streamapp.metrics import Metrics

log = logging.getLogger(__name__)

# A reason longer than this is cut: it is for people, and must never make the record too large.
MAX_REASON_BYTES = 1024


class DeadLetters:
    def __init__(self, topic: faust.TopicT, metrics: Metrics) -> None:
        self.topic = topic
        self.metrics = metrics

    async def send(self, event: EventT, *, stage: str, reason: str) -> None:
        message = event.message
        log.warning("dead-lettered %s[%d]@%d in %s: %s",
                    message.topic, message.partition, message.offset, stage, reason)
        await self.topic.send(
            key=message.key,
            value=message.value,
            headers=dead_letter_headers(stage, reason, message.topic, message.partition, message.offset),
        )
        self.metrics.inc(f"{stage}_dead_lettered_total")


def dead_letter_headers(stage: str, reason: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    return [
        ("reason", reason.encode()[:MAX_REASON_BYTES]),
        ("stage", stage.encode()),
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
    ]
