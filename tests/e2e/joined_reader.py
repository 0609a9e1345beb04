"""Reading the ``joined`` topic back, shared by the end-to-end tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer

from streamapp import wire
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes, topic_names

T = TypeVar("T")


async def read_joined(settings: Settings, expected: int, timeout_s: float,
                      keep: Callable[[wire.Joined], T]) -> list[T]:
    """``keep`` of every record on ``joined``, read until ``expected`` distinct frames and one
    quiet second more (to catch a repeat). ``keep`` decides what of each record stays in memory."""
    consumer = AIOKafkaConsumer(topic_names(settings)["joined"], bootstrap_servers=settings.bootstrap_servers,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                max_partition_fetch_bytes=max_record_bytes(settings))
    await consumer.start()
    kept: list[T] = []
    frames: set[wire.FrameId] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for record in records:
                    joined = wire.decode_joined(record.value)
                    frames.add(joined.frame.id)
                    kept.append(keep(joined))
            if len(frames) >= expected and not batches:
                break
    finally:
        await consumer.stop()
    return kept
