"""Join stage: every original frame meets the inference result for that frame, exactly once.

Whichever side arrives first waits in the join window under its join key (stream, epoch, index);
the other side completes it, and the key is left with a small "joined" marker so that repeats are
recognised as duplicates. A waiting side leaves when its partner can no longer arrive (DESIGN R3):
the other side of its partition has been read past its event time (its Kafka timestamp, the
frame's capture time) + TTL, or that side is caught up and the TTL has passed since the join read
it. A frame that leaves so goes out unmatched (flagged) and leaves an "expired" marker, so a
result after it is counted late; a result that leaves so is an orphan and is dropped (R1, R2).

The agent takes its input in batches: it decides a whole batch, sends the outputs without waiting
for each, and writes the window once they are all delivered; its offsets commit after that. When
the next batch's input arrives before those outputs are acknowledged, it is decided on top of the
one on its way (:class:`BatchRun`). The sweep and the batches hold one lock, so a frame is never
both joined and expired. Both sides of a partition are read in step: a side more than a TTL ahead
of the other in event time is paused until the other catches up, so pending state while a
backlog drains is as small as live; within that, a record whose partner may still be read soon
is held back from its batch (:class:`PartnerHoldBack`), so that the two are decided together; it
is decided as of when it was read, so holding never moves its deadline.
There are no per-key timers or objects: the window's on-disk index drives expiry (R8).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from faust.types import TP, EventT

from streamapp import wire
from streamapp.batches import Batch, Batches, TakenEvent
from streamapp.jpeg import CorruptFrame, check_jpeg
from streamapp.recordbatches import Pieces
from streamapp.samples import JOIN_LATENCY_BOUNDS, Histogram
from streamapp.tables.entry import OTHER_SIDE, Entry, EntryKind
from streamapp.tables.progress import ReadProgress, remember_latest
from streamapp.tables.transaction import CHANGE_OVERHEAD_BYTES
from streamapp.topics import JOIN_TABLE, changelog_config, max_record_bytes
from streamapp.units import event_bytes
from streamapp.wire import Detections, Frame, Joined

if TYPE_CHECKING:
    from streamapp.settings import Settings
    from streamapp.tables.transaction import JoinTransaction, WriteRetry
    from streamapp.worker.outbox import Outbox
    from streamapp.worker.stage import Stage


log = logging.getLogger(__name__)

# Records the agent decides at once at most; bytes per batch are the memory plan's (Stage.batch_bytes).
MAX_BATCH_EVENTS = 1000
# After a batch the window is expired at most this often: at a trickle a batch holds a few records,
# and each expiry seeks every owned partition's indexes. Outcomes do not depend on it.
EXPIRE_AFTER_BATCH_MS = 50
# A run of batches decided one on top of the other ends at least this often, so that the window
# is expired and the sweep gets the lock while a backlog drains.
RUN_MS = 500
# How long a record is held back for its partner (PartnerHoldBack): when the partner's side is
# caught up, the partner is due in the next fetch or not at all; when that side has a backlog,
# it is being read.
HOLD_CAUGHT_UP_S = 0.05
HOLD_BEHIND_S = 5.0
# Kafka keys (camera buckets) whose latest event time read is remembered per side, least recently
# read forgotten first; about 150 bytes each.
HOLD_KEYS = 4096


class ReadPositions(Protocol):
    """What the worker's consumer says about where it reads a partition from in this generation,
    and how far it has read it through (streamapp.kafka.consumer)."""

    def start_offset(self, tp: TP) -> int | None: ...

    def read_through(self, tp: TP) -> tuple[int | None, int] | None: ...


class JoinState(Protocol):
    def get(self, key: bytes) -> Entry | None: ...

    def put(self, key: bytes, entry: Entry) -> None: ...


@dataclasses.dataclass
class JoinCounts:
    frames_in: int = 0
    results_in: int = 0
    joined: int = 0
    unmatched_frames: int = 0
    orphan_results: int = 0
    late_results: int = 0
    duplicates: int = 0
    unreadable_entries: int = 0

    def as_metrics(self) -> dict[str, int]:
        return {f"join_{name}_total": value for name, value in dataclasses.asdict(self).items()}


@dataclasses.dataclass
class Joiner:
    """The join decision for one record at a time, over any JoinState (a Faust table or a dict)."""

    ttl_ms: int
    marker_ttl_ms: int
    counts: JoinCounts = dataclasses.field(default_factory=JoinCounts)
    # How long the first side waited for the second, on the join's clock: the part of the
    # end-to-end delay the join adds, independent of the producers' clocks.
    latency: Histogram = dataclasses.field(default_factory=lambda: Histogram(JOIN_LATENCY_BOUNDS))

    @classmethod
    def for_settings(cls, settings: Settings, **observed: Any) -> Joiner:
        """The join of these settings: the worker's, and the replay's prediction of it."""
        return cls(settings.join_ttl_ms, settings.done_marker_ttl_ms, **observed)

    def arrive(self, state: JoinState, record: Frame | Detections, raw: bytes, *,
               event_ms: int, now_ms: int) -> Joined | None:
        """One side arrives: wait for the other, complete the pair, or count why it is dropped.
        ``now_ms`` is when the join read it (a record held back is decided later, as of then)."""
        side = EntryKind.FRAME if isinstance(record, Frame) else EntryKind.RESULT
        if side == EntryKind.FRAME:
            self.counts.frames_in += 1
        else:
            self.counts.results_in += 1
        key = record.id.join_key()
        waiting = state.get(key)
        if waiting is not None and waiting.kind == OTHER_SIDE[side]:
            joined = self._complete(record, waiting)
            if joined is not None:
                state.put(key, Entry(EntryKind.JOINED, now_ms + self.marker_ttl_ms))
                self.counts.joined += 1
                self.latency.observe(max(0, now_ms - (waiting.deadline_ms - self.ttl_ms)) / 1000)
                return joined
            waiting = None  # unreadable: this side waits in its place, for its real partner
        if waiting is None:
            # A waiting result keeps its parsed boxes for this batch; a frame would keep a second
            # copy of its JPEG, outside the batch's byte bound.
            decoded = record if isinstance(record, Detections) else None
            state.put(key, Entry(side, now_ms + self.ttl_ms, raw, event_ms, decoded))
            return None
        if side == EntryKind.RESULT and waiting.kind == EntryKind.EXPIRED:
            self.counts.late_results += 1
        else:
            self.counts.duplicates += 1  # a repeat of a side that is waiting or already joined
        return None

    def on_due(self, entry: Entry, now_ms: int) -> tuple[Entry | None, Joined | None]:
        """What replaces an entry at its deadline, and the unmatched frame to emit, if any."""
        if entry.kind == EntryKind.FRAME:
            try:
                frame = wire.decode_frame(entry.payload)
            except wire.WireError as exc:
                self._unreadable(entry, exc)
                return None, None
            self.counts.unmatched_frames += 1
            return Entry(EntryKind.EXPIRED, now_ms + self.marker_ttl_ms), Joined(frame, None)
        if entry.kind == EntryKind.RESULT:
            self.counts.orphan_results += 1
        return None, None

    def _complete(self, arrived: Frame | Detections, waiting: Entry) -> Joined | None:
        """The pair, or None when the waiting side's record cannot be read (counted)."""
        try:
            return _pair(arrived, waiting)
        except wire.WireError as exc:
            self._unreadable(waiting, exc)
            return None

    def _unreadable(self, entry: Entry, error: wire.WireError) -> None:
        """A stored entry the join cannot read (one restored before the changelog check read its
        whole record): it is dropped, so it never fails the sweep or the batch again."""
        self.counts.unreadable_entries += 1
        if self.counts.unreadable_entries == 1:
            log.warning("join entry of kind %s holds a record the join cannot read (%s); dropped, and so is every "
                        "further one (counted in join_unreadable_entries_total, not logged)",
                        entry.kind.decode(), error.reason)


