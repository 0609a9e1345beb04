"""Creating the pipeline's topics on the broker and checking them (the plan is :mod:`streamapp.topics`).

A worker, ``streamapp topics create`` and the tools create the topics that are missing and verify
the rest: topics that exist are never changed, so a user who may not create topics (a managed
service's usual ACLs) can start once an admin has made them. What the broker refuses is named,
with the setting it comes from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
)

from streamapp.connect import diagnose, not_authorized, principal, quiet_logger
from streamapp.errors import ExitCode, StreamappError
from streamapp.kafkasecurity import client_options
from streamapp.settings import Settings
from streamapp.topics import TopicError, TopicSpec, check_copartitioned, topic_specs
from streamapp.units import milliseconds

# Kafka's error codes in the answers to CreateTopics and Metadata.
_UNKNOWN_TOPIC_OR_PARTITION = 3
_TOPIC_AUTHORIZATION_FAILED = 29
_CLUSTER_AUTHORIZATION_FAILED = 31
_TOPIC_ALREADY_EXISTS = 36
_INVALID_PARTITIONS = 37
_INVALID_REPLICATION_FACTOR = 38
_INVALID_CONFIG = 40
_POLICY_VIOLATION = 44
_REFUSED_AS_CONFIGURED = (_INVALID_PARTITIONS, _INVALID_REPLICATION_FACTOR, _INVALID_CONFIG, _POLICY_VIOLATION)
# The setting each topic config derives from, for a config a managed service refuses.
_CONFIG_SOURCES = {
    "max.message.bytes": "STREAMAPP_MAX_FRAME_BYTES",
    "retention.bytes": "STREAMAPP_BROKER_DISK_BUDGET",
    "segment.bytes": "STREAMAPP_BROKER_DISK_BUDGET",
    "retention.ms": "STREAMAPP_INPUT_RETENTION",
    "replication.factor": "STREAMAPP_REPLICATION_FACTOR",
    "partitions": "STREAMAPP_PARTITIONS",
}


class TopicsMissing(StreamappError, RuntimeError):
    """Topics are missing and this user may not create them (a managed service's usual ACLs)."""

    exit_code = ExitCode.TOPICS_MISSING

    def __init__(self, settings: Settings, names: list[str]) -> None:
        who = principal(settings)
        super().__init__(f"topics {', '.join(names)} are missing on {settings.bootstrap_servers} (or {who} may not "
                         f"DESCRIBE them), and {who} may not create them",
                         "an admin must create them with `streamapp topics create` and admin credentials "
                         "(docs/operations.md, Kafka ACLs)")


class ConfigRefused(StreamappError, RuntimeError):
    """The broker refused a topic's partitions, replication or config: named, with its setting."""

    exit_code = ExitCode.CONFIG_REFUSED


async def ensure_topics(settings: Settings, *, layouts: Iterable[tuple[str, ...]] = (), group: bool = False,
                        timeout_s: float = 30.0) -> list[str]:
    """Create missing topics (with the join changelogs of ``layouts``, :func:`topic_specs`), then
    check co-partitioning, and with ``group`` that this user may use the consumer group. Returns
    the names it created. Topics that exist are only verified, so a user who may not create topics
    (a managed service's usual ACLs) can start."""
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=milliseconds(timeout_s))
    try:
        with quiet_logger("aiokafka"):
            await asyncio.wait_for(admin.start(), timeout_s)
    except Exception:  # noqa: BLE001 - aiokafka raises several kinds for "nobody answers"
        await admin.close()
        raise await diagnose(settings) from None
    try:
        specs = topic_specs(settings, layouts=layouts)
        existing = set(await admin.list_topics())
        created = await create_topics(admin, settings, [spec for spec in specs if spec.name not in existing])
        counts = await partition_counts(admin, settings, [spec.name for spec in specs if spec.feeds_join])
        check_copartitioned(counts)
        if group:
            await check_group(admin, settings)
        return created
    finally:
        await admin.close()


