"""The Quix Streams join of ``streamapp bench join``: ``StreamingDataFrame.join_interval`` of frames
with their inference results, keyed per frame (``stream:epoch:index``) and windowed as the Kafka
Streams join is (an inner join of records at most the TTL apart in event time, either way), each
output value the frame record followed by the result record. Quix keeps both sides in RocksDB
under ``STATE_DIR``, with changelog topics, and runs on confluent-kafka (librdkafka).

Run as ``python -m streamapp.tools.bench.quixjoin GROUP FRAMES RESULTS OUTPUT STATE_DIR WINDOW_MS``,
connecting as the ``STREAMAPP_*`` settings say (broker, security); it logs ``READY_MARKER`` once its
partitions are assigned, and joins until it is terminated.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from streamapp.kafkasecurity import librdkafka_config
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes

if TYPE_CHECKING:
    from quixstreams import Application

# Quix logs partition assignment only at DEBUG, on the logger of its application module.
READY_MARKER = "Rebalancing: assigning partitions"
ASSIGNMENT_LOGGER = "quixstreams.app"
MIB = 1024**2
# How a state value is stored: the join's records as they are, Quix's own values (counters) as JSON.
RAW, JSON = b"\x00", b"\x01"


def dumps(value: Any) -> bytes:
    return RAW + value if isinstance(value, bytes) else JSON + orjson.dumps(value)


def loads(data: bytes) -> Any:
    return data[1:] if data[:1] == RAW else orjson.loads(data[1:])


def application(settings: Settings, group: str, state_dir: Path) -> Application:
    """What a user would set: the connection, the group reading from the start, state in the
    bench's directory, the records' bytes stored as they are (Quix's default stores values as JSON,
    which bytes are not), fetches and requests as large as the project's records."""
    # Imported here: the bench reads this module's constants without the bench extra installed.
    from quixstreams import Application
    from quixstreams.kafka.configuration import ConnectionConfig
    from quixstreams.state.rocksdb import RocksDBOptions

    limit = max_record_bytes(settings)
    connection = ConnectionConfig.from_librdkafka_dict(
        {"bootstrap.servers": settings.bootstrap_servers, **librdkafka_config(settings.security)})
    return Application(broker_address=connection, consumer_group=group, auto_offset_reset="earliest",
                       state_dir=state_dir, rocksdb_options=RocksDBOptions(dumps=dumps, loads=loads), loglevel=None,
                       consumer_extra_config={"max.partition.fetch.bytes": limit, "fetch.max.bytes": 64 * MIB},
                       producer_extra_config={"message.max.bytes": limit})


def build(app: Application, frames: str, results: str, output: str, window_ms: int) -> None:
    """Frames joined with results on the same key, at most ``window_ms`` apart either way; a
    record stays in the store for the window after its time (Kafka Streams: no grace)."""
    def topic(name: str):
        return app.topic(name, key_deserializer="bytes", value_deserializer="bytes",
                         key_serializer="bytes", value_serializer="bytes")

    joined = app.dataframe(topic(frames)).join_interval(
        app.dataframe(topic(results)), how="inner", on_merge=lambda frame, result: frame + result,
        grace_ms=window_ms, backward_ms=window_ms, forward_ms=window_ms)
    joined.to_topic(topic(output))


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print("usage: python -m streamapp.tools.bench.quixjoin GROUP FRAMES RESULTS OUTPUT STATE_DIR WINDOW_MS",
              file=sys.stderr)
        return 2
    group, frames, results, output, state_dir, window_ms = argv
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger(ASSIGNMENT_LOGGER).setLevel(logging.DEBUG)
    app = application(Settings.from_env(), group, Path(state_dir))
    build(app, frames, results, output, int(window_ms))
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