def _pair(arrived: Frame | Detections, waiting: Entry) -> Joined:
    if isinstance(arrived, Frame):
        known = waiting.decoded
        return Joined(arrived, known if isinstance(known, Detections) else wire.decode_detections(waiting.payload))
    return Joined(wire.decode_frame(waiting.payload, view=True), arrived)  # encoded while the entry holds it


def check_key(key: bytes | None, record, bucket_size: int) -> None:
    """A record keyed other than by its bucket may sit on a partition its other side never
    reaches: it could never join, so it is rejected rather than left to expire (R9)."""
    expected = record.id.bucket_key(bucket_size)
    if key != expected:
        raise wire.WireError(f"Kafka key {key!r} is not the frame's bucket key {expected!r}")


# A stored record travels to the changelog as the input plus the entry header, under its join key,
# in a Kafka batch of its own: this much room below the record limit covers all of that.
CHANGELOG_ROOM_BYTES = 1024


def check_fits(value: bytes, max_record_bytes: int) -> None:
    """A record the changelog would refuse must not enter the window: its write would fail after
    the store changed, on every redelivery (a poison pill)."""
    limit = max_record_bytes - CHANGELOG_ROOM_BYTES
    if len(value) > limit:
        raise wire.WireError(f"record of {len(value)} bytes does not fit the join window's changelog "
                             f"(at most {limit})")


