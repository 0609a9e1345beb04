"""How far the join has read each input partition: the facts its expiry rule is built on.

An entry's partner can no longer arrive once the other side of its partition has been read past
the entry's event time + TTL, or once that side is caught up (nothing left to read) and the TTL
has passed on the worker's clock (DESIGN R3). Both facts are kept here per input partition:

* event time read, per camera run (``stream:epoch``): cameras on one partition may disagree by
  minutes, and one camera's clock must never expire another camera's entries; a restarted camera
  (a new epoch) may come back with its clock set differently;
* the next offset to read, against the partition's end offset, for "caught up"; under
  exactly-once the end is a commit marker, an offset no record has, so the consumer says how far
  it has read a partition through, markers included (``read_through``).

Progress is kept in memory only and starts over when the consumer group changes generation:
after a rebalance records are read again from the committed offsets, and a fact about records
read before would expire entries whose partners are about to be read again.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

# Camera runs remembered per input partition; beyond it the least recently seen is forgotten (its
# entries then leave by the caught-up rule only). About 100 bytes each.
MAX_RUNS_PER_PARTITION = 4096


# A side not caught up for this long is behind (a backlog), not between two fetches of live input.
BEHIND_AFTER_MS = 1_000

# After the last record the consumer handed over (None: none), and the offset it read through,
# past the offsets that hold no record (streamapp.kafka.consumer).
ReadThrough = tuple[int | None, int]


@dataclasses.dataclass
class SideProgress:
    """One input partition (frames[p] or detections[p]) as the join has read it."""

    generation: int
    created_ms: int = 0
    next_offset: int | None = None
    taken_to: int | None = None  # after the last record taken for a batch, decided or held back
    caught_up_ms: int | None = None  # when it was last found caught up
    event_ms: collections.OrderedDict[bytes, int] = dataclasses.field(default_factory=collections.OrderedDict)
    forgotten_runs: int = 0

    def passed(self, offset: int) -> None:
        """The record at ``offset`` was read, whatever it held (a bad record is read too)."""
        self.next_offset = offset + 1 if self.next_offset is None else max(self.next_offset, offset + 1)

    def taken(self, offset: int) -> None:
        """The record at ``offset`` was taken for a batch: decided in it or held back for a later one."""
        self.taken_to = offset + 1 if self.taken_to is None else max(self.taken_to, offset + 1)

    def observe(self, run: bytes, event_ms: int) -> None:
        if remember_latest(self.event_ms, run, event_ms, MAX_RUNS_PER_PARTITION):
            self.forgotten_runs += 1

    def read_past(self, run: bytes) -> int | None:
        return self.event_ms.get(run)

    def latest_event_ms(self) -> int | None:
        return max(self.event_ms.values(), default=None)

    def caught_up(self, end_offset: int | None, start_offset: int | None, read_through: ReadThrough | None = None,
                  *, taken: bool = False) -> bool:
        """True when nothing is left to read: the next offset (what this join read, else where
        the consumer starts; with ``taken``, what it took, held back or not) has reached the
        partition's end offset, or the consumer read through to it and this join has every
        record the consumer handed over. Unknown is not caught up."""
        position = self.next_offset if self.next_offset is not None else start_offset
        if taken and self.taken_to is not None:
            position = self.taken_to if position is None else max(position, self.taken_to)
        if read_through is not None:
            records_to, through = read_through
            if records_to is None or (position is not None and position >= records_to):
                position = through if position is None else max(position, through)
        return end_offset is not None and position is not None and position >= end_offset

    def behind(self, now_ms: int) -> bool:
        """Not caught up for a while: live input is caught up between fetches every few ms."""
        return now_ms - (self.created_ms if self.caught_up_ms is None else self.caught_up_ms) > BEHIND_AFTER_MS


def remember_latest(latest: collections.OrderedDict, key, event_ms: int, limit: int) -> bool:
    """Keep the latest event time read under ``key``, most recently read last; past ``limit`` keys
    the least recently read is forgotten (True when one was)."""
    known = latest.pop(key, None)
    latest[key] = event_ms if known is None else max(known, event_ms)
    if len(latest) > limit:
        latest.popitem(last=False)
        return True
    return False


# (topic, partition) -> end offset / start offset, as the consumer knows them now.
OffsetLookup = Callable[[str, int], int | None]


class ReadProgress:
    """Progress of both sides of every input partition of the join."""

    def __init__(self, frames_topic: str, results_topic: str, *, end_offset: OffsetLookup,
                 start_offset: OffsetLookup, generation: Callable[[], int], clock: Callable[[], int],
                 read_through: Callable[[str, int], ReadThrough | None] = lambda topic, number: None) -> None:
        self.topics = {frames_topic: 0, results_topic: 1}
        self.names = (frames_topic, results_topic)
        self._end_offset, self._start_offset, self._generation = end_offset, start_offset, generation
        self._read_through = read_through
        self._clock = clock
        self._sides: dict[tuple[int, int], SideProgress] = {}

    def generation(self) -> int:
        """The consumer group generation progress is kept for."""
        return self._generation()

    def side_of(self, topic: str) -> int:
        return self.topics[topic]

    def passed(self, topic: str, partition: int, offset: int) -> None:
        self.side(self.topics[topic], partition).passed(offset)

    def observe(self, topic: str, partition: int, run: bytes, event_ms: int) -> None:
        self.side(self.topics[topic], partition).observe(run, event_ms)

    def taken(self, side: int, partition: int, offset: int) -> None:
        self.side(side, partition).taken(offset)

    def side(self, side: int, partition: int) -> SideProgress:
        generation = self._generation()
        progress = self._sides.get((side, partition))
        if progress is None or progress.generation != generation:
            progress = self._sides[(side, partition)] = SideProgress(generation, self._clock())
        return progress

    def caught_up(self, side: int, partition: int) -> bool:
        topic, progress = self.names[side], self.side(side, partition)
        caught_up = progress.caught_up(self._end_offset(topic, partition), self._start_offset(topic, partition),
                                       self._read_through(topic, partition))
        if caught_up:
            progress.caught_up_ms = self._clock()
        return caught_up

    def all_taken(self, side: int, partition: int) -> bool:
        """Whether every record of the side's partition was taken for a batch, decided or held
        back: what the hold-back holds is in hand, not left to read, so one side's held records
        never make the other side wait on them as on a backlog."""
        topic, progress = self.names[side], self.side(side, partition)
        return progress.caught_up(self._end_offset(topic, partition), self._start_offset(topic, partition),
                                  self._read_through(topic, partition), taken=True)

    def behind(self, side: int, partition: int) -> bool:
        return not self.caught_up(side, partition) and self.side(side, partition).behind(self._clock())

    def ahead(self, partition: int, lead_ms: int) -> int | None:
        """The side of ``partition`` that has read more than ``lead_ms`` past the other in event
        time while the other is behind (a backlog to read): it should wait (None: neither). A
        side whose partner is caught up never waits, so a silent side can never stall the other,
        and live input, delayed or not, is read as it comes."""
        frames, results = self.side(0, partition), self.side(1, partition)
        frames_lead, results_lead = _lead_ms(frames, results), _lead_ms(results, frames)
        if frames_lead > lead_ms >= results_lead and self.behind(1, partition):
            return 0
        if results_lead > lead_ms >= frames_lead and self.behind(0, partition):
            return 1
        return None

    def forgotten_runs(self) -> int:
        return sum(progress.forgotten_runs for progress in self._sides.values())


def _lead_ms(ahead: SideProgress, behind: SideProgress) -> int:
    """How far ``ahead`` has read past ``behind`` in event time, over the camera runs both have read."""
    return max((latest - behind.event_ms[run] for run, latest in ahead.event_ms.items()
                if run in behind.event_ms), default=0)
