"""Scenario transforms: what a replay does to a recording's records before it publishes them.

A transform is a pure function from a record stream to a record stream (no Kafka, no clock), so
every scenario is reproducible from its recording, its transform specs and its seed, and the
outcome the join must produce can be predicted exactly (streamapp.tools.replay.predict). Transforms act on
streamapp records by their wire kind (frames ``F``, results ``D``); other records pass untouched.
Times are the records' timestamps in ms; the replayer spaces records by them.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import random
import re
from collections.abc import Callable, Iterable, Iterator

from streamapp import wire
from streamapp.errors import StreamappError
from streamapp.tools.replay.format import Record
from streamapp.units import UnitError, milliseconds, parse_duration

SIDES = ("frames", "results", "both")
_SIDE_OF_TYPE = {wire.Frame: "frames", wire.Detections: "results"}
Records = Iterator[Record]


class ReplayError(StreamappError, ValueError):
    """A replay that cannot run as asked: a bad transform spec, mismatched topics, ..."""


def side_of(record: Record) -> str | None:
    """``"frames"``, ``"results"``, or None for anything else. A malformed frame or result is
    "anything else": transforms pass it untouched, and the join dead-letters it as it would live."""
    try:
        decoded = wire.decode(record.value)
    except wire.WireError:
        return None
    return _SIDE_OF_TYPE.get(type(decoded))


def _on(side: str, record: Record) -> bool:
    found = side_of(record)
    return found is not None and side in (found, "both")


def frame_id(record: Record) -> wire.FrameId:
    return side_value(record).id


def side_value(record: Record) -> wire.Frame | wire.Detections:
    """The frame or result of a record on a side (:func:`side_of` is not None)."""
    decoded = wire.decode(record.value)
    if isinstance(decoded, wire.Joined):
        raise ReplayError(f"{record.topic} offset {record.offset}: a joined record is on neither side")
    return decoded


def _with_id(record: Record, new_id: wire.FrameId, bucket_size: int) -> Record:
    """The record of another frame id: its value, its key, and (left to the key partitioner, as
    for the original) its partition."""
    decoded = side_value(record)
    value = (wire.encode_frame(dataclasses.replace(decoded, id=new_id)) if isinstance(decoded, wire.Frame)
             else wire.encode_detections(dataclasses.replace(decoded, id=new_id)))
    return dataclasses.replace(record, value=value, key=new_id.bucket_key(bucket_size), partition=None)


# --- transforms -------------------------------------------------------------------------------


@dataclasses.dataclass
class Reorder:
    """Shuffles records so that none moves more than ``window`` places; times stay in place."""

    window: int
    rng: random.Random

    def __call__(self, records: Records) -> Records:
        heap: list[tuple[float, int, Record]] = []
        times: collections.deque[int] = collections.deque()
        for position, record in enumerate(records):
            # A record sorts at position + u, u in [0, window]: only the next ``window`` records
            # can overtake it, and it can overtake at most ``window`` earlier ones.
            heapq.heappush(heap, (position + self.rng.uniform(0, self.window), position, record))
            times.append(record.timestamp_ms)
            while heap and heap[0][0] <= position:
                yield dataclasses.replace(heapq.heappop(heap)[2], timestamp_ms=times.popleft())
        while heap:
            yield dataclasses.replace(heapq.heappop(heap)[2], timestamp_ms=times.popleft())


@dataclasses.dataclass
class Drop:
    """Loses each record of ``side`` with probability ``fraction``."""

    side: str
    fraction: float
    rng: random.Random

    def __call__(self, records: Records) -> Records:
        for record in records:
            if not (_on(self.side, record) and self.rng.random() < self.fraction):
                yield record


@dataclasses.dataclass
class Duplicate:
    """Sends each record of ``side`` twice with probability ``fraction`` (as a producer retry does)."""

    side: str
    fraction: float
    rng: random.Random

    def __call__(self, records: Records) -> Records:
        for record in records:
            yield record
            if _on(self.side, record) and self.rng.random() < self.fraction:
                yield record


@dataclasses.dataclass
class Delay:
    """Every record of ``side`` comes ``delay_ms`` later; the output stays in time order."""

    side: str
    delay_ms: int

    def __call__(self, records: Records) -> Records:
        held: collections.deque[Record] = collections.deque()
        for record in records:
            while held and held[0].timestamp_ms <= record.timestamp_ms:
                yield held.popleft()
            if _on(self.side, record):
                held.append(dataclasses.replace(record, timestamp_ms=record.timestamp_ms + self.delay_ms))
            else:
                yield record
        yield from held


@dataclasses.dataclass
class Stall:
    """``side`` sends nothing for ``duration_ms`` from ``at_ms`` after the first record, then
    resumes with what is current: like a live source, it never sends what it skipped."""

    side: str
    at_ms: int
    duration_ms: int

    def __call__(self, records: Records) -> Records:
        start = None
        for record in records:
            start = record.timestamp_ms if start is None else start
            elapsed = record.timestamp_ms - start
            if not (_on(self.side, record) and self.at_ms <= elapsed < self.at_ms + self.duration_ms):
                yield record


@dataclasses.dataclass
class Restart:
    """Every stream's source restarts at frame ``at_index``: from there on its frames and results
    belong to a new epoch (the old one plus ``at_index``, epochs being start times in ms) and
    count from 0 again."""

    at_index: int
    bucket_size: int

    def __call__(self, records: Records) -> Records:
        for record in records:
            if side_of(record) is None or (old := frame_id(record)).index < self.at_index:
                yield record
                continue
            new_id = wire.FrameId(old.stream, old.epoch + self.at_index, old.index - self.at_index)
            yield _with_id(record, new_id, self.bucket_size)


@dataclasses.dataclass
class Skew:
    """Sets each camera's clock off by a random amount within ±``max_ms``: its frames' capture
    timestamps (``ts_ms``) and the event time of its frames and results move together."""

    max_ms: int
    rng: random.Random

    def __call__(self, records: Records) -> Records:
        offsets: dict[str, int] = {}
        for record in records:
            side = side_of(record)
            if side is None:
                yield record
                continue
            stream = frame_id(record).stream
            offset = offsets.setdefault(stream, self.rng.randint(-self.max_ms, self.max_ms))
            moved = dataclasses.replace(record, event_ms=record.event_time_ms + offset)
            if side == "frames":
                frame = wire.decode_frame(record.value)
                moved = dataclasses.replace(moved, value=wire.encode_frame(
                    dataclasses.replace(frame, timestamp_ms=frame.timestamp_ms + offset)))
            yield moved


@dataclasses.dataclass
class ShiftEpochs:
    """Adds ``offset`` to every epoch: the same recording replayed again is a new set of runs."""

    offset: int
    bucket_size: int

    def __call__(self, records: Records) -> Records:
        for record in records:
            if side_of(record) is None:
                yield record
                continue
            old = frame_id(record)
            yield _with_id(record, wire.FrameId(old.stream, old.epoch + self.offset, old.index), self.bucket_size)


Transform = Callable[[Records], Records]

SPEC_HELP = """\
reorder:N                 shuffle within ±N messages
drop:SIDE:FRACTION        lose a fraction of one side (SIDE: frames, results or both)
duplicate:SIDE:FRACTION   send a fraction of one side twice
delay:SIDE:DURATION       one side later by DURATION (e.g. 1s, 500ms)
stall:SIDE:AT:DURATION    one side silent for DURATION from AT after the start
restart:INDEX             every source restarts at frame INDEX (new epoch, index from 0)
skew:DURATION             each camera's clock off by up to ±DURATION"""


