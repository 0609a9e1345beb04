"""Replay: publish recordings to topics, paced, optionally through seeded scenario transforms.

A transform is a pure function from a record stream to a record stream (no Kafka, no clock), so
every scenario is reproducible from its recording, its transform specs and its seed, and the
outcome the join must produce can be predicted exactly (:func:`predict`). Transforms act on
streamapp records by their wire kind (frames ``F``, results ``D``); other records pass untouched.
Times are the records' timestamps in ms; the replayer spaces records by them.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import heapq
import itertools
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from streamapp import wire
from streamapp.agents.join import Joiner
from streamapp.connect import start_client
from streamapp.errors import StreamappError
from streamapp.recording import Record, Recording
from streamapp.settings import Settings
from streamapp.tables.entry import OTHER_SIDE, Entry, EntryKind
from streamapp.topics import max_record_bytes
from streamapp.units import UnitError, parse_duration

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
    return _side_value(record).id


def _side_value(record: Record) -> wire.Frame | wire.Detections:
    """The frame or result of a record on a side (:func:`side_of` is not None)."""
    decoded = wire.decode(record.value)
    if isinstance(decoded, wire.Joined):
        raise ReplayError(f"{record.topic} offset {record.offset}: a joined record is on neither side")
    return decoded


def _with_id(record: Record, new_id: wire.FrameId, bucket_size: int) -> Record:
    """The record of another frame id: its value, its key, and (left to the key partitioner, as
    for the original) its partition."""
    decoded = _side_value(record)
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
        return round(parse_duration(text, name=spec) * 1000)
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


# --- the expected outcome ---------------------------------------------------------------------


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
    joiner = Joiner(ttl_ms=round(settings.join_ttl_s * 1000), marker_ttl_ms=round(settings.done_marker_ttl_s * 1000))
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
        decoded = _side_value(record)
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


# --- publishing -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sent:
    """A record as published: where it went, its Kafka timestamp (its event time, moved to the
    replay), and when it was handed to the producer (ms since the Unix epoch)."""

    record: Record
    topic: str
    partition: int
    timestamp_ms: int
    sent_ms: int


@dataclasses.dataclass(frozen=True)
class ReplayTarget:
    """Where records go: ``rename`` maps recorded topics to target topics (others keep their
    name); ``recorded_partitions`` are the recorded topics' partition counts. A record keeps its
    recorded partition unless ``by_key`` or a transform re-keyed it (then Kafka's key partitioner
    places it, as it placed the original)."""

    rename: dict[str, str]
    recorded_partitions: dict[str, int]
    by_key: bool = False


async def publish(records: Iterable[Record], settings: Settings, target: ReplayTarget, *,
                  speed: float | None, on_sent: Callable[[Sent], None] | None = None) -> int:
    """Publish ``records`` at their recorded pace × ``speed`` (None: as fast as possible).

    Each record's Kafka timestamp is its event time moved by one shift, so that the first
    record happens now: the join sees the recorded event times, and retention counts from the
    replay, not from when they were recorded.
    """
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers,
                                max_request_size=max_record_bytes(settings),
                                max_batch_size=min(max_record_bytes(settings), 1024**2),
                                linger_ms=2, acks="all", enable_idempotence=True)
    await start_client(producer, settings.bootstrap_servers)
    try:
        counts = _PartitionCounts(producer, target)
        pace = _Pace(speed)
        sent = 0
        shift: int | None = None
        for record in records:
            topic = target.rename.get(record.topic, record.topic)
            partition = await counts.partition(record, topic)
            await pace.wait(record.timestamp_ms)
            sent_ms = int(time.time() * 1000)
            if shift is None:
                shift = sent_ms - record.event_time_ms
            timestamp_ms = max(0, record.event_time_ms + shift)
            future = await producer.send(topic, record.value, key=record.key, partition=partition,
                                         headers=list(record.headers), timestamp_ms=timestamp_ms)
            if on_sent is not None:
                future.add_done_callback(_reporter(record, timestamp_ms, sent_ms, on_sent))
            sent += 1
        await producer.flush()
        return sent
    finally:
        await producer.stop()


def _reporter(record: Record, timestamp_ms: int, sent_ms: int, on_sent: Callable[[Sent], None]):
    # The timestamp as sent: aiokafka reports the first record's for every record of a batch.
    def report(future) -> None:
        if not future.cancelled() and future.exception() is None:
            metadata = future.result()
            on_sent(Sent(record, metadata.topic, metadata.partition, timestamp_ms, sent_ms))
    return report


class _PartitionCounts:
    def __init__(self, producer: AIOKafkaProducer, target: ReplayTarget) -> None:
        self.producer, self.target = producer, target
        self.known: dict[str, int] = {}

    async def partition(self, record: Record, topic: str) -> int | None:
        if topic not in self.known:
            try:
                self.known[topic] = len(await self.producer.partitions_for(topic))
            except Exception as exc:  # aiokafka reports a missing topic in several ways
                raise ReplayError(f"cannot publish to topic {topic!r}: {exc!r}; does it exist?") from None
        if record.partition is None or self.target.by_key:
            return None
        recorded = self.target.recorded_partitions.get(record.topic)
        if recorded != self.known[topic]:
            raise ReplayError(
                f"{record.topic!r} was recorded with {recorded} partitions but {topic!r} has "
                f"{self.known[topic]}: records would not land as recorded. Partition by key instead "
                f"(--by-key), or replay into a topic with {recorded} partitions.")
        return record.partition


class _Pace:
    """Sends each record at its offset from the first, divided by the speed; never bursts ahead."""

    def __init__(self, speed: float | None) -> None:
        if speed is not None and not speed > 0:
            raise ReplayError(f"speed must be > 0, or None for as fast as possible; got {speed!r}")
        self.speed = speed
        self.origin: tuple[float, int] | None = None

    async def wait(self, timestamp_ms: int) -> None:
        if self.speed is None:
            return
        if self.origin is None:
            self.origin = (time.monotonic(), timestamp_ms)
        started, first = self.origin
        delay = started + (timestamp_ms - first) / 1000 / self.speed - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def open_recordings(paths: list) -> tuple[Records, dict[str, int]]:
    """The records of one or more recordings (interleaved by time) and their topics' partition
    counts; recordings that disagree on a topic's partition count cannot be replayed together."""
    recordings = [Recording(path) for path in paths]
    partitions: dict[str, int] = {}
    for recording in recordings:
        for topic, count in recording.header.topics.items():
            if partitions.setdefault(topic, count) != count:
                raise ReplayError(f"recordings disagree on the partitions of {topic!r}: "
                                  f"{partitions[topic]} and {count} ({recording.path})")
    records = iter(recordings[0]) if len(recordings) == 1 else interleave(recordings)
    return records, partitions


def epoch_offset_to_now(records: Iterable[Record]) -> int:
    """How far to move epochs so the first frame's epoch becomes now (see :class:`ShiftEpochs`)."""
    from streamapp.agents.source import new_epoch

    for record in records:
        if side_of(record) is not None:
            return new_epoch() - frame_id(record).epoch
    return 0
