"""The memory budget of one worker (R5): one byte setting, split into a byte limit per buffer.

Faust sizes its buffers in message counts, and a count means nothing when one message is 30 KB
and the next is 3 MB. Here every buffer a record passes through gets a share of
``STREAMAPP_MEMORY_BUDGET`` in bytes:

* RocksDB: one block cache that memtables are charged to (tables/memory.py);
* stream buffers: the queues between Kafka's fetcher and each agent, bounded by the bytes they
  hold (streamapp.kafka.buffers), so Faust pauses a partition on bytes, not on counts;
* consumer fetch: bytes asked per partition per fetch (Kafka still returns one whole record
  that is larger, so frames up to the frame limit always arrive);
* producer: bytes per batch, and bytes waiting in Faust's send buffer (streamapp.kafka.producer);
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

import dataclasses
from collections import Counter

from streamapp.jpeg import DECODE_BYTES_PER_PIXEL
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes

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


class OverloadCounts(Counter):
    """What full stream buffers did: partitions paused (backpressure), records dropped (drop-oldest)."""

    def as_metrics(self) -> dict[str, int]:
        return {"budget_stream_buffer_pauses_total": self["pauses"],
                "budget_dropped_records_total": self["records"],
                "budget_dropped_bytes_total": self["bytes"]}
