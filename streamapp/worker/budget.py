"""The memory budget of one worker (R5): one byte setting, split into a byte limit per buffer.

Faust sizes its buffers in message counts, and a count means nothing when one message is 30 KB
and the next is 3 MB. Here every buffer a record passes through gets a share of
``STREAMAPP_MEMORY_BUDGET`` in bytes:

* RocksDB: one block cache that memtables are charged to (tables/memory.py);
* stream buffers: the queues between Kafka's fetcher and each agent, bounded by the bytes they
  hold (:class:`ByteBoundedQueue`), so Faust pauses a partition on bytes, not on counts;
* consumer fetch: bytes asked per partition per fetch (Kafka still returns one whole record
  that is larger, so frames up to the frame limit always arrive);
* producer: bytes per batch, and bytes waiting in Faust's send buffer (:class:`SendBufferBytes`);
* the batches the join holds: the one it is deciding and the one whose outputs are on their way,
  plus up to one batch's bytes of records held back for their partners (agents/join.py,
  streamapp.batches);
* the decoded frame a pixel stage holds (resize, sink: one frame; infer: frames together no
  larger than one): a sixteenth, or less with ``STREAMAPP_MAX_FRAME_PIXELS``; a JPEG whose header
  says it would take more is refused before it is decoded (streamapp.jpeg);
* the rest is headroom for the interpreter.

When a stream buffer is full the worker stops fetching (backpressure), or, with
``STREAMAPP_OVERLOAD=drop-oldest`` for live video, drops the oldest buffered records, counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

from mode.utils.queues import ThrowableQueue

from streamapp.jpeg import DECODE_BYTES_PER_PIXEL
from streamapp.settings import BACKPRESSURE, DROP_OLDEST, Settings
from streamapp.topics import max_record_bytes
from streamapp.units import event_bytes

# Topic-partitions one stage can fetch from at once: its inputs plus the join's changelog.
_FETCHED_TOPICS = 3
_MIN_FETCH_BYTES = 64 * 1024
_MIN_BATCH_BYTES = 16 * 1024
_MAX_BATCH_BYTES = 1024**2


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Byte limits of every buffer of one worker, all derived from its budget."""

    budget_bytes: int
    rocksdb_bytes: int
    stream_buffer_bytes: int      # per agent input; all of them together stay in their share
    fetch_bytes_per_partition: int
    producer_batch_bytes: int
    send_buffer_bytes: int
    batch_bytes: int              # records in one join batch; two are held at once, and held-back records
    decoded_frame_bytes: int      # the one decoded frame of a pixel stage's slot

    @classmethod
    def for_settings(cls, settings: Settings) -> MemoryPlan:
        budget = settings.memory_budget_bytes
        record = max_record_bytes(settings)
        fetched = settings.partitions * _FETCHED_TOPICS
        produced = settings.partitions * 2 + 1  # output topic, changelog, dead letters
        # Kafka returns one whole record past the fetch limit, so one record is set aside.
        fetch_share = budget // 8 - record
        producer_share = budget // 16
        return cls(
            budget_bytes=budget,
            rocksdb_bytes=budget // 4,
            stream_buffer_bytes=max(record, budget // 4 // len(settings.stages)),
            fetch_bytes_per_partition=min(record, max(_MIN_FETCH_BYTES, fetch_share // fetched)),
            # aiokafka keeps a batch being filled and one in flight per partition. A batch larger
            # than a topic's max.message.bytes is refused by the broker whole, after the send.
            producer_batch_bytes=min(record, _MAX_BATCH_BYTES,
                                     max(_MIN_BATCH_BYTES, producer_share // (2 * produced))),
            send_buffer_bytes=max(record, producer_share),
            batch_bytes=max(record, budget // 16),
            decoded_frame_bytes=DECODE_BYTES_PER_PIXEL * settings.frame_pixel_limit,
        )

    def as_metrics(self) -> dict[str, float]:
        return {f"budget_{name}": value for name, value in dataclasses.asdict(self).items()}


def _generation_of(item: Any) -> Any:
    return getattr(getattr(item, "message", None), "generation_id", None)


class SendBufferBytes(asyncio.Queue):
    """Faust's producer send buffer, sized in bytes. Before each record Faust waits for this buffer
    to drain while its size (read in bytes by streamapp.worker.producer.ByteSendBuffer) is over
    ``ProducerBuffer.max_messages``: set to a byte limit, that bounds the bytes of records waiting
    to be sent through Faust's topics (dead letters, the sweep's unmatched frames; the join's
    batch outputs and changelog records bypass it).

    It also remembers the record Faust's sender took last, so that :meth:`unsent` can name every
    record handed to the buffer and not yet acknowledged (streamapp.worker.producer)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.taken: asyncio.Future | None = None

    def qsize(self) -> int:
        return self.bytes

    def unsent(self) -> list[asyncio.Future]:
        """Records put here and not yet acknowledged by the broker, oldest first. Each is a
        ``FutureMessage``, resolved on the broker's ack. The one taken last may still be on its
        way into the Kafka producer, which takes records one at a time, in order."""
        waiting = [self.taken, *self._queue]  # type: ignore[attr-defined]  # asyncio.Queue's deque
        return [future for future in waiting if future is not None and not future.done()]

    def _put(self, item: Any) -> None:
        super()._put(item)
        self.bytes += event_bytes(item)

    def _get(self) -> Any:
        item = super()._get()
        self.bytes -= event_bytes(item)
        self.taken = item
        return item


class OverloadCounts(Counter):
    """What full stream buffers did: partitions paused (backpressure), records dropped (drop-oldest)."""

    def as_metrics(self) -> dict[str, int]:
        return {"budget_stream_buffer_pauses_total": self["pauses"],
                "budget_dropped_records_total": self["records"],
                "budget_dropped_bytes_total": self["bytes"]}


class ByteBoundedQueue(ThrowableQueue):
    """A Faust stream buffer whose size is the bytes it holds, not its number of records.

    ``qsize()`` answers in bytes and ``maxsize`` is the byte limit, so Faust's own machinery acts
    on bytes unchanged: the conductor pauses a partition at 80 % of the limit and resumes it at
    40 %, and waits (stops draining the fetcher) while the queue is full. With drop-oldest, a
    record that would overfill the queue first pushes out the oldest ones, acked so their
    offsets still commit.

    ``current_generation`` is the consumer group generation now: a flow-control clear at the end
    of a rebalance keeps what was fetched in it (see :meth:`clear`).
    """

    def __init__(self, limit_bytes: int, *, policy: str, dropped: OverloadCounts,
                 current_generation: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(maxsize=limit_bytes, **kwargs)
        self.bytes = 0
        self.policy = policy
        self.dropped = dropped
        self.current_generation = current_generation

    def qsize(self) -> int:
        return self.bytes

    # Live video never waits for the agent: the oldest records make room instead.
    def full(self) -> bool:
        return self.policy == BACKPRESSURE and super().full()

    def in_pressure_high_state(self, callback) -> bool:
        if self.policy != BACKPRESSURE or not super().in_pressure_high_state(callback):
            return False
        self.dropped["pauses"] += 1
        return True

    def _put(self, item: Any) -> None:
        size = event_bytes(item)
        if self.policy == DROP_OLDEST:
            while self._queue and self.bytes + size > self.maxsize:  # type: ignore[attr-defined]
                self._drop_oldest()
        super()._put(item)
        self.bytes += size

    def _get(self) -> Any:
        item = super()._get()
        self.bytes -= event_bytes(item)
        return item

    def clear(self) -> None:
        """Faust clears stream buffers when a rebalance suspends flow, and again when it resumes
        flow after recovery. By the second clear the consumer has resumed the new assignment and
        may have fetched records into this buffer, with its position already past them: dropped,
        they are never fetched again (and on a partition without a committed offset, offsets
        commit past them). So a clear while flow is active drops only records fetched in an
        earlier generation, which the stream would skip anyway."""
        if self._flow_control.is_active():
            generation = self.current_generation()
            kept = [item for item in self._queue if _generation_of(item) == generation]  # type: ignore[attr-defined]
        else:
            kept = []
        super().clear()
        self._queue.extend(kept)  # type: ignore[attr-defined]
        self.bytes = sum(event_bytes(item) for item in kept)

    def _drop_oldest(self) -> None:
        oldest = self._get()
        self._unfinished_tasks -= 1  # type: ignore[attr-defined]
        self.dropped["records"] += 1
        self.dropped["bytes"] += event_bytes(oldest)
        ack = getattr(oldest, "ack", None)
        if ack is not None:
            ack()