def change_bound(batch: Batch) -> int:
    """The most the decisions of ``batch`` can change the join window by, in bytes."""
    return batch.bytes + len(batch.events) * CHANGE_OVERHEAD_BYTES


def now_ms() -> int:
    """The worker's clock: when records were read, for the caught-up rule and the markers."""
    return int(time.time() * 1000)


def read_ms(read_at: float, now: float, now_ms: int) -> int:
    """When a record taken from the stream at ``read_at`` (monotonic, as ``now``) was read, on the
    worker's clock (``now_ms`` at ``now``)."""
    return now_ms - round((now - read_at) * 1000)


def event_time_ms(message) -> int:
    """The record's Kafka timestamp (Faust gives seconds): the frame's capture time."""
    return round(message.timestamp * 1000)


def end_offset(consumer, tp: TP) -> int | None:
    """The partition's end offset as of the consumer's latest fetch; None when unknown (not
    fetched yet, or no longer assigned)."""
    try:
        return consumer.highwater(tp)
    except Exception:  # noqa: BLE001 - aiokafka asserts the partition is assigned
        return None


class InStep:
    """Pauses the input partition that has read more than a TTL ahead of its partner in event
    time while the partner has a backlog, and resumes it once the partner catches up.

    It pauses the way Faust does for a full stream buffer (``on_buffer_full``): records of the
    partition already fetched are still handed to the stream, only further fetches wait. Faust's
    ``pause_partitions`` would make the consumer skip records fetched but not yet handed over,
    and they would never come back.
    """

    def __init__(self, consumer, progress: ReadProgress, lead_ms: int) -> None:
        self.consumer, self.progress, self.lead_ms = consumer, progress, lead_ms
        self.paused: set[TP] = set()
        self.pauses = 0

    def adjust(self, partitions: Iterable[int]) -> None:
        wanted = {TP(self.progress.names[side], number) for number in partitions
                  if (side := self.progress.ahead(number, self.lead_ms)) is not None}
        for tp in self.paused - wanted:
            self.consumer.on_buffer_drop(tp)
        for tp in wanted:  # again each time: a drained stream buffer resumes it in between
            self.consumer.on_buffer_full(tp)
        self.pauses += len(wanted - self.paused)
        self.paused = wanted

    def as_metrics(self) -> dict[str, float]:
        return {"join_input_partitions_paused": len(self.paused), "join_input_pauses_total": self.pauses}


