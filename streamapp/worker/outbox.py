"""The join's outputs, produced from a thread of their own while the loop decides the next ones.

On the worker's loop, sending a joined frame costs about as much as deciding it, and a large part
of that (the produce request's CRC, its socket writes) runs without the GIL but still on the
loop's thread, which decides nothing meanwhile. Here a batch hands its outputs over in chunks as
it decides them, and a producer on another thread sends each chunk while the loop decides the
rest: a backlog drains faster (docs/benchmarks.md, as for the connections below). The batch
still waits for every output's ack before it writes the window and is acked, so offsets commit
after their outputs (R4, R12), and the bytes on their way out stay within the batch's bound.

aiokafka sends one produce request at a time per broker connection, and each carries at most one
batch (1 MiB) of a partition; one camera's outputs all go to one partition, so in a backlog the
outputs waited on that one request. The thread sends its chunks in turn over OUTPUT_CONNECTIONS
producers, which keeps that many requests in flight (three connections were no faster than two).
Outputs of one partition may then leave in another order than decided; nothing downstream needs
their order (frames already leave the join out of order: unmatched ones a TTL later), and every
batch still waits for all its acks.

A chunk's records go to the producer in record batches per partition (streamapp.recordbatches),
not through aiokafka's per-record ``send``; a record larger than a request is refused by
position before anything is sent, as ``send`` would.

Under exactly-once the outputs must join the transaction of their input's partition: they go out
on the loop, in record batches, through that partition's transactional producer
(:class:`TransactionOutbox`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

import faust
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from faust.types import EventT, ProducerT

from streamapp.kafka.producer import check_size, partition_of, producer_options, wait_for_partitions
from streamapp.kafka.transactions import PartitionTransactions
from streamapp.recordbatches import Delivery, Value, send_in_batches
from streamapp.worker.deadletter import DeadLetters

# Outputs handed to the thread at once: small enough that the thread starts sending early in a
# batch, large enough that the hand-over (one call across threads) stays rare.
CHUNK_RECORDS = 64
# Producers (connections) the thread sends its chunks over in turn: requests in flight per broker.
OUTPUT_CONNECTIONS = 2


class OutputThread:
    """aiokafka producers configured as Faust's, running on their own thread and event loop."""

    def __init__(self, producer: ProducerT, name: str) -> None:
        self.faust_producer = producer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.producers: list[AIOKafkaProducer] = []
        self.chunks_sent = 0
        self.sending = asyncio.Lock()  # bound to the thread's loop where it is first used
        self.stopped = False

    def submit(self, topic: str, records: Sequence[tuple[bytes, Value]]) -> asyncio.Future:
        """Send ``records`` (key, value) to ``topic`` from the thread. The future resolves once all
        are acknowledged, to what the producer refused of each, by position (None: sent)."""
        if self.stopped:
            raise RuntimeError("the output thread has stopped: the worker is shutting down")
        if not self.thread.is_alive():
            self.thread.start()
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._send(topic, records), self.loop))

    async def _send(self, topic: str, records: Sequence[tuple[bytes, Value]]) -> list[str | None]:
        async with self.sending:  # chunks are handed to the producers in the order they came
            producers = await self._started()
            producer = producers[self.chunks_sent % len(producers)]
            self.chunks_sent += 1
            refused, deliveries = await _handed_over(producer, topic, records)
        await asyncio.gather(*(delivery.future for delivery in deliveries))
        return refused

    async def _started(self) -> list[AIOKafkaProducer]:
        while len(self.producers) < OUTPUT_CONNECTIONS:
            producer = AIOKafkaProducer(**producer_options(self.faust_producer))  # as Faust makes its own
            await producer.start()  # a failed start is tried again by the next chunk
            self.producers.append(producer)
        return self.producers

    async def stop(self) -> None:
        """Flush and stop the producers, then the thread."""
        self.stopped = True
        if not self.thread.is_alive():
            return
        for producer in self.producers:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(producer.stop(), self.loop))
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join)