async def create_topics(admin: AIOKafkaAdminClient, settings: Settings, specs: list[TopicSpec]) -> list[str]:
    """Create ``specs``; returns the names created (one another worker created meanwhile is not).
    What the broker refuses is raised: missing CREATE permission as :class:`TopicsMissing`, a
    refused config as :class:`ConfigRefused` naming the config and the setting it comes from."""
    if not specs:
        return []
    response = await admin.create_topics([NewTopic(spec.name, spec.partitions, settings.replication_factor,
                                                   topic_configs=spec.config) for spec in specs])
    errors = {}
    for topic, code, *message in response.topic_errors:
        if code not in (0, _TOPIC_ALREADY_EXISTS):
            errors[topic] = (code, message[0] if message else "")
    refused = {topic: text for topic, (code, text) in errors.items() if code in _REFUSED_AS_CONFIGURED}
    if refused:
        topic, text = sorted(refused.items())[0]
        raise config_refused(settings, topic, text or f"error {errors[topic][0]}")
    unauthorized = sorted(topic for topic, (code, _) in errors.items()
                          if code in (_TOPIC_AUTHORIZATION_FAILED, _CLUSTER_AUTHORIZATION_FAILED))
    if unauthorized:
        raise TopicsMissing(settings, unauthorized)
    if errors:
        listing = ", ".join(f"{topic} (error {code}: {text})" for topic, (code, text) in sorted(errors.items()))
        raise TopicError(f"the broker {settings.bootstrap_servers} did not create topics: {listing}")
    answered = {topic: code for topic, code, *_ in response.topic_errors}
    return [spec.name for spec in specs if answered.get(spec.name) == 0]


def config_refused(settings: Settings, topic: str, message: str) -> ConfigRefused:
    """The broker's refusal of ``topic``, naming the config (as its message does) and our setting."""
    named = [config for config in _CONFIG_SOURCES if config in message]
    sources = ", ".join(f"{config} comes from {_CONFIG_SOURCES[config]}" for config in named)
    what = f"the broker {settings.bootstrap_servers} refused topic {topic}'s " + (
        f"{', '.join(named)}: {message}" if named else f"settings: {message}")
    fix = (f"{sources}: set it within the service's limits, or have an admin create the topics beforehand"
           if named else "have an admin create the topics beforehand within the service's limits")
    return ConfigRefused(what, fix)


async def check_group(admin: AIOKafkaAdminClient, settings: Settings, *, attempts: int = 40) -> None:
    """Refuse to start, naming the group, when this user may not use its consumer group (finding
    the group's coordinator needs the group's DESCRIBE, which its READ grants). A broker that has
    no coordinator yet (its offsets topic is made on first use) is asked again for a few seconds,
    then left to the consumer, which waits for one itself."""
    for _ in range(attempts):
        try:
            await admin.find_coordinator(settings.group_id)
            return
        except GroupAuthorizationFailedError:
            raise not_authorized(settings, "READ", f"consumer group {settings.group_id}") from None
        except (GroupCoordinatorNotAvailableError, CoordinatorLoadInProgressError):
            await asyncio.sleep(0.25)


async def partition_counts(admin: AIOKafkaAdminClient, settings: Settings, names: list[str], *,
                           attempts: int = 60) -> dict[str, int]:
    """Partition count of each topic. A topic created a moment ago may not be in the metadata
    yet (UNKNOWN_TOPIC_OR_PARTITION), so that error is retried for up to 15 s: a busy broker has
    taken more than 5 s to show several workers' new topics."""
    for attempt in range(attempts):
        described = await admin.describe_topics(names)
        errors = {topic["topic"]: topic["error_code"] for topic in described if topic.get("error_code")}
        if not errors:
            return {topic["topic"]: len(topic["partitions"]) for topic in described}
        unauthorized = sorted(name for name, code in errors.items() if code == _TOPIC_AUTHORIZATION_FAILED)
        if unauthorized:
            raise not_authorized(settings, "DESCRIBE", f"topic {', '.join(unauthorized)}")
        if set(errors.values()) != {_UNKNOWN_TOPIC_OR_PARTITION} or attempt == attempts - 1:
            listing = ", ".join(f"{name} (error {code})" for name, code in sorted(errors.items()))
            raise TopicError(f"topics cannot be described: {listing}")
        await asyncio.sleep(0.25)
    raise AssertionError("unreachable")
