"""Input that the broker's retention deleted before this worker read it: counted, never silent.

When a worker is down or behind long enough, ``retention.bytes`` / ``retention.ms`` delete the
records it was still to read. Its next fetch then lies below the partition's log start offset,
and the Kafka client moves it to the log start (``auto_offset_reset=earliest``) without a word:
the records in between are never read, and nothing downstream can tell a frame that was never
produced from one that was deleted unread.

What was skipped shows as a gap in the offsets the worker reads: the next record it gets is past
the one after the last it read (or past its committed offset, right after an assignment). A gap
also comes from transaction markers, so each one is judged by the partition's log start offset,
asked for once a second for every partition with gaps: the offsets of a gap below the log start
were deleted, the others exist and were skipped for another reason. The log start asked for after
the gap is at least the one the client moved to, so the count is exact; a marker deleted between
the gap and the question is counted as a deleted offset.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping

from faust.types import TP

from streamapp.samples import sample_name

METRIC = "kafka_consumer_deleted_unread_records_total"


@dataclasses.dataclass(frozen=True)
class DeletedUnread:
    """Offsets ``first`` to ``last`` of ``tp`` that retention deleted before they were read."""

    tp: TP
    first: int
    last: int

    @property
    def records(self) -> int:
        return self.last - self.first + 1

    def warning(self) -> str:
        return (f"{self.records} records of {self.tp.topic} partition {self.tp.partition} (offsets {self.first}"
                f"-{self.last}) were deleted by the broker's retention before this worker read them, and are lost "
                f"— raise the topic's retention (STREAMAPP_BROKER_DISK_BUDGET, STREAMAPP_INPUT_RETENTION; the "
                f"broker's disk) so that it outlasts the longest this stage is down or behind")


class UnreadGaps:
    """Gaps in the offsets read, waiting to be judged against their partition's log start, and
    the count of deleted offsets found so far per partition.

    Gaps are few (a deletion, or a transaction marker per commit under exactly-once) and are
    judged every second, so the waiting list holds at most about a second's worth of them."""

    def __init__(self) -> None:
        self._gaps: dict[TP, list[tuple[int, int]]] = {}
        self.counts: Counter[TP] = Counter()

    def add(self, tp: TP, first_missing: int, next_read: int) -> None:
        """Offsets ``first_missing`` up to (not including) ``next_read`` of ``tp`` were not read."""
        if next_read > first_missing:
            self._gaps.setdefault(tp, []).append((first_missing, next_read))

    @property
    def waiting(self) -> list[TP]:
        return list(self._gaps)

    def judge(self, log_starts: Mapping[TP, int]) -> list[DeletedUnread]:
        """Count the deleted part of every waiting gap of the partitions in ``log_starts``
        (their log start offsets, asked for after the gaps were seen); returns what was deleted."""
        deleted = []
        for tp, log_start in log_starts.items():
            for first_missing, next_read in self._gaps.pop(tp, ()):
                end = min(next_read, log_start)
                if end > first_missing:
                    deleted.append(DeletedUnread(tp, first_missing, end - 1))
                    self.counts[tp] += end - first_missing
        return deleted

    def as_metrics(self, partitions: Iterable[TP]) -> dict[str, float]:
        """The count of every partition in ``partitions`` (0 if none) and of every one counted before."""
        return {sample_name(METRIC, topic=tp.topic, partition=tp.partition): self.counts[tp]
                for tp in sorted({*partitions, *self.counts})}