class PartitionTransactionSender:
    """An output thread's ``submit`` on the loop, into the open transaction of one input
    partition (of one generation) under exactly-once."""

    def __init__(self, transactions: PartitionTransactions, generation: int | None, partition: int) -> None:
        self.transactions, self.generation, self.partition = transactions, generation, partition

    def submit(self, topic: str, records: Sequence[tuple[bytes, Value]]) -> asyncio.Future:
        return asyncio.ensure_future(self._send(topic, records))

    async def _send(self, topic: str, records: Sequence[tuple[bytes, Value]]) -> list[str | None]:
        producer = self.transactions.producer_in(self.generation, self.partition)
        if producer is None:  # the partition moved: its transaction is aborted, outputs and all
            return [None] * len(records)
        try:
            refused, deliveries = await _handed_over(producer, topic, records)
            await asyncio.gather(*(delivery.future for delivery in deliveries))
        except KafkaError:
            if self.transactions.producer_in(self.generation, self.partition) is producer:
                raise
            return [None] * len(records)  # the producer was stopped as the partition moved
        return refused


async def _handed_over(producer: AIOKafkaProducer, topic: str, records: Sequence[tuple[bytes, Value]]
                       ) -> tuple[list[str | None], list[Delivery]]:
    """Hand ``records`` to ``producer`` in record batches per partition: what it refused of each, by
    position, and the deliveries of the rest."""
    await wait_for_partitions(producer, topic)
    refused, by_partition = _partitioned(producer, topic, records)
    deliveries: list[Delivery] = []
    for partition, pending in by_partition.items():
        deliveries += await send_in_batches(producer, topic, partition, pending)
    return refused, deliveries


def _partitioned(producer: AIOKafkaProducer, topic: str, records: Sequence[tuple[bytes, Value]]
                 ) -> tuple[list[str | None], dict[int, list[tuple[bytes, Value]]]]:
    """Each record's refusal, by position (a record larger than a request, which ``send`` would
    refuse before sending anything; None: it goes), and the records that go, by the partition
    the producer's partitioner picks, in order."""
    refused: list[str | None] = []
    by_partition: dict[int, list[tuple[bytes, Value]]] = {}
    for key, value in records:
        try:
            check_size(producer, key, value)
        except KafkaError as exc:
            refused.append(repr(exc))
            continue
        refused.append(None)
        partition = partition_of(producer, topic, key, value)
        by_partition.setdefault(partition, []).append((key, value))
    return refused, by_partition