def parse_transform(spec: str, *, seed: int, position: int, bucket_size: int) -> Transform:
    """A transform from its spec (see :data:`SPEC_HELP`); each gets its own seeded generator."""
    name, *args = spec.strip().split(":")
    rng = random.Random(f"{seed}:{position}:{name}")
    parsers: dict[str, tuple[int, Callable[..., Transform]]] = {
        "reorder": (1, lambda n: Reorder(_count(n, spec), rng)),
        "drop": (2, lambda side, p: Drop(_side(side, spec), _fraction(p, spec), rng)),
        "duplicate": (2, lambda side, p: Duplicate(_side(side, spec), _fraction(p, spec), rng)),
        "delay": (2, lambda side, d: Delay(_side(side, spec), _ms(d, spec))),
        "stall": (3, lambda side, at, d: Stall(_side(side, spec), _ms(at, spec), _ms(d, spec))),
        "restart": (1, lambda n: Restart(_count(n, spec), bucket_size)),
        "skew": (1, lambda d: Skew(_ms(d, spec), rng)),
    }
    if name not in parsers:
        raise ReplayError(f"unknown transform {spec!r}; choose from:\n{SPEC_HELP}")
    arity, build = parsers[name]
    if len(args) != arity:
        raise ReplayError(f"transform {spec!r} takes {arity} argument(s); see:\n{SPEC_HELP}")
    return build(*args)


def _count(text: str, spec: str) -> int:
    if not re.fullmatch(r"\d+", text) or int(text) < 1:
        raise ReplayError(f"{spec!r}: {text!r} is not a whole number >= 1")
    return int(text)


def _side(text: str, spec: str) -> str:
    if text not in SIDES:
        raise ReplayError(f"{spec!r}: side must be one of {', '.join(SIDES)}, got {text!r}")
    return text


def _fraction(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ReplayError(f"{spec!r}: fraction must be a number within 0..1, got {text!r}")
    return value


def _ms(text: str, spec: str) -> int:
    try:
        return milliseconds(parse_duration(text, name=spec))
    except UnitError as exc:
        raise ReplayError(str(exc)) from None


def apply(records: Iterable[Record], transforms: Iterable[Transform]) -> Records:
    # Transforms move when a record is sent; its event time stays what was recorded.
    stream: Records = (dataclasses.replace(record, event_ms=record.event_time_ms) for record in records)
    for transform in transforms:
        stream = transform(stream)
    return stream


def interleave(sources: Iterable[Iterable[Record]]) -> Records:
    """Several recordings as one, merged by time, each shifted to start when the first starts."""
    heads = []
    for source in sources:
        iterator = iter(source)
        first = next(iterator, None)
        if first is not None:
            heads.append((first, iterator))
    if not heads:
        return iter(())
    start = heads[0][0].timestamp_ms

    def rebased(first: Record, rest: Records) -> Records:
        shift = start - first.timestamp_ms
        for record in itertools.chain((first,), rest):
            yield dataclasses.replace(record, timestamp_ms=record.timestamp_ms + shift,
                                      event_ms=record.event_time_ms + shift)

    return heapq.merge(*(rebased(first, rest) for first, rest in heads), key=lambda r: r.timestamp_ms)
