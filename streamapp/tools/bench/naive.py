"""The baseline join of the soak benchmark: both sides buffered in dicts until they match.

This is what a join does when its state is released only by a match or a watermark: a frame
whose result never comes is kept for ever, and nothing bounds how much waits. It consumes the
same topics as the real join (its own consumer group), emits the same joined records to its own
topic, and writes its pending state to a JSON file once a second for the benchmark to sample.

Run as ``python -m streamapp.tools.bench.naive STATS_FILE`` with the ``STREAMAPP_*`` settings of the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamapp import wire
from streamapp.kafkasecurity import client_options
from streamapp.settings import Settings
from streamapp.topics import max_record_bytes, topic_names


def naive_topic(settings: Settings) -> str:
    return f"{settings.topic_prefix}naive.joined"


class DictJoin:
    """Frames and results by join key, each kept until the other side arrives."""

    def __init__(self) -> None:
        self.waiting: dict[bytes, tuple[wire.Frame | wire.Detections, int]] = {}
        self.pending_bytes = 0
        self.joined = 0

    def add(self, record: wire.Frame | wire.Detections, size: int) -> wire.Joined | None:
        key = record.id.join_key()
        other = self.waiting.pop(key, None)
        if other is not None:
            self.pending_bytes -= other[1]
            joined = _pair(other[0], record)
            if joined is not None:
                self.joined += 1
                return joined
        self.waiting[key] = (record, size)  # first side, or a repeat of it
        self.pending_bytes += size
        return None

    def stats(self) -> dict[str, int]:
        return {"join_pending_entries": len(self.waiting), "join_pending_bytes": self.pending_bytes,
                "join_joined_total": self.joined}


def _pair(first: wire.Frame | wire.Detections, second: wire.Frame | wire.Detections) -> wire.Joined | None:
    """The two sides joined, or None if both are frames or both results."""
    if isinstance(first, wire.Frame) and isinstance(second, wire.Detections):
        return wire.Joined(first, second)
    if isinstance(first, wire.Detections) and isinstance(second, wire.Frame):
        return wire.Joined(second, first)
    return None


async def run(settings: Settings, stats_file: Path) -> None:
    names = topic_names(settings)
    consumer = AIOKafkaConsumer(
        names["frames"], names["detections"], **client_options(settings),
        group_id=f"{settings.topic_prefix}naive", auto_offset_reset="earliest",
        max_partition_fetch_bytes=max_record_bytes(settings))
    producer = AIOKafkaProducer(**client_options(settings),
                                max_request_size=max_record_bytes(settings), linger_ms=5)
    join = DictJoin()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await consumer.start()
    await producer.start()
    written = time.monotonic()
    try:
        while not stopping.is_set():
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    side = wire.decode(record.value)
                    if isinstance(side, wire.Joined):
                        raise ValueError(f"{record.topic} offset {record.offset}: a joined record among the inputs")
                    joined = join.add(side, len(record.value))
                    if joined is not None:
                        await producer.send(naive_topic(settings), wire.encode_joined(joined), key=record.key)
            if time.monotonic() - written >= 1.0:
                _write_atomically(stats_file, json.dumps(join.stats()))
                written = time.monotonic()
    finally:
        await consumer.stop()
        await producer.stop()


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    os.replace(partial, path)


class NaiveJoin:
    """The baseline process (streamapp.tools.bench.naive) and the stats file it writes."""

    def __init__(self, settings: Settings, out: Path) -> None:
        self.stats_file = out / "naive-stats.json"
        self._log = open(out / "logs" / "naive.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streamapp.tools.bench.naive", str(self.stats_file)],
            env={**os.environ, **settings.to_env()}, stdout=self._log, stderr=subprocess.STDOUT)

    def stats(self) -> dict:
        try:
            return json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


if __name__ == "__main__":
    asyncio.run(run(Settings.from_env(), Path(sys.argv[1])))