class OutputsInFlight:
    """Outputs handed to a producer and not yet acknowledged or refused, and those acknowledged. A
    decision is counted when it is made (``join_joined_total``); its output leaves with its batch,
    up to two batches later: "all decided" is "all delivered" only once nothing is in flight."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.acked = 0

    def track(self, future: asyncio.Future, records: int, size: int) -> None:
        """``future`` resolves once ``records`` outputs of ``size`` bytes are acknowledged or
        refused: to the refusal of each, by position, or to None for a single output."""
        self.records += records
        self.bytes += size
        future.add_done_callback(functools.partial(self._done, records, size))

    def _done(self, records: int, size: int, future: asyncio.Future) -> None:
        self.records -= records
        self.bytes -= size
        if future.cancelled() or future.exception() is not None:
            return
        refusals = future.result()
        self.acked += sum(refused is None for refused in refusals) if isinstance(refusals, list) else records

    def as_metrics(self) -> dict[str, float]:
        return {"outputs_in_flight_records": self.records, "outputs_in_flight_bytes": self.bytes,
                "outputs_acked_total": self.acked}


class Outbox(Protocol):
    """One batch's outputs to one topic, each the output of one input event. An event whose
    output the producer refuses (too large) is dead-lettered instead, as one record (R11)."""

    async def add(self, event: EventT, key: bytes, value: Value) -> None: ...

    def hand_over(self) -> None:
        """Start sending what was added so far."""

    def acked(self) -> asyncio.Future:
        """Done once every output handed over is acknowledged (or refused); never fails, as
        :meth:`delivered` raises what failed."""

    async def delivered(self) -> None:
        """Wait until every output is acknowledged; dead-letter the events of refused ones."""


class Submitter(Protocol):
    def submit(self, topic: str, records: Sequence[tuple[bytes, Value]]) -> asyncio.Future:
        """Send ``records`` (key, value) to ``topic``; the future resolves once all are
        acknowledged, to what the producer refused of each, by position (None: sent)."""


class ThreadOutbox:
    """An Outbox sent in chunks handed over as they fill: from the output thread, or under
    exactly-once into the transaction of one input partition."""

    def __init__(self, topic: faust.TopicT, dead_letters: DeadLetters, stage: str, thread: Submitter,
                 in_flight: OutputsInFlight) -> None:
        self.topic, self.dead_letters, self.stage, self.thread = topic, dead_letters, stage, thread
        self.in_flight = in_flight
        self.chunk: list[tuple[EventT, bytes, Value]] = []
        self.sent: list[tuple[list[EventT], asyncio.Future]] = []

    async def add(self, event: EventT, key: bytes, value: Value) -> None:
        self.chunk.append((event, key, value))
        if len(self.chunk) >= CHUNK_RECORDS:
            self.hand_over()

    def hand_over(self) -> None:
        if self.chunk:
            records = [(key, value) for _, key, value in self.chunk]
            future = self.thread.submit(self.topic.get_topic_name(), records)
            self.in_flight.track(future, len(records), sum(len(value) for _, value in records))
            self.sent.append(([event for event, _, _ in self.chunk], future))
            self.chunk = []

    def acked(self) -> asyncio.Future:
        return _all_done(future for _, future in self.sent)

    async def delivered(self) -> None:
        self.hand_over()
        for events, future in self.sent:
            for event, refused in zip(events, await future, strict=True):
                if refused is not None:
                    reason = f"output to {self.topic.get_topic_name()} refused: {refused}"
                    await self.dead_letters.send(event, stage=self.stage, reason=reason)


class TransactionOutbox:
    """An Outbox under exactly-once: each output in the open transaction of its event's input
    partition, in chunks handed over as they fill, one ThreadOutbox per partition."""

    def __init__(self, topic: faust.TopicT, dead_letters: DeadLetters, stage: str,
                 transactions: PartitionTransactions, in_flight: OutputsInFlight) -> None:
        self.topic, self.dead_letters, self.stage = topic, dead_letters, stage
        self.transactions, self.in_flight = transactions, in_flight
        self.partitions: dict[tuple[int | None, int], ThreadOutbox] = {}

    async def add(self, event: EventT, key: bytes, value: Value) -> None:
        message = event.message
        where = (message.generation_id, message.partition)
        outbox = self.partitions.get(where)
        if outbox is None:
            sender = PartitionTransactionSender(self.transactions, *where)
            outbox = self.partitions[where] = ThreadOutbox(self.topic, self.dead_letters, self.stage, sender,
                                                           self.in_flight)
        await outbox.add(event, key, value)

    def hand_over(self) -> None:
        for outbox in self.partitions.values():
            outbox.hand_over()

    def acked(self) -> asyncio.Future:
        return _all_done(outbox.acked() for outbox in self.partitions.values())

    async def delivered(self) -> None:
        for outbox in self.partitions.values():
            await outbox.delivered()


def _all_done(futures: Iterable[asyncio.Future]) -> asyncio.Future:
    """Done when all are. It holds their exceptions rather than raising them: a waiter that
    stops waiting for it (input came first) leaves no "exception was never retrieved" behind."""
    return asyncio.gather(*futures, return_exceptions=True)
