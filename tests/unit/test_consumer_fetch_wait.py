"""The worker's consumer lets the broker hold a fetch that finds nothing new for at most
FETCH_MAX_WAIT_MS, not Faust's 1.5 s, which held a backlog's other partitions back that long
(streamapp.kafka.consumer)."""

from __future__ import annotations

import asyncio

from streamapp.kafka.consumer import FETCH_MAX_WAIT_MS, ConsumerThread
from streamapp.settings import Settings
from streamapp.worker.factory import create_app


def test_the_fetcher_waits_for_new_records_at_most_the_short_wait(tmp_path):
    # 256 MiB: the RocksDB pool (a quarter) is the 64 MiB the other unit tests share in this process.
    app = create_app(Settings(stages=("resize",), data_dir=tmp_path, memory_budget_bytes=256 * 1024**2))
    thread = app.consumer._thread
    assert isinstance(thread, ConsumerThread)

    async def fetch_wait_ms() -> int:
        kafka_consumer = thread._create_consumer(loop=asyncio.get_running_loop())
        try:
            return kafka_consumer._fetch_max_wait_ms
        finally:
            await kafka_consumer.stop()

    assert asyncio.run(fetch_wait_ms()) == FETCH_MAX_WAIT_MS < 1500
