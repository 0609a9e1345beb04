"""Faust's Kafka producer, with a flush that waits for what was sent before it, not for silence.

Before committing offsets Faust flushes its producer, so that the changelog records and outputs
of the events being committed are on the broker first. Its send buffer's flush waits until the
buffer is empty, one record at a time, and gives up as soon as one record takes longer than
0.1 s. Under load both go wrong: while a stage keeps sending through it the buffer is never
empty, so a commit can wait indefinitely (one took 389 s in a drain, most likely this); and one
slow send ends the flush early, so offsets can commit before their events' outputs are
acknowledged. (The join's changelog records bypass this buffer, streamapp.tables.changelog, and
are covered by the Kafka producer's flush.)

Here a flush waits for exactly the records handed to the send buffer before it was called, then
for everything already in the Kafka producer, as Faust's does next.

The send buffer's size is also the bytes waiting in it: Faust counts its records, and compared
that count with the byte limit the app sets, so the limit never held.

The partitioner is Kafka's default, remembering the hashes of recent keys.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner, murmur2
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.types import ProducerT

from streamapp.memoryplan import KEY_HASH_MEMO_BYTES
from streamapp.recordbatches import Value
from streamapp.units import event_bytes

# A remembered key costs its bytes plus about this much in the dict (entry, bytes and int objects).
_MEMO_ENTRY_BYTES = 120


class KeyPartitioner:
    """Kafka's default partitioner (murmur2 of the key, modulo the partitions; random without a
    key), remembering the hash of each recent key, up to ``max_bytes`` of keys; past it, it
    forgets them all at once. aiokafka's murmur2 is pure Python, a cost in a
    backlog drain (docs/benchmarks.md, "Partition hashing"), and the stages' keys repeat: a bucket
    key stands for a whole bucket of frames."""

    def __init__(self, max_bytes: int = KEY_HASH_MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self._hashes: dict[bytes, int] = {}
        self._bytes = 0
        self.resets = 0

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return DefaultPartitioner()(key, all_partitions, available)
        hashed = self._hashes.get(key)
        if hashed is None:
            hashed = self._remember(key, murmur2(key) & 0x7FFFFFFF)
        return all_partitions[hashed % len(all_partitions)]

    def _remember(self, key: bytes, hashed: int) -> int:
        cost = len(key) + _MEMO_ENTRY_BYTES
        if self._bytes + cost > self.max_bytes:
            self._hashes.clear()
            self._bytes = 0
            self.resets += 1
        self._hashes[key] = hashed
        self._bytes += cost
        return hashed

    def as_metrics(self) -> dict[str, int]:
        return {"producer_key_hash_memo_bytes": self._bytes, "producer_key_hash_memo_resets_total": self.resets}


class SendBufferBytes(asyncio.Queue):
    """Faust's producer send buffer, sized in bytes. Before each record Faust waits for this buffer
    to drain while its size (read in bytes by streamapp.kafka.producer.ByteSendBuffer) is over
    ``ProducerBuffer.max_messages``: set to a byte limit, that bounds the bytes of records waiting
    to be sent through Faust's topics (dead letters, the sweep's unmatched frames; the join's
    batch outputs and changelog records bypass it).

    It also remembers the record Faust's sender took last, so that :meth:`unsent` can name every
    record handed to the buffer and not yet acknowledged (streamapp.kafka.producer)."""

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


class ByteSendBuffer(ProducerBuffer):
    """Faust's send buffer over a SendBufferBytes queue, its size in bytes. Faust waits before
    each record it hands to a stream while the size is over its limit (:meth:`limit_bytes`)."""

    pending: SendBufferBytes

    def __post_init__(self) -> None:
        super().__post_init__()
        self.pending = SendBufferBytes()

    def limit_bytes(self, limit: int) -> None:
        """Bound the bytes waiting here (the memory plan's send buffer). Faust compares its
        ``max_messages`` with :attr:`size`, and the size is bytes here, so the limit is too."""
        self.max_messages = limit

    @property
    def size(self) -> int:
        return self.pending.qsize()


class StreamappProducer(faust_aiokafka.Producer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        buffer = ByteSendBuffer(loop=self.loop, beacon=self.beacon)
        buffer.app = self.app
        self.buffer = buffer

    async def flush(self) -> None:
        unsent = cast(ByteSendBuffer, self.buffer).pending.unsent()
        if unsent:
            await asyncio.wait(unsent)
        if self._producer is not None:
            await self._producer.flush()
        for transaction_producer in self._transaction_producers.values():
            await transaction_producer.flush()


def producer_options(faust_producer: ProducerT) -> dict[str, Any]:
    """The options Faust makes its aiokafka producer with (later settings override earlier ones)."""
    producer = cast(faust_aiokafka.Producer, faust_producer)
    return {**producer._settings_default(), **producer._settings_auth(), **producer._settings_extra()}


def kafka_producer_of(faust_producer: ProducerT) -> AIOKafkaProducer:
    """The aiokafka producer under Faust's, started with it."""
    return cast(Any, faust_producer)._ensure_producer()


async def wait_for_partitions(producer: AIOKafkaProducer, topic: str) -> None:
    """Wait, as ``send`` does, until the producer knows ``topic``'s partitions."""
    await producer.client._wait_on_metadata(topic)


def check_size(producer: AIOKafkaProducer, key: bytes, value: Value) -> None:
    """Raise the KafkaError ``send`` would for a record larger than a request."""
    producer._serialize(key, value if isinstance(value, bytes) else _stand_in(len(value)), [])


_zeros = memoryview(b"")


def _stand_in(size: int) -> memoryview:
    """Bytes of ``size`` for aiokafka's size check, which takes only bytes-like values and reads
    only their length: a view of one zero buffer, kept as large as the largest value checked
    (a large one's pages are never touched)."""
    global _zeros
    if len(_zeros) < size:
        _zeros = memoryview(bytes(size))
    return _zeros[:size]


def partition_of(producer: AIOKafkaProducer, topic: str, key: bytes, value: Value) -> int:
    """The partition the producer's partitioner picks for a record of ``topic``."""
    return producer._partition(topic, None, key, value, key, value)
