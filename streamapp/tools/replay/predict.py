"""The expected outcome of a replay: the join's own decision run on the records, on the replay's clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from aiokafka.partitioner import murmur2

from streamapp import wire
from streamapp.agents.join import Joiner
from streamapp.settings import Settings
from streamapp.tables.entry import OTHER_SIDE, Entry, EntryKind
from streamapp.tools.replay.format import Record
from streamapp.tools.replay.transforms import side_of, side_value

_END_OF_TIME = 2**62


@dataclasses.dataclass
class Prediction:
    """What the join must do with a replayed stream: its counters and which frames end how."""

    counts: dict[str, int]
    joined: set[wire.FrameId]
    unmatched: set[wire.FrameId]


def predict(records: Iterable[Record], settings: Settings, *, speed: float | None) -> Prediction:
    """Runs the join's own decision (:class:`Joiner`) on the stream, on the replay's clock.

    The worker is taken to keep up, so the other side is always caught up: a waiting entry
    leaves at its deadline (stored + TTL on the replay clock), or as soon as the other side of
    its partition has been read past its event time + TTL, whichever comes first. The worker
    expires entries up to one sweep interval later, so scenarios keep their timings clear of the
    TTL by more than that.
    """
    joiner = Joiner.for_settings(settings)
    window = _PredictedWindow(joiner, settings.partitions)
    joined = set()
    start, now = None, 0
    for record in records:
        side = side_of(record)
        if side is None:
            continue
        start = record.timestamp_ms if start is None else start
        # The replayer never waits for a timestamp earlier than one it has passed: neither does this clock.
        now = max(now, 0 if speed is None else round((record.timestamp_ms - start) / speed))
        window.expire(now)
        decoded = side_value(record)
        if window.arrive(record, decoded, now) is not None:
            joined.add(decoded.id)
        window.expire(now)
    window.expire(_END_OF_TIME)
    counts = dataclasses.asdict(joiner.counts)
    return Prediction(counts, joined, window.unmatched)


class _PredictedWindow(dict):
    """The join window as a dict, with the read progress of each side, for :func:`predict`."""

    def __init__(self, joiner: Joiner, partitions: int) -> None:
        super().__init__()
        self.joiner, self.partitions = joiner, partitions
        self.partition_of: dict[bytes, int] = {}
        self.read_past: dict[tuple[bytes, int, bytes], int] = {}  # (side, partition, camera run)
        self.unmatched: set[wire.FrameId] = set()

    def put(self, key: bytes, entry: Entry) -> None:
        self[key] = entry

    def arrive(self, record: Record, decoded: wire.Frame | wire.Detections, now: int) -> wire.Joined | None:
        assert record.value is not None  # decoded from it
        partition = (murmur2(record.key or b"") & 0x7FFFFFFF) % self.partitions
        side = EntryKind.FRAME if isinstance(decoded, wire.Frame) else EntryKind.RESULT
        read = (side, partition, wire.run_of(decoded.id.join_key()))
        self.read_past[read] = max(self.read_past.get(read, record.event_time_ms), record.event_time_ms)
        self.partition_of[decoded.id.join_key()] = partition
        return self.joiner.arrive(self, decoded, record.value, event_ms=record.event_time_ms, now_ms=now)

    def expire(self, now: int) -> None:
        """Expire what is due at ``now``: by deadline (at the deadline) or by the other side's
        progress (now); markers made by expiry too."""
        while due := [(key, at) for key, entry in self.items() if (at := self._due_at(key, entry, now)) is not None]:
            for key, at in due:
                replacement, frame_out = self.joiner.on_due(self.pop(key), at)
                if replacement is not None:
                    self[key] = replacement
                if frame_out is not None:
                    self.unmatched.add(frame_out.frame.id)

    def _due_at(self, key: bytes, entry: Entry, now: int) -> int | None:
        if entry.deadline_ms <= now:
            return entry.deadline_ms
        if entry.is_pending:
            progress = self.read_past.get((OTHER_SIDE[entry.kind], self.partition_of[key], wire.run_of(key)))
            if progress is not None and entry.event_ms + self.joiner.ttl_ms < progress:
                return now
        return None


