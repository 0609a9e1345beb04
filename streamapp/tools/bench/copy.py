"""The limit of ``streamapp bench join``: an aiokafka consumer→producer copy of the frame and
result records into one topic, tuned as a user would (large fetches, 1 MiB batches, 5 ms linger,
a whole fetched batch in flight before awaiting its acknowledgements), reading responses,
writing produce requests and partitioning keys as the worker does (streamapp.kafka.read,
streamapp.kafka.write, KeyPartitioner).

Run as ``python -m streamapp.tools.bench.copy GROUP TARGET SOURCE...``, connecting as the ``STREAMAPP_*``
settings say (broker, security); it prints ``ready``
once its partitions are assigned, and copies until it is terminated.
"""

from __future__ import annotations

import asyncio
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamapp.kafka import client as kafkaclient
from streamapp.kafka.producer import KeyPartitioner
from streamapp.kafkasecurity import client_options
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes

READY_MARKER = "ready"
MIB = 1024**2
POLL_RECORDS = 2000
POLL_S = 0.2


async def copy(settings: Settings, group: str, target: str, sources: list[str]) -> None:
    limit = max_record_bytes(settings)
    consumer = AIOKafkaConsumer(*sources, **client_options(settings), group_id=group,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=limit,
                                fetch_max_bytes=64 * MIB)
    producer = AIOKafkaProducer(**client_options(settings), max_request_size=limit,
                                max_batch_size=MIB, linger_ms=5, partitioner=KeyPartitioner())
    await consumer.start()
    await producer.start()
    try:
        announced = False
        while True:
            batches = await consumer.getmany(timeout_ms=int(POLL_S * 1000), max_records=POLL_RECORDS)
            if not announced and consumer.assignment():
                print(READY_MARKER, flush=True)
                announced = True
            deliveries = [await producer.send(target, record.value, key=record.key, timestamp_ms=record.timestamp)
                          for records in batches.values() for record in records]
            await asyncio.gather(*deliveries)
    finally:
        await producer.stop()
        await consumer.stop()


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m streamapp.tools.bench.copy GROUP TARGET SOURCE...", file=sys.stderr)
        return 2
    group, target, *sources = argv
    # As the worker reads and writes: the limit is for these bytes, not for asyncio's and aiokafka's copies.
    kafkaclient.install()
    asyncio.run(copy(Settings.from_env(), group, target, sources))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
