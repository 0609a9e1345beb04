"""The topic plan: names, broker configs, disk shares, and the co-partitioning rule (R9, R13, R6).

Pure: creating and checking the topics on a broker is :mod:`streamapp.topicadmin`'s, so that the
stages and the worker's budget read the plan without the network layer.

The app creates its topics itself (brokers run with auto-creation off) so that every topic has an
explicit partition count, retention in time and bytes, and one frame-size limit. The bytes come
from one broker disk budget (:func:`disk_plan`): after a reserve for the broker's own topics, each
partition of every topic (the join's changelog included) gets an equal share, which holds its
active segment plus ``retention.bytes``. Kafka deletes whole closed segments once a partition is
over its retention, so a partition stays within retention plus the segment being written. Topics that feed
the join must agree on partition count: a frame and its result meet only if their common bucket
key lands on the same partition number on both topics. A worker checks this before it starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from streamapp.errors import StreamappError
from streamapp.settings import STAGES, Settings
from streamapp.units import format_bytes

# The stage sets the docs deploy the join in: all four stages in one worker, and one worker per
# stage. `streamapp topics create` makes their join changelogs unless told other stage sets.
DOCUMENTED_LAYOUTS: tuple[tuple[str, ...], ...] = (STAGES, ("join",))
# Room for the wire header and Kafka's own record overhead on top of the largest JPEG.
RECORD_OVERHEAD_BYTES = 64 * 1024
JOIN_TABLE = "join"
# The broker's own topics (consumer offsets, its metadata log) out of the broker disk budget.
BROKER_OWN_BYTES = 256 * 1024**2
# Segments roll at most this large, so retention drops the oldest data in small steps.
MAX_SEGMENT_BYTES = 64 * 1024**2


class TopicError(StreamappError, RuntimeError):
    """Topics are mismatched or could not be created."""


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]
    feeds_join: bool = False


def max_record_bytes(settings: Settings) -> int:
    return settings.max_frame_bytes + RECORD_OVERHEAD_BYTES


def topic_names(settings: Settings) -> dict[str, str]:
    prefix = settings.topic_prefix
    return {
        "frames": f"{prefix}frames",
        "scaled": f"{prefix}frames.scaled",
        "detections": f"{prefix}detections",
        "joined": f"{prefix}joined",
        "deadletter": f"{prefix}deadletter",
    }


def changelog_name(settings: Settings) -> str:
    """The join table's changelog of a worker of these settings' stages. Faust names a table's
    changelog ``<app id>-<table>-changelog``, and a worker's app id is its group id, one per stage
    set (Settings.group_id): a join run alone and a join run beside other stages have different
    changelogs."""
    return f"{settings.group_id}-{JOIN_TABLE}-changelog"


@dataclasses.dataclass(frozen=True)
class PlannedTopic:
    """One topic's share of the broker disk: every partition holds ``retention_bytes`` plus the
    segment being written."""

    name: str
    partitions: int
    retention_bytes: int
    segment_bytes: int

    @property
    def bytes_each(self) -> int:
        return self.retention_bytes + self.segment_bytes

    @property
    def total_bytes(self) -> int:
        return self.partitions * self.bytes_each


@dataclasses.dataclass(frozen=True)
class DiskPlan:
    budget_bytes: int
    topics: tuple[PlannedTopic, ...]
    broker_own_bytes: int = BROKER_OWN_BYTES

    @property
    def total_bytes(self) -> int:
        return self.broker_own_bytes + sum(topic.total_bytes for topic in self.topics)

    def topic(self, name: str) -> PlannedTopic:
        return next(topic for topic in self.topics if topic.name == name)

    def describe(self) -> str:
        """The plan as a table: topic, partitions, bytes each, total."""
        rows = [("topic", "partitions", "bytes each", "total")]
        rows += [(topic.name, str(topic.partitions), format_bytes(topic.bytes_each), format_bytes(topic.total_bytes))
                 for topic in self.topics]
        rows.append(("(broker's own topics)", "", "", format_bytes(self.broker_own_bytes)))
        rows.append(("total", "", "", f"{format_bytes(self.total_bytes)} of {format_bytes(self.budget_bytes)}"))
        widths = [max(len(row[column]) for row in rows) for column in range(4)]
        return "\n".join("  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                                   for column, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
                         for row in rows)


def _partition_counts(settings: Settings) -> dict[str, int]:
    names = topic_names(settings)
    counts = {names[kind]: settings.partitions for kind in ("frames", "scaled", "detections", "joined")}
    counts[names["deadletter"]] = 1
    counts[changelog_name(settings)] = settings.partitions
    return counts


def disk_plan(settings: Settings) -> DiskPlan:
    """Split ``STREAMAPP_BROKER_DISK_BUDGET`` over every partition; refuse a budget too small for
    each partition to keep one closed segment beside the one being written."""
    counts = _partition_counts(settings)
    partitions = sum(counts.values())
    share = max(0, settings.broker_disk_budget_bytes - BROKER_OWN_BYTES) // partitions
    # A segment holds at least two of the largest records, or the broker rolls one per record.
    smallest_segment = 2 * max_record_bytes(settings)
    segment = max(smallest_segment, min(MAX_SEGMENT_BYTES, share // 4))
    if share < 2 * segment:
        needed = BROKER_OWN_BYTES + partitions * 2 * smallest_segment
        raise TopicError(
            f"STREAMAPP_BROKER_DISK_BUDGET={format_bytes(settings.broker_disk_budget_bytes)} cannot hold "
            f"{partitions} partitions of 2 segments of {format_bytes(smallest_segment)} each plus "
            f"{format_bytes(BROKER_OWN_BYTES)} for the broker's own topics: it needs at least "
            f"{format_bytes(needed)}; raise it, or lower STREAMAPP_PARTITIONS or STREAMAPP_MAX_FRAME_BYTES")
    topics = tuple(PlannedTopic(name, count, share - segment, segment) for name, count in counts.items())
    return DiskPlan(settings.broker_disk_budget_bytes, topics)


def changelog_config(settings: Settings) -> dict[str, str]:
    """Compacted so tombstones remove expired and joined entries; rolled often so the cleaner can
    reach them (it never compacts the active segment); deleted after an hour, or past its share
    of the broker disk, as a backstop far beyond the longest an entry can live."""
    planned = disk_plan(settings).topic(changelog_name(settings))
    return {
        "cleanup.policy": "compact,delete",
        "retention.ms": str(3600 * 1000),
        "retention.bytes": str(planned.retention_bytes),
        "segment.ms": str(60 * 1000),
        "segment.bytes": str(planned.segment_bytes),
        "min.cleanable.dirty.ratio": "0.1",
        "delete.retention.ms": str(60 * 1000),
        "max.message.bytes": str(max_record_bytes(settings)),
    }


def topic_specs(settings: Settings, *, layouts: Iterable[tuple[str, ...]] = ()) -> list[TopicSpec]:
    """The pipeline's topics, and the join changelog of each stage set in ``layouts`` that runs
    the join: its name comes from the stage set's group id, so each stage set has its own."""
    names = topic_names(settings)
    plan = disk_plan(settings)

    def bounded(name: str, retention_ms: int) -> dict[str, str]:
        planned = plan.topic(name)
        return {
            "cleanup.policy": "delete",
            "retention.ms": str(retention_ms),
            "retention.bytes": str(planned.retention_bytes),
            "segment.bytes": str(planned.segment_bytes),
            "segment.ms": str(10 * 60 * 1000),
            "max.message.bytes": str(max_record_bytes(settings)),
        }

    retention_ms = settings.input_retention_ms
    specs = [TopicSpec(names[kind], settings.partitions, bounded(names[kind], retention_ms),
                       feeds_join=kind in ("frames", "detections"))
             for kind in ("frames", "scaled", "detections", "joined")]
    specs.append(TopicSpec(names["deadletter"], 1, bounded(names["deadletter"], 7 * 24 * 3600 * 1000)))
    changelogs = {changelog_name(layout): layout
                  for layout in (settings.replace(stages=stages) for stages in layouts) if "join" in layout.stages}
    specs += [TopicSpec(name, settings.partitions, changelog_config(layout), feeds_join=True)
              for name, layout in changelogs.items()]
    return specs


def check_copartitioned(counts: dict[str, int]) -> None:
    """Refuse a join whose inputs and changelog disagree on partition count (R9)."""
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{name}={count}" for name, count in sorted(counts.items()))
        raise TopicError(
            "topics that feed the join must have the same number of partitions, "
            f"or frames and results of one bucket land on different partitions: {listing}. "
            "Recreate the odd ones (or set STREAMAPP_PARTITIONS to match)."
        )
