"""The ACLs of the pipeline's Kafka user, in one place: :func:`pipeline_acls`.

A worker reads and writes its stage's topics, commits offsets in its consumer group and, under
exactly-once, runs transactions; it creates no topic (an admin runs ``streamapp topics create``).
Faust's leader topic is off (``topic_disable_leader``), so the join's changelog is the only topic
Faust adds. Group ids, the changelog and Faust's transactional ids all start with
``<topic prefix><app id>-``, so those ACLs are prefixed by it.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Any

from streamapp.settings import STAGES, Settings
from streamapp.tools.localkafka.common import BrokerError
from streamapp.tools.localkafka.processes import run_async
from streamapp.tools.localkafka.security import ADMIN, PIPELINE, BrokerSecurity
from streamapp.topics import topic_names

# `streamapp produce`, which writes the frames the stages read.
PRODUCE = "produce"
_ALLOW = 3  # Kafka's AclPermissionType.ALLOW
_ANY_HOST = "*"


class ResourceType(enum.IntEnum):  # Kafka's numbering (org.apache.kafka.common.resource.ResourceType)
    TOPIC = 2
    GROUP = 3
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):  # READ and WRITE each imply DESCRIBE
    READ = 3
    WRITE = 4


@dataclasses.dataclass(frozen=True)
class Acl:
    """Allow ``operation`` on the ``resource`` named (or prefixed) ``name``, from any host;
    ``needed_by``: the stages (or ``produce``) that need it."""

    resource: ResourceType
    name: str
    pattern: PatternType
    operation: Operation
    needed_by: tuple[str, ...]

    def describe(self) -> str:
        name = f"{self.name}*" if self.pattern is PatternType.PREFIXED else self.name
        return f"{self.operation.name} on {self.resource.name} {name} ({', '.join(self.needed_by)})"


def pipeline_acls(settings: Settings) -> list[Acl]:
    """Every ACL the pipeline's user needs, and no other."""
    names = topic_names(settings)
    app_prefix = f"{settings.topic_prefix}{settings.app_id}-"

    def topic(kind: str, operation: Operation, *needed_by: str) -> Acl:
        return Acl(ResourceType.TOPIC, names[kind], PatternType.LITERAL, operation, needed_by)

    def prefixed(resource: ResourceType, operation: Operation, *needed_by: str) -> Acl:
        return Acl(resource, app_prefix, PatternType.PREFIXED, operation, needed_by)

    acls = [
        topic("frames", Operation.WRITE, PRODUCE),
        topic("frames", Operation.READ, "resize", "join"),
        topic("scaled", Operation.WRITE, "resize"),
        topic("scaled", Operation.READ, "infer"),
        topic("detections", Operation.WRITE, "infer"),
        topic("detections", Operation.READ, "join"),
        topic("joined", Operation.WRITE, "join"),
        topic("joined", Operation.READ, "sink"),
        topic("deadletter", Operation.WRITE, *STAGES),
        # The join table's changelog, <group id>-join-changelog: written by the join, read back on recovery.
        prefixed(ResourceType.TOPIC, Operation.WRITE, "join"),
        prefixed(ResourceType.TOPIC, Operation.READ, "join"),
        # Each worker's consumer group (Settings.group_id): join, fetch and commit offsets.
        prefixed(ResourceType.GROUP, Operation.READ, *STAGES),
    ]
    if settings.processing_guarantee == "exactly_once":
        # A stage names its transactions <group id>-<stage>-<partition> (streamapp.kafka.transactions).
        acls.append(prefixed(ResourceType.TRANSACTIONAL_ID, Operation.WRITE, *STAGES))
    return acls


async def create_acls(bootstrap: str, principal: str, acls: Iterable[Acl], client_options: dict[str, Any]) -> None:
    """Add ``acls`` for ``principal`` (``User:NAME``) through the admin API, as the client that
    ``client_options`` authenticate (a super user). Adding an ACL that exists changes nothing."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.admin import CreateAclsRequest

    client = AIOKafkaClient(bootstrap_servers=bootstrap, **client_options)
    await client.bootstrap()
    try:
        node = client.get_random_node()
        for acl in acls:
            response = await client.send(node, CreateAclsRequest(
                acl.resource, acl.name, acl.pattern, principal, _ANY_HOST, acl.operation, _ALLOW))
            for error_code, error_message in response.creation_responses:
                if error_code:
                    raise BrokerError(f"the broker refused the ACL {acl.describe()} for {principal}: "
                                      f"error {error_code} {error_message or ''}".rstrip())
    finally:
        await client.close()


def add_pipeline_acls(bootstrap: str, security: BrokerSecurity) -> None:
    """Grant the ``pipeline`` user :func:`pipeline_acls` of ``security.acls_for``, as admin."""
    from aiokafka.errors import KafkaError

    assert security.acls_for is not None
    acls = pipeline_acls(security.acls_for)
    try:
        run_async(lambda: create_acls(bootstrap, f"User:{PIPELINE}", acls, security.client_options(ADMIN)))
    except KafkaError as exc:
        raise BrokerError(f"cannot add the pipeline user's ACLs on {bootstrap} as {ADMIN}: {exc!r}") from None