@dataclasses.dataclass(slots=True)
class Held:
    """A record held back for its partner."""

    event: EventT
    sensor_state: Any
    read_at: float  # when it was taken from the stream (monotonic): held since then
    key: bytes
    event_ms: int
    size: int


class PartnerHoldBack:
    """Holds a record back from its batch while its partner may still be read soon, so that the
    two are decided in one batch: a pair completed in one batch is never stored with its payload
    (no RocksDB write, no changelog record, no second decode of the stored side).

    Each side of a camera bucket (the Kafka key both sides share) is read in event-time order, so
    a record's partner can still come only while the other side of its bucket has not been read
    up to the record's event time. When one side runs ahead (small results are fetched thousands
    at a time, large frames a few), its records wait here for the other side: up to HOLD_BEHIND_S
    while the other side has a backlog, HOLD_CAUGHT_UP_S while it is caught up (live: the partner
    comes in the next fetch or not at all). Held records are bounded in bytes; past the bound the
    oldest go on at once, counted. A record let go without its partner is decided as before: it
    waits in the window. For how long a record waits, the records of the other side taken so far,
    held back or not, count as read: they are in hand, not a backlog (else two sides holding
    records of different buckets would hold each other for HOLD_BEHIND_S).

    A record never overtakes an earlier one of its input partition: holding the head of a
    partition is the same as reading that partition later, which the expiry rule already makes
    safe (nothing counts as read past a held record). A record let go is decided as of when it
    was read (its TTL on the worker's clock runs from then). So holding decides only which batch
    a record is decided in, never what is decided, nor when it leaves unmatched."""

    def __init__(self, progress: ReadProgress, max_bytes: int) -> None:
        self.progress, self.max_bytes = progress, max_bytes
        self.latest: collections.OrderedDict[tuple[int, bytes], int] = collections.OrderedDict()
        self.queues: dict[tuple[int, int], collections.deque[Held]] = {}  # (side, partition), read order
        self.held_bytes = 0
        self.held_generation: int | None = None
        self.let_go_over_bound = 0

    def holding(self) -> bool:
        return any(self.queues.values())

    def poll_s(self) -> float:
        return HOLD_CAUGHT_UP_S

    def take(self, taken: Sequence[TakenEvent], now: float) -> list[TakenEvent]:
        ready: list[TakenEvent] = []
        if self.held_generation != (generation := self.progress.generation()):
            self.held_generation = generation
            ready += self._let_go_all()  # fetched before a rebalance: the batch drops them
        sides = self.progress.topics
        for event, sensor_state, read_at in taken:
            message = event.message
            side, key = sides.get(message.topic), message.key
            if side is not None:
                self.progress.taken(side, message.partition, message.offset)
            if side is None or not isinstance(key, bytes):
                ready.append((event, sensor_state, read_at))
                continue
            held = Held(event, sensor_state, read_at, key, event_time_ms(message), event_bytes(event))
            remember_latest(self.latest, (side, key), held.event_ms, HOLD_KEYS)
            self.queues.setdefault((side, message.partition), collections.deque()).append(held)
            self.held_bytes += held.size
        for (side, partition), queue in self.queues.items():
            ready += self._heads_ready(side, partition, queue, now)
        ready += self._over_bound()
        return ready

    def _heads_ready(self, side: int, partition: int, queue: collections.deque[Held],
                     now: float) -> list[TakenEvent]:
        """Let go, in read order, the records whose partner's side has been read up to them, or
        that have waited their time."""
        found, limit = [], None
        while queue:
            head = queue[0]
            partner = self.latest.get((1 - side, head.key))
            if partner is None or partner < head.event_ms:
                if limit is None:
                    limit = HOLD_CAUGHT_UP_S if self.progress.all_taken(1 - side, partition) else HOLD_BEHIND_S
                if now - head.read_at < limit:
                    break
            found.append(self._let_go(queue.popleft()))
        return found

    def _let_go(self, held: Held) -> TakenEvent:
        self.held_bytes -= held.size
        return held.event, held.sensor_state, held.read_at

    def _over_bound(self) -> list[TakenEvent]:
        """Let the oldest held go until the rest fit the byte bound."""
        found = []
        while self.held_bytes > self.max_bytes:
            queue = min((queue for queue in self.queues.values() if queue), key=lambda queue: queue[0].read_at)
            found.append(self._let_go(queue.popleft()))
            self.let_go_over_bound += 1
        return found

    def _let_go_all(self) -> list[TakenEvent]:
        found = [self._let_go(held) for queue in self.queues.values() for held in queue]
        self.queues.clear()
        return found

    def oldest_read_at(self) -> float | None:
        """When the oldest record held was taken from the stream (monotonic), if any is held."""
        return min((queue[0].read_at for queue in self.queues.values() if queue), default=None)

    def as_metrics(self) -> dict[str, float]:
        return {"join_held_bytes": self.held_bytes, "join_held_let_go_over_bound_total": self.let_go_over_bound}


