"""The plain copy of ``streamapp bench join`` on librdkafka (confluent-kafka): the same
consumer→producer copy of the frame and result records into one topic as
:mod:`streamapp.tools.bench.copy`, tuned the same way (fetches up to the record limit per
partition, 1 MiB batches, 5 ms linger, a whole polled batch in flight before awaiting its
acknowledgements), partitioning keys as Kafka's and aiokafka's default partitioner does
(``murmur2_random``). Beside the aiokafka copy it shows what the client alone moves on this machine.

Run as ``python -m streamapp.tools.bench.rdkafkacopy GROUP TARGET SOURCE...``, connecting as the
``STREAMAPP_*`` settings say (broker, security); it prints ``ready`` once its partitions are
assigned, and copies until it is terminated.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

from streamapp.kafkasecurity import librdkafka_config
from streamapp.settings import Settings
from streamapp.tools.bench.copy import MIB, POLL_RECORDS, POLL_S, READY_MARKER
from streamapp.topics import max_record_bytes

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message


# A partition whose prefetched records reach librdkafka's queue bound is fetched again only after
# this long; its default (1 s) halves a drain (docs/benchmarks.md, "Kafka client trial").
FETCH_QUEUE_BACKOFF_MS = 5


def client_configs(settings: Settings, group: str) -> tuple[dict, dict]:
    """The consumer's and the producer's librdkafka configuration."""
    common = {"bootstrap.servers": settings.bootstrap_servers, **librdkafka_config(settings.security)}
    limit = max_record_bytes(settings)
    consumer = {**common, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": "false",
                "max.partition.fetch.bytes": limit, "fetch.max.bytes": max(64 * MIB, limit),
                "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS}
    # message.max.bytes: a record up to the limit, with room for its batch's framing.
    producer = {**common, "linger.ms": 5, "batch.size": MIB, "message.max.bytes": limit + MIB,
                "partitioner": "murmur2_random"}
    return consumer, producer


class Delivery:
    """The first delivery failure since it was last taken."""

    def __init__(self) -> None:
        self.error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None and self.error is None:
            self.error = error

    def take(self) -> KafkaError | None:
        error, self.error = self.error, None
        return error


def copy(settings: Settings, group: str, target: str, sources: list[str]) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer  # the bench extra's

    consumer_config, producer_config = client_configs(settings, group)
    consumer, producer = Consumer(consumer_config), Producer(producer_config)
    delivery = Delivery()
    consumer.subscribe(sources)
    try:
        announced = False
        while True:
            messages = consumer.consume(POLL_RECORDS, POLL_S)
            if not announced and consumer.assignment():
                print(READY_MARKER, flush=True)
                announced = True
            for message in messages:
                if message.error() is not None:
                    raise KafkaException(message.error())
                producer.produce(target, message.value(), message.key(), timestamp=message.timestamp()[1],
                                 on_delivery=delivery)
                producer.poll(0)
            producer.flush()
            if (error := delivery.take()) is not None:
                raise KafkaException(error)
    finally:
        consumer.close()


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m streamapp.tools.bench.rdkafkacopy GROUP TARGET SOURCE...", file=sys.stderr)
        return 2
    group, target, *sources = argv
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # close the consumer on the way out
    copy(Settings.from_env(), group, target, sources)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
