"""Join stage: every original frame meets the inference result for that frame, exactly once.

Whichever side arrives first waits in the join window under its join key (stream, epoch, index);
the other side completes it, and the key is left with a small "joined" marker so that repeats are
recognised as duplicates. A frame still waiting at its deadline leaves unmatched (flagged) and
leaves an "expired" marker, so a result that arrives after it is counted late; a result still
waiting at its deadline is an orphan and is dropped (R1, R2). There are no per-key timers or
objects: the window's on-disk index drives expiry (R3, R8).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Optional, Protocol

from streamapp import wire
from streamapp.metrics import JOIN_LATENCY_BOUNDS, Histogram
from streamapp.tables.entry import Entry, EntryKind
from streamapp.wire import Detections, Frame, Joined

log = logging.getLogger(__name__)


class JoinState(Protocol):
    def get(self, key: bytes) -> Optional[Entry]: ...

    def put(self, key: bytes, entry: Entry) -> None: ...


class HeldWrites:
    """A JoinState whose writes wait in ``held`` until :meth:`apply`.

    The agent applies them once the joined record they imply is delivered, so a worker killed
    in between sees the pending entry again when the input is redelivered, and emits again
    instead of finding a "joined" marker for a record that never left (R12).
    """

    def __init__(self, state: JoinState) -> None:
        self.state = state
        self.held: dict[bytes, Entry] = {}

    def get(self, key: bytes) -> Optional[Entry]:
        return self.held[key] if key in self.held else self.state.get(key)

    def put(self, key: bytes, entry: Entry) -> None:
        self.held[key] = entry

    def apply(self) -> None:
        for key, entry in self.held.items():
            self.state.put(key, entry)
        self.held.clear()


@dataclasses.dataclass
class JoinCounts:
    frames_in: int = 0
    results_in: int = 0
    joined: int = 0
    unmatched_frames: int = 0
    orphan_results: int = 0
    late_results: int = 0
    duplicates: int = 0

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

    def on_frame(self, state: JoinState, frame: Frame, raw: bytes, now_ms: int) -> Optional[Joined]:
        self.counts.frames_in += 1
        return self._arrive(state, frame.id, EntryKind.FRAME, raw, now_ms,
                            lambda waiting: Joined(frame, wire.decode_detections(waiting.payload)))

    def on_result(self, state: JoinState, result: Detections, raw: bytes, now_ms: int) -> Optional[Joined]:
        self.counts.results_in += 1
        return self._arrive(state, result.id, EntryKind.RESULT, raw, now_ms,
                            lambda waiting: Joined(wire.decode_frame(waiting.payload), result))

    def _arrive(self, state: JoinState, frame_id: wire.FrameId, side: bytes, raw: bytes, now_ms: int,
                complete: Callable[[Entry], Joined]) -> Optional[Joined]:
        """One side arrives: wait for the other, complete the pair, or count why it is dropped."""
        key = frame_id.join_key()
        waiting = state.get(key)
        if waiting is None:
            state.put(key, Entry(side, now_ms + self.ttl_ms, raw))
            return None
        if waiting.kind == _OTHER_SIDE[side]:
            joined = complete(waiting)
            state.put(key, Entry(EntryKind.JOINED, now_ms + self.marker_ttl_ms))
            self.counts.joined += 1
            self.latency.observe(max(0, now_ms - (waiting.deadline_ms - self.ttl_ms)) / 1000)
            return joined
        if side == EntryKind.RESULT and waiting.kind == EntryKind.EXPIRED:
            self.counts.late_results += 1
        else:
            self.counts.duplicates += 1  # a repeat of a side that is waiting or already joined
        return None

    def on_due(self, entry: Entry, now_ms: int) -> tuple[Optional[Entry], Optional[Joined]]:
        """What replaces an entry at its deadline, and the unmatched frame to emit, if any."""
        if entry.kind == EntryKind.FRAME:
            self.counts.unmatched_frames += 1
            marker = Entry(EntryKind.EXPIRED, now_ms + self.marker_ttl_ms)
            return marker, Joined(wire.decode_frame(entry.payload), None)
        if entry.kind == EntryKind.RESULT:
            self.counts.orphan_results += 1
        return None, None


_OTHER_SIDE = {EntryKind.FRAME: EntryKind.RESULT, EntryKind.RESULT: EntryKind.FRAME}


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


def now_ms() -> int:
    """Expiry runs on this worker's clock, never on producers' timestamps (R3)."""
    return int(time.time() * 1000)


def register(stage) -> None:
    """The Faust side: one agent over frames + detections, and the sweep timer."""
    from streamapp.tables.disk import DiskGuard
    from streamapp.tables.window import DueOutcome, JoinWindow
    from streamapp.topics import JOIN_TABLE, changelog_config, max_record_bytes

    settings = stage.settings
    window = JoinWindow(
        stage.app,
        name=JOIN_TABLE,
        partitions=settings.partitions,
        memory=stage.rocks_memory,
        changelog_config=changelog_config(settings),
        recovery_buffer_size=stage.buffer_records,
    )
    joiner = Joiner(ttl_ms=int(settings.join_ttl_s * 1000),
                    marker_ttl_ms=int(settings.done_marker_ttl_s * 1000),
                    latency=stage.metrics.histogram("join_latency_seconds", JOIN_LATENCY_BOUNDS))
    topics = stage.topics
    record_limit = max_record_bytes(settings)
    disk = DiskGuard(settings.disk_budget_bytes, settings.data_dir)
    stage.metrics.add_gauges(joiner.counts.as_metrics)
    stage.metrics.add_gauges(disk.as_metrics)
    stage.metrics.add_gauges(lambda: window.gauges(now_ms(), joiner.ttl_ms))
    both_sides = stage.app.topic(topics.frames.get_topic_name(), topics.detections.get_topic_name(),
                                 key_serializer="raw", value_serializer="raw")

    @stage.app.agent(both_sides, name="join")
    async def join(stream):
        async for event in stream.events():
            await disk.wait_for_space()
            state = HeldWrites(window)
            try:
                record = wire.decode(event.value, max_frame_bytes=settings.max_frame_bytes)
                check_key(event.key, record, settings.bucket_size)
                check_fits(event.value, record_limit)
                if isinstance(record, Frame):
                    joined = joiner.on_frame(state, record, event.value, now_ms())
                elif isinstance(record, Detections):
                    joined = joiner.on_result(state, record, event.value, now_ms())
                else:
                    raise wire.WireError("a joined record does not belong on the join's inputs")
            except wire.WireError as exc:
                await stage.dead_letters.send(event, stage="join", reason=exc.reason)
                continue
            if joined is not None:
                delivery = await stage.dead_letters.emit(
                    event, stage="join", topic=topics.joined, key=event.key, value=wire.encode_joined(joined))
                if delivery is not None:
                    await delivery
            state.apply()

    async def on_due(key: bytes, entry: Entry, partition: int) -> DueOutcome:
        replacement, unmatched = joiner.on_due(entry, now_ms())
        if unmatched is None:
            return DueOutcome(replacement)
        delivery = await topics.joined.send(key=unmatched.frame.id.bucket_key(settings.bucket_size),
                                            value=wire.encode_joined(unmatched))
        return DueOutcome(replacement, delivery)

    @stage.app.timer(settings.sweep_interval_s, name="join-sweep")
    async def sweep():
        # Mid-recovery the store holds part of the changelog: an overdue frame whose "joined"
        # marker is in a later batch would be emitted again as unmatched.
        if stage.app.in_recovery or stage.app.rebalancing:
            return
        await window.sweep(now_ms(), on_due)
        await disk.tend(window, on_due)