@dataclasses.dataclass
class InFlight:
    """A decided batch whose outputs are on their way: its window writes and its acks wait for them."""

    batch: Batch
    transaction: JoinTransaction
    outbox: Outbox

    async def finish(self, retry: WriteRetry) -> None:
        await self.outbox.delivered()
        await self.transaction.commit(retry, self.batch.events)
        self.batch.ack()  # its offsets may commit now: after its outputs and its changelog records


class BatchRun:
    """Batches decided one on top of the other while input keeps coming, holding the window's lock from
    the first to the last: the batch after is decided while this one's outputs are on their way,
    so the loop keeps deciding instead of waiting for acks. At most two batches are in flight."""

    def __init__(self, lock: asyncio.Lock, retry: WriteRetry) -> None:
        self.lock, self.retry = lock, retry
        self.in_flight: InFlight | None = None
        self.started_ms: int | None = None  # while the run holds the lock

    @property
    def running(self) -> bool:
        return self.started_ms is not None

    async def start(self) -> None:
        if not self.running:
            await self.lock.acquire()
            self.started_ms = now_ms()

    def base(self) -> JoinTransaction | None:
        return None if self.in_flight is None else self.in_flight.transaction

    async def carry(self, decided: InFlight) -> None:
        """``decided`` is on its way; the batch before it is finished."""
        before, self.in_flight = self.in_flight, decided
        if before is not None:
            await before.finish(self.retry)

    def due_to_end(self) -> bool:
        return self.started_ms is None or now_ms() - self.started_ms >= RUN_MS

    async def finish(self) -> None:
        """Finish the batch in flight; the lock is still held."""
        if self.in_flight is not None:
            decided, self.in_flight = self.in_flight, None
            await decided.finish(self.retry)

    def release(self) -> None:
        """End the run. A batch still in flight (the agent raised or was cancelled) is never acked:
        it is read again after a restart."""
        if self.running:
            self.in_flight, self.started_ms = None, None
            self.lock.release()


