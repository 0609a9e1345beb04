"""Exactly-once: each batch's outputs and its input offsets commit in one Kafka transaction per
input partition, or not at all (R22).

Faust's transaction manager is replaced (:class:`PartitionTransactionManager`): it named its
producers by the assignor's topic groups, sent agent outputs beside its transactions, and
committed on a timer rather than per batch (docs/exactly-once.md). The rest of Faust's
exactly-once stays: consumers read ``read_committed``, and the table recovery steps over the
transaction markers at a changelog's end. Here a stage that writes to Kafka has one
transactional producer per input partition, its transactional id ``<group>-<stage>-<partition>``:
the same id follows the partition from worker to worker (and across a restart), so the new
owner's ``init_transactions`` aborts the old owner's open transaction and fences it at once. A
restarted worker is back in a second, not after the transaction timeout, and a zombie that lost
the partition cannot commit after it moved (aiokafka's transactions carry no consumer-group
metadata, so the partition's id is what fences, as in Kafka's first exactly-once design).

Every generation (each assignment) starts new producers for every assigned input partition,
before the join's changelog is recovered and the committed offsets are read
(:meth:`Transactions.restart`). A new producer's initialisation waits until the previous
transaction of its id, ours or a dead worker's, is complete, so what is read next is final:
nothing in flight can still change it. A batch's events sent to producers of an older
generation are aborted with them, and its commit is skipped: the events are read again from the
committed offsets.

A stage with a changelog (the join) writes its changelog only in these transactions. Its table's
recovery reads a changelog partition up to the record before the end (the end is a commit
marker, which no reader sees, streamapp.kafka.consumer); a new producer begins by committing a
deletion of FENCE_KEY, a key no entry has, so that the end is a commit marker even when the last
transaction before it was aborted (a killed worker's, aborted by this producer's
initialisation): else the recovery would wait for a record it never reads, 10 s before Faust
gives up on it.

A partition's transaction spans the batches of one commit interval
(``STREAMAPP_TRANSACTION_INTERVAL``, as Kafka Streams' ``commit.interval.ms``): a batch adds its
offsets to the open transactions of its partitions (:meth:`PartitionTransactions.batch`), and
they commit, with the highest offsets of each, once the interval has passed since the first of
them opened: after the batch that finds it due, or from a timer when no batch comes. The round
trips of a commit (``AddOffsetsToTxn``, ``TxnOffsetCommit``, ``EndTxn`` per partition) are paid
once per interval, not per batch; 0 commits every batch. Each partition commits its own
transaction, so a partition's outputs and offsets are atomic, and a failed commit stops the
worker (its partitions are read again from their committed offsets by whoever owns them next).
A rebalance or a stop aborts the open transactions: what they held is read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from faust.exceptions import ProducerSendError
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, AppT, EventT

log = logging.getLogger(__name__)

# The key of the deletion a new producer commits to its changelog partition; never an entry's.
FENCE_KEY = b"\x00fence"


class Sender(Protocol):
    """Faust's producer's ``send``, as the stages call it."""

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
                   timestamp: float | None, headers: Any) -> Awaitable: ...


class TransactionSender:
    """A transactional aiokafka producer behind Faust's ``send``: an output of the open transaction."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
                   timestamp: float | None, headers: Any) -> Awaitable:
        timestamp_ms = None if timestamp is None else int(timestamp * 1000)
        try:
            return await self.producer.send(topic, value, key=key, partition=partition,
                                            timestamp_ms=timestamp_ms, headers=headers)
        except KafkaError as exc:  # as Faust's producer raises a record it refuses (too large)
            raise ProducerSendError(f"Error while sending: {exc!r}") from exc


class StaleSender:
    """For an event of an older generation: its transaction is aborted, so its outputs go nowhere."""

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
                   timestamp: float | None, headers: Any) -> Awaitable:
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


STALE = StaleSender()


