"""Dead letters: a record a stage cannot use goes here whole, with why and where it came from (R11).

The value is the original bytes untouched; headers say ``reason``, ``stage`` and the source
``topic``/``partition``/``offset``, so a record can be inspected or replayed from the topic alone.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import cast

import faust
from faust.exceptions import ProducerSendError
from faust.types import EventT

from streamapp.jpeg import OverPixelBudget
from streamapp.kafka.transactions import Sender, Transactions
from streamapp.worker.metrics import Metrics

log = logging.getLogger(__name__)

# A reason longer than this is cut: it is for people, and must never make the record too large.
MAX_REASON_BYTES = 1024


class DeadLetters:
    """Dead letters, and the outputs of the stages that may be refused (too large) in their place.

    Each record goes to Faust's producer, or under exactly-once to the transaction of the
    partition its event came from (``transactions``): a dead letter or output commits with the
    offset of the event it stands for."""

    def __init__(self, topic: faust.TopicT, metrics: Metrics, transactions: Transactions | None = None) -> None:
        self.topic = topic
        self.metrics = metrics
        self.transactions = transactions

    def _sender(self, event: EventT) -> Sender:
        if self.transactions is None:
            return cast(Sender, self.topic.app.producer)
        return self.transactions.sender(event)

    async def send(self, event: EventT, *, stage: str, reason: str) -> None:
        """Dead-letter ``event``: exactly one record, whatever the record is (R11)."""
        message = event.message
        reason = short(reason)
        log.warning("dead-lettered %s[%d]@%d in %s: %s",
                    message.topic, message.partition, message.offset, stage, reason,
                    extra={"topic": message.topic, "partition": message.partition, "offset": message.offset})
        headers = dead_letter_headers(stage, reason, message.topic, message.partition, message.offset)
        sender, name = self._sender(event), self.topic.get_topic_name()
        try:
            # A record with neither key nor value (an empty tombstone) cannot be produced as is.
            value = b"" if message.value is None and message.key is None else message.value
            await sender.send(name, message.key, value, None, None, headers)
        except ProducerSendError as exc:
            # Our headers pushed a record at the size limit over it: keep why and where it came
            # from, the original stays at its source offset until retention.
            await sender.send(name, message.key, b"", None, None, headers + [
                ("original_dropped", short(f"{len(message.value or b'')} bytes: {exc}").encode()),
            ])
        self.metrics.inc(f"{stage}_dead_lettered_total")

    async def refuse(self, event: EventT, *, stage: str, error: Exception) -> None:
        """Dead-letter ``event`` for ``error``; a frame over the pixel budget is also counted in
        ``<stage>_over_pixel_budget_total``."""
        if isinstance(error, OverPixelBudget):
            self.metrics.inc(f"{stage}_over_pixel_budget_total")
        await self.send(event, stage=stage, reason=str(error))

    async def emit(self, event: EventT, *, stage: str, topic: faust.TopicT, key: bytes,
                   value: bytes, timestamp: float | None = None) -> Awaitable | None:
        """Send what ``event`` produced to ``topic``; returns its delivery, or None when the
        producer refused it (too large) and ``event`` was dead-lettered instead. ``timestamp``
        (seconds) is the output's Kafka timestamp; None stamps it now.

        Straight to the producer: the topic's own send wraps every record in Faust's message and
        callback objects, which cost more than the send itself, for nothing used here. Faust
        still flushes its producer before it commits offsets."""
        try:
            return await self._sender(event).send(topic.get_topic_name(), key, value, None, timestamp, None)
        except ProducerSendError as exc:
            await self.send(event, stage=stage, reason=f"output to {topic.get_topic_name()} refused: {exc}")
            return None


def short(reason: str) -> str:
    """``reason`` cut to MAX_REASON_BYTES in UTF-8 (a character cut in two is left out), for the
    header and the log line alike: a hostile record's header values can make it 64 KiB long."""
    return reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")


def dead_letter_headers(stage: str, reason: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    return [
        ("reason", short(reason).encode()),
        ("stage", stage.encode()),
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
    ]
