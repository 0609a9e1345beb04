"""Faust's Kafka consumer, mended where a rebalance loses records it has fetched, and where handing
each record to the streams cost more than the join's own work on it.

Mid-rebalance Faust drops the records its consumer has fetched but not yet handed to a stream
(flow is suspended, or the generation changed), while the consumer's position is already past
them. It relies on the seek after the rebalance to rewind: every partition goes back to its
committed offset. A partition nobody has committed yet is not moved, so what was dropped on it
is never read. This is common right after a worker starts: a join worker killed before its
first commit leaves its partitions uncommitted, and the survivor lost the records it fetched
from them while taking them over. Here such partitions go back to their first offset, where a
new consumer of the group starts (``auto_offset_reset=earliest``).

Faust hands each fetched record to its streams through a chain of coroutines, raced against the
flow being suspended, the consumer stopping and the consumer crashing: more CPU than the join's own
work on the record. When the hand-over cannot wait, it is done directly
(:mod:`streamapp.kafka.handover`); otherwise Faust's race runs as before.

Faust pauses a partition only in its own books: the fetcher underneath still fetches it, and the
records fetched are never taken. That is harmless for inputs, which Faust resumes, but the join's
own changelog partitions stay paused between recoveries while the join writes to them. The first
write to one after a recovery was fetched and left in the fetcher, which then waits its prefetch
backoff (100 ms) before fetching anything else on that broker: a 100 ms pause in every input, each
time a camera's bucket moved to a partition. Changelog partitions are therefore paused and resumed
in the fetcher too.

The fetcher keeps one fetch in flight per broker, and leaves out of it the partitions whose fetched
records wait to be taken. Faust lets the broker hold a fetch 1.5 s when it finds nothing new, so in
a backlog a fetch of only the partitions already read to their end (the small detections are, in
one fetch) held every other partition back that long: the drain ran at half speed or less. Here the
broker holds a fetch at most FETCH_MAX_WAIT_MS; an idle worker sends a small fetch that often.

Faust's stream acks the records it skips because flow is suspended or they were fetched in an
earlier generation, "otherwise the lag would increase". Acked, a skipped record's offset commits
with those after it: a record that reaches a stream after a stop (or a rebalance) suspended flow
was committed unhandled, and lost. Such an ack is refused here (:meth:`StreamappConsumer.ack`), so the record is read
again from the committed offset.

Under exactly-once the consumer reads ``read_committed`` (Faust's) and asks the broker for the
last stable offsets rather than taking those of the last fetch, unknown before the first: Faust's
table recovery took an unknown end for an empty changelog and recovered nothing. A changelog
written in transactions ends in a commit marker (streamapp.kafka.transactions), which recovery
never reads: the end it waits for is the record before it.

The consumer also says where each input partition is read from in a generation (its committed
offset, as sought), which the join needs to tell "caught up" before it has read a partition, and
how far it has read each through (:meth:`StreamappConsumer.read_through`): an input written in
transactions ends in a commit marker, an offset no record has, so a stage that has handled its
last record is caught up although its next offset is short of the end. It counts the input that
the broker's retention deleted before it was read (streamapp.unread).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import cast

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message
from mode import Service

from streamapp.kafka.handover import HandOver
from streamapp.kafka.producer import StreamappProducer
from streamapp.kafka.streams import flowing
from streamapp.kafka.transactions import PartitionTransactionManager
from streamapp.unread import UnreadGaps

log = logging.getLogger(__name__)

# Records handed over directly between yields to the event loop (a direct hand-over never yields).
_YIELD_EVERY = 10


FETCH_MAX_WAIT_MS = 50


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread, with a fetch wait that does not hold back a backlog, and under
    exactly-once the ends of partitions as the broker knows them."""

    def _create_consumer(self, loop: asyncio.AbstractEventLoop):
        consumer = super()._create_consumer(loop)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # Faust passes 1500; start() hands it to the fetcher
        return consumer

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        if not self.consumer.in_transaction:
            return await super()._highwaters(partitions)
        # read_committed: the broker answers with the last stable offsets.
        ends = await self._ensure_consumer().end_offsets(partitions)
        changelog = cast(StreamappConsumer, self.consumer)._is_changelog_tp
        return {tp: max(end - 1, 0) if changelog(tp) else end for tp, end in ends.items()}