class PartitionTransactions:
    """One stage's transactional producers, one per input partition of the current generation."""

    def __init__(self, app: AppT, stage: str, topics: Sequence[str], changelog: str | None = None, *,
                 interval_s: float = 0.0, lock: asyncio.Lock | None = None) -> None:
        self.app, self.stage, self.topics, self.changelog = app, stage, frozenset(topics), changelog
        self.group_id = app.conf.id
        self.producers: dict[int, AIOKafkaProducer] = {}
        self.senders: dict[int, TransactionSender] = {}
        self.generation: int | None = None
        self.committing: set[asyncio.Future] = set()  # commits in flight, which a restart waits for
        self.commits = 0
        self.interval_s = interval_s
        # Held by whoever sends into the open transactions (a batch, a sweep) or commits them.
        self.lock = lock or asyncio.Lock()
        # The partitions whose transactions are open (something was sent or is to commit), with
        # the input offsets they commit; since when the first of them is open (monotonic).
        self.open: dict[int, dict[TopicPartition, int]] = {}
        self.opened_at: float | None = None
        # Commits every open transaction; a stage with state to write after the commit replaces it.
        self.commit_open: Callable[[], Awaitable[None]] = self.commit_all
        # Forgets what the open transactions held, once they are aborted (a rebalance, a stop).
        self.on_abort: Callable[[], None] = lambda: None
        self.timer: asyncio.Future | None = None

    def transactional_id(self, partition: int) -> str:
        return f"{self.group_id}-{self.stage}-{partition}"

    def sender(self, event: EventT) -> Sender:
        """Where the outputs of ``event`` go: its partition's open transaction."""
        message = event.message
        return self.sender_in(message.generation_id, message.partition)

    def producer_in(self, generation: int | None, partition: int) -> AIOKafkaProducer | None:
        """The transactional producer of ``partition``, if ``generation`` is still the current one."""
        return self.producers.get(partition) if generation == self.generation else None

    def sender_in(self, generation: int | None, partition: int) -> Sender:
        """The open transaction of ``partition``, if ``generation`` is still the current one."""
        sender = self.senders.get(partition)
        if sender is None or generation != self.generation:
            return STALE
        return sender

    async def restart(self, assigned: Iterable[TP], generation: int) -> None:
        """New producers for the partitions of ``assigned`` read by this stage, each initialised
        (which fences its id's previous owner and completes its last transaction) and in a begun
        transaction; the old ones stopped, their open transactions aborted."""
        partitions = sorted({tp.partition for tp in assigned if tp.topic in self.topics})
        await self.stop()
        # No input of the new generation is handed to the stage before this returns (the
        # partitions are paused until the tables have recovered and the offsets are read).
        self.generation = generation
        started = await asyncio.gather(*(self._started(partition) for partition in partitions))
        self.producers = dict(zip(partitions, started, strict=True))
        self.senders = {partition: TransactionSender(producer) for partition, producer in self.producers.items()}
        if partitions:
            log.info("%s: transactional producers ready for partitions %s (generation %s)",
                     self.stage, partitions, generation)

    async def _started(self, partition: int) -> AIOKafkaProducer:
        faust_producer = cast(faust_aiokafka.Producer, self.app.producer)
        # As Faust makes its own producers: later settings override earlier ones.
        producer = AIOKafkaProducer(**{**faust_producer._settings_default(), **faust_producer._settings_auth(),
                                       "transactional_id": self.transactional_id(partition)})
        await producer.start()
        await producer.begin_transaction()  # waits for init_transactions: the id is ours from here
        if self.changelog is not None:  # its end a commit marker, for the recovery that follows
            await producer.send(self.changelog, None, key=FENCE_KEY, partition=partition)
            await producer.commit_transaction()
            await producer.begin_transaction()
        return producer

    @contextlib.asynccontextmanager
    async def batch(self, events: Sequence[EventT]) -> AsyncIterator[None]:
        """Hold the open transactions while a batch of ``events`` sends its outputs into them;
        then add the events' offsets, and commit if the interval has passed."""
        async with self.lock:
            yield
            self.add_events(events)
            await self.commit_if_due()

    def add_events(self, events: Iterable[EventT]) -> None:
        """Add the offsets past ``events`` to the open transactions of their partitions; events
        of an older generation add nothing (their transactions are aborted)."""
        for event in events:
            message = event.message
            tp = TopicPartition(message.topic, message.partition)
            self.add(message.generation_id, message.partition, {tp: message.offset + 1})

    def add(self, generation: int | None, partition: int, offsets: Mapping[TopicPartition, int] | None) -> bool:
        """``partition``'s transaction holds something to commit, and commits ``offsets`` (if any)
        too; False if ``generation`` is no longer the current one."""
        if generation != self.generation or partition not in self.producers:
            return False
        ends = self.open.setdefault(partition, {})
        for tp, offset in (offsets or {}).items():
            ends[tp] = max(ends.get(tp, 0), offset)
        if self.opened_at is None:
            self.opened_at = time.monotonic()
            if self.timer is None or self.timer.done():
                self.timer = asyncio.ensure_future(self._commit_when_due(self.generation))
        return True

    def due(self) -> bool:
        return self.opened_at is not None and time.monotonic() - self.opened_at >= self.interval_s

    async def commit_if_due(self) -> None:
        """Commit the open transactions if the interval has passed since the first opened. Call
        it holding :attr:`lock`."""
        if self.due():
            await self.commit_open()

    async def _commit_when_due(self, generation: int | None) -> None:
        """Commit once the interval has passed, when no batch came to do it."""
        while self.opened_at is not None and self.generation == generation:
            await asyncio.sleep(max(0.0, self.opened_at + self.interval_s - time.monotonic()))
            async with self.lock:
                if self.generation != generation:
                    return
                try:
                    await self.commit_if_due()
                except KafkaError:
                    return  # logged, and the worker stopped, by commit_partition

    def take_open(self) -> dict[int, dict[TopicPartition, int]]:
        """The open transactions and their offsets, which the caller commits now."""
        taken, self.open, self.opened_at = self.open, {}, None
        return taken

    async def commit_all(self) -> None:
        """Commit each open transaction with its offsets, all at once, and begin the next."""
        generation = self.generation
        await asyncio.gather(*(self.commit_partition(generation, partition, offsets)
                               for partition, offsets in self.take_open().items()))

    async def commit_partition(self, generation: int | None, partition: int,
                               offsets: dict[TopicPartition, int] | None = None) -> bool:
        """Commit the open transaction of ``partition``, with ``offsets`` if any, and begin the
        next; False, and nothing committed, if ``generation`` is no longer the current one (what
        was sent in it is aborted with its producer)."""
        producer = self.producers.get(partition)
        if producer is None or generation != self.generation:
            return False
        commit = asyncio.ensure_future(self._commit(producer, offsets))
        self.committing.add(commit)
        commit.add_done_callback(self.committing.discard)
        try:
            await commit
        except KafkaError as exc:
            # Fenced (the partition moved) or timed out: this producer can commit nothing more,
            # and the stream has read past the batch. Stop the worker; the partition is read again
            # from its committed offset by whoever owns it next.
            log.error("%s: the transaction of partition %d failed: %r", self.stage, partition, exc)
            await self.app.crash(exc)
            raise
        self.commits += 1
        return True

    async def _commit(self, producer: AIOKafkaProducer, offsets: dict[TopicPartition, int] | None) -> None:
        if offsets:
            await producer.send_offsets_to_transaction(offsets, self.group_id)
        await producer.commit_transaction()
        await producer.begin_transaction()

    async def stop(self) -> None:
        """Stop the producers, once the commits in flight are done; none starts from here on.
        Their open transactions are aborted, and what they held forgotten."""
        producers, self.producers, self.senders = list(self.producers.values()), {}, {}
        self.generation = None
        self.take_open()
        self.on_abort()
        if self.timer is not None:
            self.timer.cancel()
        await asyncio.gather(*self.committing, return_exceptions=True)
        await asyncio.gather(*(_stop(producer) for producer in producers))


