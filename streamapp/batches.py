"""Batches of events from a Faust stream, bounded in bytes and in records, acked after the batch.

Faust's ``Stream.take_events`` counts records (a batch of 4K frames would be gigabytes) and holds a
part-full batch for its whole timeout. Here a batch closes as soon as it is full, in bytes or
records, or ``linger_s`` after the stream buffer first had nothing more waiting: under load
batches grow, at a trickle a record waits at most the linger. Events are acked only when the
code consuming the batch is done with it, so offsets commit after the batch's outputs
(at-least-once).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from faust import Stream
from faust.types import EventT

from streamapp.units import event_bytes


async def take_batches(stream: Stream, *, max_bytes: int, max_events: int, linger_s: float = 0.005,
                       idle_s: float = 1.0) -> AsyncIterator[list[EventT]]:
    loop = asyncio.get_running_loop()
    batch: list[EventT] = []
    size = 0
    linger: asyncio.TimerHandle | None = None
    ready = asyncio.Event()        # hand the batch over now
    handed_over = asyncio.Event()  # the consumer is done with it
    accepting = asyncio.Event()    # clear while the consumer holds a batch
    accepting.set()
    waiting = getattr(stream.channel, "queue", None)

    async def add(value: Any) -> Any:
        nonlocal size, linger
        await accepting.wait()
        event = stream.current_event
        if event is None:
            raise RuntimeError("batched stream has no current event")
        batch.append(event)
        size += event_bytes(event)
        if size >= max_bytes or len(batch) >= max_events:
            handed_over.clear()
            ready.set()
            await stream.wait(handed_over)  # type: ignore[arg-type]  # mode's stubs name its own Event; it waits on any
        elif linger is None and (waiting is None or waiting.empty()):
            linger = loop.call_later(linger_s, ready.set)
        return value

    acks_before = stream.enable_acks
    stream.enable_acks = False  # acked below, after the batch
    stream.add_processor(add)
    # Faust's own way for take(): drain in the background (Faust types the channel's iterator loosely).
    stream._enable_passive(aiter(stream.channel))  # type: ignore[arg-type]
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(ready, timeout=idle_s)  # type: ignore[arg-type]  # as stream.wait above
            if not batch:
                continue
            accepting.clear()
            try:
                yield list(batch)
            finally:
                for event in batch:
                    await stream.ack(event)
                batch.clear()
                size = 0
                if linger is not None:
                    linger.cancel()
                    linger = None
                ready.clear()
                accepting.set()
                handed_over.set()
    finally:
        stream.enable_acks = acks_before
        stream._processors.remove(add)
