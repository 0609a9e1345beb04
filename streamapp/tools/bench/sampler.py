"""What the soak records once a second: RSS and CPU of each process, the join's pending state and
RocksDB bytes (from its stats page), and the bytes of each topic in the broker's log directory."""

from __future__ import annotations

import asyncio
import os
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING

from streamapp.settings import Settings
from streamapp.tools.localkafka.broker import LocalBroker
from streamapp.tools.workers import Worker
from streamapp.topics import changelog_name, topic_names

if TYPE_CHECKING:
    from streamapp.tools.bench.naive import NaiveJoin
    from streamapp.tools.bench.soak_state import Progress


def rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def cpu_seconds_of(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def directory_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass  # removed between listing and stat (compaction, segment deletion)
    return total


class Sampler:
    """Once a second: RSS, pending state, RocksDB and topic bytes, outputs so far."""

    def __init__(self, settings: Settings, join: Worker, naive: NaiveJoin | None, out: Path,
                 broker: LocalBroker | None) -> None:
        self.settings = settings
        self.join = join
        self.naive = naive
        self.broker = broker
        self.samples: list[dict] = []
        names = topic_names(settings)
        self.topics = {"changelog": changelog_name(settings), "frames": names["frames"],
                       "detections": names["detections"], "joined": names["joined"]}

    async def run(self, progress: Progress) -> None:
        while True:
            began = time.monotonic()
            self.samples.append(await asyncio.to_thread(self.sample, progress))
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))

    def sample(self, progress: Progress) -> dict:
        stats = self._join_stats()
        sample = {
            "t": round(progress.elapsed(), 2),
            "pairs_sent": progress.pairs_sent,
            "ours": {
                "rss_bytes": rss_of(self.join.process.pid),
                "cpu_s": cpu_seconds_of(self.join.process.pid),
                "pending_entries": stats.get("join_pending_entries", stats.get("join_state_entries", 0)),
                "pending_bytes": stats.get("join_pending_bytes", stats.get("join_state_bytes", 0)),
                "state_bytes": stats.get("join_state_bytes", 0),
                "rocksdb_disk_bytes": stats.get("rocksdb_disk_bytes", 0),
                "rocksdb_memory_bytes": stats.get("rocksdb_memory_bytes", 0),
                "stream_buffer_bytes": stats.get("stream_buffer_bytes", 0),
                "dropped_records": stats.get("budget_dropped_records_total", 0),
                "out": progress.out["ours"],
                "unmatched": stats.get("join_unmatched_frames_total", 0),
            },
            "load": {"rss_bytes": rss_of(os.getpid()), "slow_sink_read": progress.slow_sink_read},
            "broker_topic_bytes": self._topic_bytes(),
        }
        if self.naive is not None:
            naive = self.naive.stats()
            sample["naive"] = {"rss_bytes": rss_of(self.naive.process.pid),
                               "cpu_s": cpu_seconds_of(self.naive.process.pid),
                               "pending_entries": naive.get("join_pending_entries", 0),
                               "pending_bytes": naive.get("join_pending_bytes", 0),
                               "out": progress.out["naive"]}
        return sample

    def _join_stats(self) -> dict:
        try:
            return self.join.stats()
        except OSError:
            return {}  # busy or between restarts; the sample shows zeros rather than stopping

    def _topic_bytes(self) -> dict[str, int] | None:
        if self.broker is None:
            return None
        totals = dict.fromkeys(self.topics, 0)
        by_name = {name: role for role, name in self.topics.items()}
        for entry in os.scandir(self.broker.log_dirs):
            role = by_name.get(entry.name.rsplit("-", 1)[0])
            if role is not None and entry.is_dir():
                totals[role] += directory_bytes(Path(entry.path))
        return totals