class StreamappConsumer(faust_aiokafka.Consumer):
    #: Where each input partition is read from in a generation (see :meth:`start_offset`).
    read_from: Mapping[TP, tuple[int, int | None]] = MappingProxyType({})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unread_gaps = UnreadGaps()
        # Per input partition: (generation, after the last record handed over, fetch position).
        self._read_through: dict[TP, tuple[int, int | None, int]] = {}

    def ack(self, message: Message) -> bool:
        """Mark ``message`` safe to commit, unless a stream skipped it unhandled: a stream tracks
        each record it takes, after its skip test, so an untracked record acked while flow is
        suspended, or fetched in an earlier generation, was skipped."""
        if not message.tracked and not flowing(self.app, message):
            return False
        return super().ack(message)

    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed = await super().seek_to_committed()
        inputs = [tp for tp in committed if not self._is_changelog_tp(tp)]  # recovery places changelogs
        uncommitted = [tp for tp in inputs if not committed[tp]]
        first: Mapping[TP, int] = {}
        if uncommitted and self.app.conf.consumer_auto_offset_reset == "earliest":
            await self._thread.seek_to_beginning(*uncommitted)
            first = await self.earliest_offsets(*uncommitted)
        generation = self.app.consumer_generation_id
        self.read_from = {tp: (generation, committed[tp] or first.get(tp)) for tp in inputs}
        return committed

    def pause_partitions(self, tps: Iterable[TP]) -> None:
        tps = set(tps)
        super().pause_partitions(tps)
        self._pause_changelogs_in_fetcher(tps, paused=True)

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        tps = set(tps)
        super().resume_partitions(tps)
        self._pause_changelogs_in_fetcher(tps, paused=False)

    def _pause_changelogs_in_fetcher(self, tps: set[TP], *, paused: bool) -> None:
        """Pause (or resume) the changelog partitions among ``tps`` in the aiokafka consumer, on
        its own thread's loop, where its fetcher runs; partitions no longer assigned by then are
        left alone (a new assignment starts unpaused)."""
        changelogs = [TopicPartition(tp.topic, tp.partition) for tp in tps if self._is_changelog_tp(tp)]
        thread, kafka_consumer = self._fetching()
        if not changelogs or thread is None or kafka_consumer is None:
            return

        def apply() -> None:
            assigned = kafka_consumer.assignment()
            toggle = kafka_consumer.pause if paused else kafka_consumer.resume
            toggle(*(tp for tp in changelogs if tp in assigned))

        thread.thread_loop.call_soon_threadsafe(apply)

    def fetch_paused(self) -> set[TP]:
        """Partitions the fetcher is paused on; empty if the assignment changed while they were read
        (they are read from the worker's loop, and the consumer's thread owns them)."""
        _, kafka_consumer = self._fetching()
        if kafka_consumer is None:
            return set()
        try:
            return {TP(tp.topic, tp.partition) for tp in kafka_consumer.paused()}
        except (RuntimeError, IllegalStateError):
            return set()

    def _fetching(self):
        """The consumer's thread and the aiokafka consumer it runs (None until they are made)."""
        thread = cast(ConsumerThread | None, self._thread)
        return thread, None if thread is None else thread._consumer

    def start_offset(self, tp: TP) -> int | None:
        """The offset this generation reads ``tp`` from: its committed offset, or its first one
        when none is committed (None: unknown). Unlike the consumer's position, which runs ahead
        as records are fetched, it says what is left to process before anything is."""
        generation, offset = self.read_from.get(tp, (None, None))
        return offset if generation == self.app.consumer_generation_id else None

    def read_through(self, tp: TP) -> tuple[int | None, int] | None:
        """How far ``tp`` was read in this generation, as of the last fetch whose records were all
        handed to the streams: the offset after the last record handed over (None: none yet), and
        the fetch position, past the offsets that hold no record (transaction markers, aborted
        records). Once a stage has handled every record before the first, nothing is left to
        read before the second. None: not known."""
        generation, records_to, position = self._read_through.get(tp, (None, None, 0))
        return (records_to, position) if generation == self.app.consumer_generation_id else None

    def _note_read_through(self, generation: int) -> None:
        """After a fetch's records are all handed over: each input partition's fetch position
        (positions move only as a fetch's records are taken, in ``getmany``)."""
        _, kafka_consumer = self._fetching()
        read_offset = self._read_offset
        try:
            assignment = kafka_consumer._subscription.subscription.assignment  # type: ignore[union-attr]
            positions = {TP(tp.topic, tp.partition): assignment.state_value(tp) for tp in assignment.tps}
        except (AttributeError, KeyError):  # no consumer or no assignment (a rebalance)
            return
        for tp, state in positions.items():
            if state.has_valid_position and not self._is_changelog_tp(tp):
                last = read_offset.get(tp)
                self._read_through[tp] = (generation, None if last is None else last + 1, state.position)

    async def perform_seek(self) -> None:
        await super().perform_seek()
        # Faust takes the committed offset (the next to read) for the last one read, so a record
        # missing right there would leave no gap: the one before it is what was read last.
        for tp, (_, offset) in self.read_from.items():
            if offset:
                self._read_offset[tp] = offset - 1

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        self.unread_gaps.add(tp, offset_from, offset_to)
        await super()._add_gap(tp, offset_from, offset_to)

    @Service.timer(1.0)
    async def _count_deleted_unread(self) -> None:
        """Judge the gaps read since the last time against their partitions' log start offsets."""
        waiting = self.unread_gaps.waiting
        if not waiting:
            return
        try:
            log_starts = await self.earliest_offsets(*waiting)
        except KafkaError as exc:  # the gaps wait for the next second
            log.debug("cannot read the log start offsets of %s: %r", waiting, exc)
            return
        for deleted in self.unread_gaps.judge(log_starts):
            log.warning("%s", deleted.warning(), extra={"topic": deleted.tp.topic, "partition": deleted.tp.partition,
                                                        "offsets": [deleted.first, deleted.last]})

    def deleted_unread_gauges(self) -> dict[str, float]:
        return self.unread_gaps.as_metrics(self.read_from)

    async def _drain_messages(self, fetcher) -> None:
        """Faust's fetch loop (``Consumer._drain_messages``), racing a hand-over against flow
        suspension, stop and crash only when it can wait."""
        callback = self.callback
        consumer_stopped, fetcher_stopped = self._stopped.is_set, fetcher._stopped.is_set
        read_offset = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        hand_over = HandOver(self.app)
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(CONSUMER_FETCHING)
                generation = self.app.consumer_generation_id
                records = self.getmany(timeout=1.0)
                await asyncio.sleep(0)  # getmany may return at once, again and again
                if self.should_stop:
                    continue
                since_yield = 0
                async for tp, message in records:
                    offset, last = message.offset, read_offset[tp]
                    if last is not None and offset < last:
                        continue  # read before a seek back; Faust drops these too
                    if last is not None and offset - last > 1 and acks_enabled_for(message.topic):
                        await self._add_gap(tp, last + 1, offset)  # compacted, or transaction markers
                    if self._commit_every is not None and self._n_acked >= self._commit_every:
                        self._n_acked = 0
                        await self.commit()
                    if hand_over.may_wait(tp):
                        await self.wait_first(callback(message), self.suspend_flow.wait())
                    else:
                        if not hand_over.now(message):
                            await callback(message)
                        since_yield += 1
                        if since_yield >= _YIELD_EVERY:
                            await asyncio.sleep(0)
                            since_yield = 0
                    read_offset[tp] = offset
                # A fetch cut short (a rebalance or a stop) left records behind: they are read again.
                if self.flow_active and not self.should_stop and self.app.consumer_generation_id == generation:
                    self._note_read_through(generation)
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if not self.transport.app.should_stop:
                raise
        except asyncio.CancelledError:
            if not self.transport.app.should_stop:
                raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)


class Transport(faust_aiokafka.Transport):
    Consumer = StreamappConsumer
    Producer = StreamappProducer
    TransactionManager = PartitionTransactionManager