async def _stop(producer: AIOKafkaProducer) -> None:
    """Stop ``producer``; its open transaction is aborted by the next owner of its id."""
    try:
        await producer.stop()
    except KafkaError as exc:
        log.warning("stopping a transactional producer: %r", exc)


class Transactions:
    """The exactly-once stages of one worker, and the input topics whose offsets they commit (the
    consumer commits none of those itself). No two stages of a worker read the same topic under
    exactly-once (streamapp.settings refuses resize beside join)."""

    def __init__(self, app: AppT, interval_s: float) -> None:
        self.app, self.interval_s = app, interval_s
        self.stages: list[PartitionTransactions] = []

    def add(self, stage: str, topics: Sequence[str], changelog: str | None = None, *,
            lock: asyncio.Lock | None = None) -> PartitionTransactions:
        transactions = PartitionTransactions(self.app, stage, topics, changelog, interval_s=self.interval_s,
                                             lock=lock)
        self.stages.append(transactions)
        return transactions

    def of_stage(self, name: str) -> PartitionTransactions | None:
        return next((stage for stage in self.stages if stage.stage == name), None)

    def sender(self, event: EventT) -> Sender:
        """Where the outputs of ``event`` go: the open transaction of its partition, when its
        stage commits in transactions, else Faust's producer."""
        topic = event.message.topic
        for stage in self.stages:
            if topic in stage.topics:
                return stage.sender(event)
        return cast(Sender, self.app.producer)

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(topic for stage in self.stages for topic in stage.topics)

    async def restart(self, assigned: Iterable[TP], generation: int) -> None:
        assigned = set(assigned)
        await asyncio.gather(*(stage.restart(assigned, generation) for stage in self.stages))

    async def stop(self) -> None:
        await asyncio.gather(*(stage.stop() for stage in self.stages))

    def as_metrics(self) -> dict[str, float]:
        return {"transactions_committed_total": sum(stage.commits for stage in self.stages)}


class PartitionTransactionManager(TransactionManager):
    """Faust's transaction manager under exactly-once, handing over to the worker's
    :class:`Transactions`: their producers start at each assignment before the tables recover,
    and the consumer's own commits leave their inputs alone."""

    def _stages(self) -> Transactions:
        return cast(Any, self.app).transactions

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP]) -> None:
        await self._stages().restart(assigned, self.app.consumer_generation_id)

    async def commit(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        """Commit, as at least once, the offsets of inputs no stage commits in its transactions
        (the sink's); the others committed with their batches."""
        topics = self._stages().topics
        others = {tp: offset for tp, offset in offsets.items() if tp.topic not in topics}
        if not others:
            return True
        await self.app.producer.flush()
        return await cast(Any, self.consumer)._commit(others)

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
                   timestamp: float | None, headers: Any, *, transactional_id: str | None = None) -> Awaitable:
        """Faust's own sends (none of the stages'): its producer, outside any transaction."""
        return await self.app.producer.send(topic, key, value, partition, timestamp, headers)
