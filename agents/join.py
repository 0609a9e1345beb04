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
from streamapp.tables.entry import Entry, EntryKind
from streamapp.wire import Detections, Frame, Joined

log = logging.getLogger(__name__)


class JoinState(Protocol):
    def get(self, key: bytes) -> Optional[Entry]: ...

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

    def as_metrics(self) -> dict[str, int]:
        return {f"join_{name}_total": value for name, value in dataclasses.asdict(self).items()}


@dataclasses.dataclass
class Joiner:
    """The join decision for one record at a time, over any JoinState (a Faust table or a dict)."""

    ttl_ms: int
    marker_ttl_ms: int
    counts: JoinCounts = dataclasses.field(default_factory=JoinCounts)

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


def now_ms() -> int:
    """Expiry runs on this worker's clock, never on producers' timestamps (R3)."""
    return int(time.time() * 1000)


def register(stage) -> None:
    """The Faust side: one agent over frames + detections, and the sweep timer."""
    from streamapp.tables.window import JoinWindow
    from streamapp.topics import JOIN_TABLE, changelog_config

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
                    marker_ttl_ms=int(settings.done_marker_ttl_s * 1000))
    topics = stage.topics
    stage.metrics.add_gauges(joiner.counts.as_metrics)
    stage.metrics.add_gauges(lambda: window.gauges(now_ms()))
    both_sides = stage.app.topic(topics.frames.get_topic_name(), topics.detections.get_topic_name(),
                                 key_serializer="raw", value_serializer="raw")

    @stage.app.agent(both_sides, name="join")
    async def join(stream):
        async for event in stream.events():
            try:
                record = wire.decode(event.value, max_frame_bytes=settings.max_frame_bytes)
                check_key(event.key, record, settings.bucket_size)
                if isinstance(record, Frame):
                    joined = joiner.on_frame(window, record, event.value, now_ms())
                elif isinstance(record, Detections):
                    joined = joiner.on_result(window, record, event.value, now_ms())
                else:
                    raise wire.WireError("a joined record does not belong on the join's inputs")
            except wire.WireError as exc:
                await stage.dead_letters.send(event, stage="join", reason=exc.reason)
                continue
            if joined is not None:
                await topics.joined.send(key=event.key, value=wire.encode_joined(joined))

    def on_due(key: bytes, entry: Entry, partition: int) -> Optional[Entry]:
        replacement, unmatched = joiner.on_due(entry, now_ms())
        if unmatched is not None:
            topics.joined.send_soon(
                key=unmatched.frame.id.bucket_key(settings.bucket_size),
                value=wire.encode_joined(unmatched),
            )
        return replacement

    @stage.app.timer(settings.sweep_interval_s, name="join-sweep")
    async def sweep():
        await window.sweep(now_ms(), on_due)
