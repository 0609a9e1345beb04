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
marker, which no reader sees, streamapp.worker.consumer); a new producer begins by committing a
deletion of FENCE_KEY, a key no entry has, so that the end is a commit marker even when the last
transaction before it was aborted (a killed worker's, aborted by this producer's
initialisation): else the recovery would wait for a record it never reads, 10 s before Faust
gives up on it.

A batch may hold several partitions' events; each partition commits its own transaction, so a
partition's outputs and offsets are atomic, and a failed commit stops the worker (its
partitions are read again from their committed offsets by whoever owns them next).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable, Mapping, Sequence
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

    def __init__(self, app: AppT, stage: str, topics: Sequence[str], changelog: str | None = None) -> None:
        self.app, self.stage, self.topics, self.changelog = app, stage, frozenset(topics), changelog
        self.group_id = app.conf.id
        self.producers: dict[int, AIOKafkaProducer] = {}
        self.senders: dict[int, TransactionSender] = {}
        self.generation: int | None = None
        self.committing: set[asyncio.Future] = set()  # commits in flight, which a restart waits for
        self.commits = 0

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

    async def commit(self, events: Iterable[EventT]) -> None:
        """Commit the open transaction of each partition of ``events`` with its offsets past the
        last of them, and begin the next. Events of an older generation commit nothing."""
        ends: dict[int, dict[TopicPartition, int]] = {}
        for event in events:
            message = event.message
            if message.generation_id == self.generation:
                offsets = ends.setdefault(message.partition, {})
                tp = TopicPartition(message.topic, message.partition)
                offsets[tp] = max(offsets.get(tp, 0), message.offset + 1)
        await asyncio.gather(*(self.commit_partition(self.generation, partition, offsets)
                               for partition, offsets in ends.items()))

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
        """Stop the producers, once the commits in flight are done; none starts from here on."""
        producers, self.producers, self.senders = list(self.producers.values()), {}, {}
        self.generation = None
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

    def __init__(self, app: AppT) -> None:
        self.app = app
        self.stages: list[PartitionTransactions] = []

    def add(self, stage: str, topics: Sequence[str], changelog: str | None = None) -> PartitionTransactions:
        transactions = PartitionTransactions(self.app, stage, topics, changelog)
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
