"""``broker start --nodes 3 --security sasl_ssl --acls``: the nodes replicate over SASL_SSL as
admin, and the pipeline user writes with acks=all and reads back through any node."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp.settings import Settings
from streamapp.tools.localkafka.cluster import LocalCluster
from streamapp.tools.localkafka.processes import free_port_block
from streamapp.tools.localkafka.security import ADMIN, PIPELINE, BrokerSecurity
from streamapp.topics import topic_names

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

NODES = 3


def test_a_secured_cluster_replicates_what_the_pipeline_user_writes(tmp_path):
    settings = Settings()
    security = BrokerSecurity(tmp_path / "security", acls_for=settings)
    cluster = LocalCluster(tmp_path, free_port_block(2 * NODES), nodes=NODES, heap="384m", security=security)
    frames = topic_names(settings)["frames"]

    async def scenario():
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, **security.client_options(ADMIN))
        await admin.start()
        try:
            response = await admin.create_topics([NewTopic(frames, 1, NODES)])
            assert response.to_object()["topic_errors"][0]["error_code"] == 0
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all",
                                    **security.client_options(PIPELINE))
        await producer.start()
        try:
            sent = [await producer.send_and_wait(frames, f"frame-{i}".encode()) for i in range(20)]
        finally:
            await producer.stop()
        # Through one node only: the others are reached as the metadata advertises them.
        consumer = AIOKafkaConsumer(bootstrap_servers=cluster.nodes[-1].bootstrap, group_id=None,
                                    **security.client_options(PIPELINE))
        await consumer.start()
        try:
            partition = TopicPartition(frames, 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            received = []
            async with asyncio.timeout(60):
                while len(received) < len(sent):
                    batches = await consumer.getmany(timeout_ms=1000)
                    received += [record.value for records in batches.values() for record in records]
        finally:
            await consumer.stop()
        return received

    with cluster.start(timeout=180):
        assert asyncio.run(scenario()) == [f"frame-{i}".encode() for i in range(20)]
        assert cluster.under_replicated_partitions() == 0
