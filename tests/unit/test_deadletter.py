"""A dead letter's reason is cut alike in its header and its log line: a hostile record's header
values, quoted in the reason, can make it 64 KiB long."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from streamapp.worker.deadletter import MAX_REASON_BYTES, DeadLetters
from streamapp.worker.metrics import Metrics


class Producer:
    """Keeps what it is asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    async def send(self, *record) -> None:
        self.sent.append(record)


def test_a_long_reason_is_cut_alike_in_the_header_and_the_log_line(caplog):
    producer = Producer()
    topic = SimpleNamespace(app=SimpleNamespace(producer=producer), get_topic_name=lambda: "dead-letters")
    event = SimpleNamespace(message=SimpleNamespace(topic="frames", partition=0, offset=7, key=b"k", value=b"v"))
    reason = "header field 'stream' is " + "é" * 40_000  # two bytes each: a cut may split one
    with caplog.at_level(logging.WARNING, logger="streamapp.worker.deadletter"):
        asyncio.run(DeadLetters(topic, Metrics()).send(event, stage="resize", reason=reason))
    [(name, key, value, _, _, headers)] = producer.sent
    header = dict(headers)["reason"].decode()
    assert (name, key, value) == ("dead-letters", b"k", b"v")
    assert MAX_REASON_BYTES - 1 <= len(header.encode()) <= MAX_REASON_BYTES and reason.startswith(header)
    [line] = [record.getMessage() for record in caplog.records]
    assert line == f"dead-lettered frames[0]@7 in resize: {header}"
