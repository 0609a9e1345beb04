"""The memory plan of one worker (R5): ``STREAMAPP_MEMORY_BUDGET`` split into a byte limit for every
buffer a record passes through. Every share is set here, and only here; docs/operations.md
("Memory budget") has them as one table.

Faust sizes its buffers in message counts, and a count means nothing when one message is 30 KB
and the next is 3 MB, so each buffer gets a share of the budget in bytes:

* RocksDB (join): one block cache that the memtables are charged to (tables/memory.py);
* stream buffers: the queue in front of each stage's agent, and the join's changelog queue, which
  holds records while the join recovers (streamapp.kafka.buffers); Faust pauses a partition on
  their bytes, not on counts;
* consumer fetches: bytes asked per partition per fetch; Kafka returns one whole record past the
  limit, so frames up to the frame limit always arrive;
* producer batches: aiokafka keeps one batch being filled and one in flight per partition it
  writes to;
* the send buffer: records waiting in Faust's producer buffer (streamapp.kafka.producer);
* the join's batches: the one it is deciding, the one whose outputs are on their way (under
  exactly-once they share it with the changes of the open transactions), and the records it holds
  back for their partners;
* the recovery buffer (join): changelog records Faust reads before it applies them, a count to
  Faust, sized here by the largest record, at least :data:`MIN_RECOVERY_RECORDS`;
* the decoded frame of a pixel stage (resize, infer, sink): 6 bytes a pixel of the frame pixel
  limit; a JPEG whose header says it would take more is refused before it is decoded;
* the sink's preview: ``STREAMAPP_PREVIEW_BYTES`` of annotated frames;
* the producer's memo of key hashes.

A byte limit here is checked before a record is added, so a buffer holds at most its limit plus
the one record that crosses it, and a share is the limits plus those records. Where one record is
more than its share (large frames, many partitions, a small budget) the buffer still takes that
record; if the plan then adds up to more than :data:`PLANNED` of the budget, the worker refuses to
start, naming the smallest budget that fits. The rest, at least :data:`HEADROOM`, is for what no
limit bounds: Python's objects, libraries' arenas, fragmentation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from fractions import Fraction

from streamapp.errors import UsageError
from streamapp.jpeg import DECODE_BYTES_PER_PIXEL
from streamapp.units import format_bytes

# What the plan leaves unplanned: at least a tenth of the budget.
HEADROOM = Fraction(1, 10)
PLANNED = 1 - HEADROOM
# Shares of the budget.
ROCKSDB_SHARE = Fraction(1, 4)
STREAM_BUFFERS_SHARE = Fraction(1, 8)
FETCHES_SHARE = Fraction(1, 8)
PRODUCER_BATCHES_SHARE = Fraction(1, 32)
SEND_BUFFER_SHARE = Fraction(1, 32)
JOIN_BATCHES_SHARE = Fraction(1, 8)  # three batches of a 24th each
RECOVERY_SHARE = Fraction(1, 32)
DECODED_FRAME_SHARE = Fraction(1, 16)
# Faust reads on in a table's changelog after its recovery when the table's recovery buffer is one
# record (faust.tables.recovery): the join would fetch its own writes and apply them to its store
# again, bringing back entries it had decided, and the fetcher would hold back its inputs.
MIN_RECOVERY_RECORDS = 2
# Bytes of keys the producer's partitioner remembers the hashes of.
KEY_HASH_MEMO_BYTES = 64 * 1024

# The join holds three batches: one being decided, one whose outputs are on their way, and the
# records held back for their partners.
JOIN_BATCHES = 3
PIXEL_STAGES = frozenset({"resize", "infer", "sink"})
# Topics each stage reads and writes, dead letters aside (one partition, written by every stage).
_READS = {"resize": {"frames"}, "infer": {"scaled"}, "join": {"frames", "detections", "changelog"}, "sink": {"joined"}}
_WRITES = {"resize": {"scaled"}, "infer": {"detections"}, "join": {"joined", "changelog"}, "sink": set()}
_MIN_LIMIT_BYTES = 64 * 1024
_MIN_BATCH_BYTES = 16 * 1024
# A producer batch larger than a topic's max.message.bytes is refused whole by the broker, after the send.
_MAX_BATCH_BYTES = 1024**2
_MIB = 1024**2


def _share(budget_bytes: int, fraction: Fraction) -> int:
    return budget_bytes * fraction.numerator // fraction.denominator


def decoded_frame_pixels(budget_bytes: int) -> int:
    """Pixels of the largest frame whose decoding fits the decoded frame's share of the budget."""
    return _share(budget_bytes, DECODED_FRAME_SHARE) // DECODE_BYTES_PER_PIXEL


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Byte limits of every buffer of one worker, and what each share of its budget adds up to."""

    budget_bytes: int
    record_bytes: int             # the largest record: a frame at the frame limit, with its headers
    rocksdb_bytes: int
    stream_buffers: int           # each stage's input queue, and the join's changelog queue
    stream_buffer_bytes: int      # limit of each
    fetched_partitions: int
    fetch_bytes_per_partition: int
    produced_partitions: int
    producer_batch_bytes: int
    send_buffer_bytes: int
    batch_bytes: int              # limit of each of the join's batches
    recovery_records: int         # the join's recovery buffer, in records (Faust counts them)
    decoded_frame_bytes: int
    preview_bytes: int
    key_hash_memo_bytes: int

    @classmethod
    def of(cls, *, budget_bytes: int, record_bytes: int, partitions: int, stages: tuple[str, ...],
           max_frame_pixels: int = 0, preview_bytes: int = 0) -> MemoryPlan:
        """The plan of a worker running ``stages``; a :class:`UsageError` naming the smallest budget
        that fits when its shares add up to more than :data:`PLANNED` of ``budget_bytes``."""
        split = functools.partial(cls._split, record_bytes=record_bytes, partitions=partitions, stages=stages,
                                  max_frame_pixels=max_frame_pixels, preview_bytes=preview_bytes)
        plan = split(budget_bytes)
        if not plan.fits(max_frame_pixels):
            smallest = _smallest_budget(lambda budget: split(budget).fits(max_frame_pixels), budget_bytes)
            lower = ["STREAMAPP_MAX_FRAME_BYTES", "STREAMAPP_PARTITIONS"] + (
                ["STREAMAPP_PREVIEW_BYTES"] if plan.preview_bytes else [])
            raise UsageError(
                f"STREAMAPP_MEMORY_BUDGET={format_bytes(budget_bytes)} is too small for stages {','.join(stages)} "
                f"with {partitions} partitions and records up to {format_bytes(record_bytes)}: their buffers "
                f"need {format_bytes(plan.planned_bytes)}, over {float(PLANNED):.0%} of it",
                f"give it at least {smallest // _MIB}MiB, or lower {', '.join(lower[:-1])} or {lower[-1]}")
        return plan

    @classmethod
    def _split(cls, budget: int, *, record_bytes: int, partitions: int, stages: tuple[str, ...],
               max_frame_pixels: int, preview_bytes: int) -> MemoryPlan:
        record = record_bytes  # every buffer must take one
        join = "join" in stages
        queues = len(stages) + join
        fetched = partitions * len(set().union(*(_READS[stage] for stage in stages)))
        produced = partitions * len(set().union(*(_WRITES[stage] for stage in stages))) + 1
        pixels = max_frame_pixels or decoded_frame_pixels(budget)
        return cls(
            budget_bytes=budget,
            record_bytes=record,
            rocksdb_bytes=_share(budget, ROCKSDB_SHARE) if join else 0,
            stream_buffers=queues,
            stream_buffer_bytes=_limit(_share(budget, STREAM_BUFFERS_SHARE) // queues, record),
            fetched_partitions=fetched,
            # One record is set aside: Kafka returns one whole record past the fetch limit.
            fetch_bytes_per_partition=min(record, max(_MIN_LIMIT_BYTES,
                                                      (_share(budget, FETCHES_SHARE) - record) // fetched)),
            produced_partitions=produced,
            producer_batch_bytes=min(record, _MAX_BATCH_BYTES,
                                     max(_MIN_BATCH_BYTES, _share(budget, PRODUCER_BATCHES_SHARE) // (2 * produced))),
            send_buffer_bytes=_limit(_share(budget, SEND_BUFFER_SHARE), record),
            batch_bytes=_limit(_share(budget, JOIN_BATCHES_SHARE) // JOIN_BATCHES, record) if join else 0,
            recovery_records=max(MIN_RECOVERY_RECORDS, _share(budget, RECOVERY_SHARE) // record) if join else 0,
            decoded_frame_bytes=DECODE_BYTES_PER_PIXEL * pixels if PIXEL_STAGES & set(stages) else 0,
            preview_bytes=preview_bytes if "sink" in stages else 0,
            key_hash_memo_bytes=KEY_HASH_MEMO_BYTES,
        )

    def shares(self) -> dict[str, int]:
        """Bytes each share comes to with every buffer full: its limits plus the one record each
        limit lets past."""
        record = self.record_bytes
        return {
            "RocksDB block cache and write buffers": self.rocksdb_bytes,
            "stream buffers": self.stream_buffers * (self.stream_buffer_bytes + record),
            "consumer fetches": self.fetched_partitions * self.fetch_bytes_per_partition + record,
            "producer batches": 2 * self.produced_partitions * self.producer_batch_bytes,
            "send buffer": self.send_buffer_bytes + record,
            "join batches": JOIN_BATCHES * (self.batch_bytes + record) if self.batch_bytes else 0,
            "recovery buffer": self.recovery_records * record,
            "decoded frame": self.decoded_frame_bytes,
            "preview": self.preview_bytes,
            "key hash memo": self.key_hash_memo_bytes,
        }

    @property
    def planned_bytes(self) -> int:
        return sum(self.shares().values())

    def fits(self, max_frame_pixels: int = 0) -> bool:
        return (self.planned_bytes <= _share(self.budget_bytes, PLANNED)
                and max_frame_pixels <= decoded_frame_pixels(self.budget_bytes))

    def as_metrics(self) -> dict[str, float]:
        limits = ("budget_bytes", "rocksdb_bytes", "stream_buffer_bytes", "fetch_bytes_per_partition",
                  "producer_batch_bytes", "send_buffer_bytes", "batch_bytes", "recovery_records",
                  "decoded_frame_bytes", "planned_bytes")
        return {f"budget_{name}": getattr(self, name) for name in limits}


def _limit(room: int, record: int) -> int:
    """A byte limit whose buffer, with the one record that crosses it, stays within ``room``; at
    least half of it, or with large records the buffer would hold a record or two at a time (the
    plan then adds up to more than the share)."""
    return max(_MIN_LIMIT_BYTES, room - record, room // 2)


def _smallest_budget(fits: Callable[[int], bool], budget: int) -> int:
    """A budget in whole MiB above ``budget`` that ``fits``: the smallest, found by bisection."""
    low, high = budget // _MIB, max(1, budget // _MIB)
    while not fits(high * _MIB):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle * _MIB) else (middle, high)
    return high * _MIB
