"""Topic names, their broker configs, creation, and the co-partitioning check (R9, R13, R6).

The app creates its topics itself (brokers run with auto-creation off) so that every topic has an
explicit partition count, retention in time and bytes, and one frame-size limit. Topics that feed
the join must agree on partition count: a frame and its result meet only if their common bucket
key lands on the same partition number on both topics. A worker checks this before it starts.
"""

from __future__ import annotations

import asyncio
import dataclasses

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streamapp.settings import Settings

# Room for the wire header and Kafka's own record overhead on top of the largest JPEG.
RECORD_OVERHEAD_BYTES = 64 * 1024
JOIN_TABLE = "join"
_UNKNOWN_TOPIC_OR_PARTITION = 3


class TopicError(RuntimeError):
    """Topics are missing, mismatched or could not be created."""


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
    """Faust names a table's changelog ``<app id>-<table>-changelog``."""
    return f"{settings.group_id}-{JOIN_TABLE}-changelog"


def changelog_config(settings: Settings) -> dict[str, str]:
    """Compacted so tombstones remove expired and joined entries; rolled often so the cleaner can
    reach them (it never compacts the active segment); deleted after an hour as a backstop, far
    beyond the longest an entry can live."""
    return {
        "cleanup.policy": "compact,delete",
        "retention.ms": str(3600 * 1000),
        "segment.ms": str(60 * 1000),
        "segment.bytes": str(max(64 * 1024**2, 2 * max_record_bytes(settings))),
        "min.cleanable.dirty.ratio": "0.1",
        "delete.retention.ms": str(60 * 1000),
        "max.message.bytes": str(max_record_bytes(settings)),
    }


def topic_specs(settings: Settings, *, with_changelog: bool = False) -> list[TopicSpec]:
    """The pipeline's topics; the join changelog only for the worker that owns the join table."""
    names = topic_names(settings)
    bounded = {
        "cleanup.policy": "delete",
        "retention.ms": str(int(settings.input_retention_s * 1000)),
        "retention.bytes": str(settings.input_retention_bytes),
        "segment.bytes": str(max(64 * 1024**2, 2 * max_record_bytes(settings))),
        "segment.ms": str(10 * 60 * 1000),
        "max.message.bytes": str(max_record_bytes(settings)),
    }
    count = settings.partitions
    specs = [
        TopicSpec(names["frames"], count, bounded, feeds_join=True),
        TopicSpec(names["scaled"], count, bounded),
        TopicSpec(names["detections"], count, bounded, feeds_join=True),
        TopicSpec(names["joined"], count, bounded),
        TopicSpec(names["deadletter"], 1, {**bounded, "retention.ms": str(7 * 24 * 3600 * 1000)}),
    ]
    if with_changelog:
        specs.append(TopicSpec(changelog_name(settings), count, changelog_config(settings), feeds_join=True))
    return specs


async def ensure_topics(settings: Settings, *, with_changelog: bool = False,
                        timeout_s: float = 30.0) -> list[str]:
    """Create missing topics, then check co-partitioning. Returns the names it created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers,
                                request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except Exception as exc:
        raise TopicError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from None
    try:
        specs = topic_specs(settings, with_changelog=with_changelog)
        existing = set(await admin.list_topics())
        missing = [spec for spec in specs if spec.name not in existing]
        for spec in missing:
            try:
                await admin.create_topics(
                    [NewTopic(spec.name, spec.partitions, settings.replication_factor,
                              topic_configs=spec.config)]
                )
            except TopicAlreadyExistsError:
                pass  # another worker created it between our listing and now
        counts = await partition_counts(admin, [spec.name for spec in specs if spec.feeds_join])
        check_copartitioned(counts)
        return [spec.name for spec in missing]
    finally:
        await admin.close()


async def partition_counts(admin: AIOKafkaAdminClient, names: list[str], *,
                           attempts: int = 20) -> dict[str, int]:
    """Partition count of each topic. A topic created a moment ago may not be in the metadata
    yet (UNKNOWN_TOPIC_OR_PARTITION), so that error is retried for a few seconds."""
    for attempt in range(attempts):
        described = await admin.describe_topics(names)
        errors = {topic["topic"]: topic["error_code"] for topic in described if topic.get("error_code")}
        if not errors:
            return {topic["topic"]: len(topic["partitions"]) for topic in described}
        if set(errors.values()) != {_UNKNOWN_TOPIC_OR_PARTITION} or attempt == attempts - 1:
            listing = ", ".join(f"{name} (error {code})" for name, code in sorted(errors.items()))
            raise TopicError(f"topics cannot be described: {listing}")
        await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


def check_copartitioned(counts: dict[str, int]) -> None:
    """Refuse a join whose inputs and changelog disagree on partition count (R9)."""
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{name}={count}" for name, count in sorted(counts.items()))
        raise TopicError(
            "topics that feed the join must have the same number of partitions, "
            f"or frames and results of one bucket land on different partitions: {listing}. "
            "Recreate the odd ones (or set STREAMAPP_PARTITIONS to match)."
        )