def register(stage: Stage) -> None:
    """The Faust side: one agent over frames + detections taking batches, and the sweep timer."""
    from streamapp.tables.disk import DiskGuard
    from streamapp.tables.window import DueOutcome, JoinWindow

    settings, app, topics = stage.settings, stage.app, stage.topics
    window = JoinWindow(
        app,
        name=JOIN_TABLE,
        partitions=settings.partitions,
        memory=stage.rocks_memory,
        changelog_config=changelog_config(settings),
        recovery_buffer_size=stage.buffer_records,
        # Markers outlast pending sides (Settings checks it): no entry waits longer.
        longest_wait_ms=settings.done_marker_ttl_ms,
    )
    joiner = Joiner.for_settings(settings, latency=stage.metrics.histogram("join_latency_seconds", JOIN_LATENCY_BOUNDS))
    record_limit = max_record_bytes(settings)
    disk = DiskGuard(settings.disk_budget_bytes, settings.data_dir, reserve_bytes=settings.disk_reserve_bytes)
    # Under exactly-once a batch's outputs, changelog records and offsets commit in its
    # partitions' transactions, as do a sweep's unmatched frames and markers; a transaction spans
    # the batches of a commit interval, its changes held until it commits, in the room of the
    # two batches a join holds (make_room).
    commits = stage.partition_transactions("join", topics.frames, topics.detections,
                                           changelog=window.changelog.topic, lock=window.lock)
    if commits is not None:
        window.commit_in(commits, disk.written, 2 * stage.batch_bytes)
    frames_topic, results_topic = topics.frames.get_topic_name(), topics.detections.get_topic_name()
    progress = ReadProgress(
        frames_topic, results_topic,
        end_offset=lambda topic, number: end_offset(app.consumer, TP(topic, number)),
        start_offset=lambda topic, number: cast(ReadPositions, app.consumer).start_offset(TP(topic, number)),
        read_through=lambda topic, number: cast(ReadPositions, app.consumer).read_through(TP(topic, number)),
        generation=lambda: app.consumer_generation_id,
        clock=now_ms,
    )
    in_step = InStep(app.consumer, progress, joiner.ttl_ms)
    hold_back = PartnerHoldBack(progress, stage.batch_bytes)

    def window_gauges() -> dict[str, float]:
        # The oldest pending age counts records held back too: they were read and wait, unseen by the window.
        now, wall = time.monotonic(), now_ms()
        held_at = hold_back.oldest_read_at()
        held_since_ms = None if held_at is None else read_ms(held_at, now, wall)
        return window.gauges(wall, joiner.ttl_ms, held_since_ms=held_since_ms)

    stage.metrics.add_gauges(joiner.counts.as_metrics)
    stage.metrics.add_gauges(disk.as_metrics)
    stage.readiness.add("join disk not paused", lambda: not disk.paused)
    stage.metrics.add_gauges(in_step.as_metrics)
    stage.metrics.add_gauges(hold_back.as_metrics)
    stage.metrics.add_gauges(window_gauges)
    stage.metrics.add_gauges(lambda: window.uncommitted.as_metrics())
    stage.readiness.add("join changelog recovery not failing", lambda: window.store.changelog_health.failing is None)
    both_sides = app.topic(frames_topic, results_topic, key_serializer="raw", value_serializer="raw")

    def decode(event) -> Frame | Detections:
        # A frame's JPEG is read within the batch, while its event holds the record: viewed, not copied.
        record = wire.decode(event.value, max_frame_bytes=settings.max_frame_bytes, view=True)
        if not isinstance(record, (Frame, Detections)):
            raise wire.WireError("a joined record does not belong on the join's inputs")
        if isinstance(record, Frame):  # markers only: a frame that cannot be drawn never waits
            check_jpeg(record.jpeg, (record.width, record.height))
        check_key(event.key, record, settings.bucket_size)
        check_fits(event.value, record_limit)
        return record

    async def on_due(key: bytes, entry: Entry, partition: int) -> DueOutcome:
        replacement, unmatched = joiner.on_due(entry, now_ms())
        if unmatched is None:
            return DueOutcome(replacement)
        sender, key = window.output_sender(partition, app.producer), unmatched.frame.id.bucket_key(settings.bucket_size)
        delivery = await sender.send(topics.joined.get_topic_name(), key, wire.encode_joined(unmatched),
                                     None, None, None)
        return DueOutcome(replacement, delivery)

    def keep_in_step() -> None:
        in_step.adjust(number for number, _ in window.store.active_partitions())

    async def expire() -> None:
        await window.expire(now_ms(), joiner.ttl_ms, progress, on_due, disk.written)

    async def join_batch(batch: Batch, base: JoinTransaction | None) -> InFlight:
        transaction = window.transaction(base)
        outbox = stage.outbox(topics.joined, stage="join")
        now, decided_at = time.monotonic(), now_ms()
        for event, read_at in zip(batch.events, batch.read_at, strict=True):
            message = event.message
            progress.passed(message.topic, message.partition, message.offset)
            try:
                record = decode(event)
            except (wire.WireError, CorruptFrame) as exc:
                await stage.dead_letters.send(event, stage="join", reason=str(exc))
                continue
            event_ms = event_time_ms(message)
            progress.observe(message.topic, message.partition, wire.run_of(record.id.join_key()), event_ms)
            joined = joiner.arrive(transaction.partition(message.partition), record, event.value,
                                   event_ms=event_ms, now_ms=read_ms(read_at, now, decided_at))
            if joined is not None:
                # The key was checked by decode; the JPEG, a view of the input record, is copied
                # once, into the output's record batch.
                await outbox.add(event, cast(bytes, event.key), Pieces(*wire.joined_pieces(joined)))
        outbox.hand_over()
        return InFlight(batch, transaction, outbox)

    async def run_goes_on(batches: Batches, run: BatchRun, decided: InFlight) -> bool:
        """Whether the next batch is decided on top of ``decided``: nothing needs the lock or the
        window as written (expiry, a rebalance, a full disk), and input for it arrives before
        ``decided``'s outputs are acknowledged (else the run ends: at a trickle, a batch
        commits as soon as its outputs are acknowledged, as it would alone). Under exactly-once
        both go into the same open transactions, so the run ends when they are due to commit."""
        if run.due_to_end() or app.rebalancing or disk.paused or window.commit_due():
            return False
        return await batches.input_before(decided.outbox.acked())

    async def make_room(run: BatchRun, batch: Batch) -> None:
        """Under exactly-once the changes of the open transactions share the room of the two
        batches a join holds with the batches in flight: a batch that does not fit beside the one
        in flight waits for it to finish, and the open transactions commit first if it does not
        fit beside their changes."""
        if window.commits is None:
            return
        if run.in_flight is not None and not window.uncommitted.has_room(
                change_bound(run.in_flight.batch) + change_bound(batch)):
            await run.finish()
        await window.make_room(change_bound(batch))

    @app.agent(both_sides, name="join")
    async def join(stream):
        batches = Batches(stream, max_bytes=stage.batch_bytes, max_events=MAX_BATCH_EVENTS, hold_back=hold_back)
        run = BatchRun(window.lock, disk.written)
        expired_at = 0
        try:
            async for batch in batches:
                if not run.running:
                    await disk.wait_for_space()
                    await run.start()
                await make_room(run, batch)
                decided = await join_batch(batch, run.base())
                await run.carry(decided)
                keep_in_step()
                if await run_goes_on(batches, run, decided):
                    continue
                await run.finish()
                await window.commit_if_due()
                if (now := now_ms()) - expired_at >= EXPIRE_AFTER_BATCH_MS:
                    expired_at = now
                    await disk.unless_full(expire)
                run.release()
            await run.finish()
        finally:
            run.release()

    # mode types handlers as VarArg/NamedArg callables, which mypy matches with no function.
    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def stop_outputs(sender, **kwargs) -> None:
        # After the store's stop (Faust stops tables first), which waited for the batch in progress.
        await stage.stop_outputs()

    @app.timer(settings.sweep_interval_s, name="join-sweep")
    async def sweep():
        # Mid-recovery the store holds part of the changelog: an overdue frame whose "joined"
        # marker is in a later batch would be emitted again as unmatched.
        if app.in_recovery or app.rebalancing:
            return
        async with window.lock:
            await disk.unless_full(expire)
            await disk.unless_full(lambda: disk.tend(window, on_due))
        keep_in_step()  # with no batch coming, a side paused for its partner's backlog resumes here
