"""What a stage's ``register`` gets: the app, its topics and what the stages share.

Importing this module builds nothing: the app factory (streamapp.worker.factory) makes the one
:class:`Stage` of a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import faust
from faust.types import EventT

from streamapp.kafka.transactions import PartitionTransactions, Transactions
from streamapp.memoryplan import MemoryPlan
from streamapp.previewframes import LatestFrames
from streamapp.settings import Settings
from streamapp.tables.memory import RocksMemory, shared_rocks_memory
from streamapp.worker import preview
from streamapp.worker.deadletter import DeadLetters
from streamapp.worker.health import Readiness
from streamapp.worker.metrics import Metrics
from streamapp.worker.outbox import Outbox, OutputsInFlight, OutputThread, ThreadOutbox, TransactionOutbox

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class AppTopics:
    frames: faust.TopicT
    scaled: faust.TopicT
    detections: faust.TopicT
    joined: faust.TopicT
    deadletter: faust.TopicT


@dataclasses.dataclass(frozen=True)
class Stage:
    """What a stage's ``register`` gets: the app and everything shared between stages."""

    app: faust.App
    settings: Settings
    topics: AppTopics
    metrics: Metrics
    dead_letters: DeadLetters
    memory: MemoryPlan
    # The join's; None without a join, and under exactly-once, where outputs join the input
    # partition's transaction (streamapp.worker.outbox).
    output_thread: OutputThread | None
    # Under exactly-once; None at least once (streamapp.kafka.transactions).
    transactions: Transactions | None = None
    # One thread for pixel work: decoded images exist one at a time (R7) and the event loop
    # stays free to heartbeat while a frame is decoded, detected or drawn.
    pixels: ThreadPoolExecutor = dataclasses.field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="pixels"))
    outputs_in_flight: OutputsInFlight = dataclasses.field(default_factory=OutputsInFlight)
    # What /readyz checks: a stage adds what can stop it taking records (e.g. a full disk).
    readiness: Readiness = dataclasses.field(default_factory=Readiness)

    @functools.cached_property
    def rocks_memory(self) -> RocksMemory:
        """The process's RocksDB pool, made by the first stage that opens a table (the join)."""
        return shared_rocks_memory(self.memory.rocksdb_bytes)

    @property
    def buffer_records(self) -> int:
        """Changelog records a table's recovery reads before applying them."""
        return self.memory.recovery_records

    @property
    def batch_bytes(self) -> int:
        return self.memory.batch_bytes

    async def offload(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pixels, function, *args)

    def batch_commit(self, stage: str, *topics: faust.TopicT
                     ) -> Callable[[Sequence[EventT]], contextlib.AbstractAsyncContextManager[None]]:
        """What ``stage`` handles a batch of events of ``topics`` in: under exactly-once their
        outputs go into the open transaction of each input partition, which commits the events'
        offsets with them once the commit interval has passed; at least once it does nothing
        (Faust commits the offsets of acked events after flushing its producer)."""
        transactions = self.partition_transactions(stage, *topics)
        return _nothing_to_commit if transactions is None else transactions.batch

    def partition_transactions(self, stage: str, *topics: faust.TopicT, changelog: str | None = None,
                               lock: asyncio.Lock | None = None) -> PartitionTransactions | None:
        """Under exactly-once, the transactions of ``stage``'s input partitions of ``topics``
        (and of its ``changelog``'s partitions, one for one), sent into and committed holding
        ``lock``; None at least once."""
        if self.transactions is None:
            return None
        return self.transactions.add(stage, [topic.get_topic_name() for topic in topics], changelog, lock=lock)

    def outbox(self, topic: faust.TopicT, *, stage: str) -> Outbox:
        """Where one batch's outputs to ``topic`` go, each the output of one event of ``stage``."""
        transactions = None if self.transactions is None else self.transactions.of_stage(stage)
        if transactions is not None:
            return TransactionOutbox(topic, self.dead_letters, stage, transactions, self.outputs_in_flight)
        if self.output_thread is None:
            raise ValueError(f"{stage} batches its outputs, but the worker has no output thread")
        return ThreadOutbox(topic, self.dead_letters, stage, self.output_thread, self.outputs_in_flight)

    async def stop_outputs(self) -> None:
        if self.output_thread is not None:
            await self.output_thread.stop()

    def serve_preview(self, frames: LatestFrames) -> None:
        """Serve the preview pages of ``frames`` from this worker's web port."""
        preview.register(self, frames)


def _nothing_to_commit(events: Sequence[EventT]) -> contextlib.AbstractAsyncContextManager[None]:
    """At least once, Faust commits."""
    return contextlib.nullcontext()
