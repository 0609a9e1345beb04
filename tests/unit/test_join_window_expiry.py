"""A sweep's write after its unmatched frames are delivered: one that RocksDB refuses (a write stall
while its flushes catch up) is waited out, so no frame leaves twice without a crash."""

import asyncio
from types import SimpleNamespace

from test_metrics_store import open_partition

from streamapp import wire
from streamapp.diskspace import SpacePause
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.window import DueOutcome, JoinWindow

KEY = wire.FrameId("cam", 1, 7).join_key()


class StallingStore:
    """One real partition whose first window write RocksDB refuses as a stall."""

    def __init__(self, partition) -> None:
        self.partition, self.refusals = partition, 1

    def active_partitions(self):
        return iter([(0, self.partition)])

    def still_owns(self, number, partition) -> bool:
        return True

    def write_many(self, number, changes) -> None:
        if self.refusals:
            self.refusals -= 1
            raise Exception("Result incomplete: Write stall")  # what rocksdict raises
        self.partition.write_many(changes, wait=False)


def _window(store: StallingStore, changelog: list) -> JoinWindow:
    window = JoinWindow.__new__(JoinWindow)  # the sweep needs only the store and the changelog
    window.table = SimpleNamespace(data=store)

    async def send(partition, changes):
        changelog.extend(changes)
    window.changelog = SimpleNamespace(send=send)
    return window


def test_a_stalled_write_after_delivery_is_retried_and_the_frame_leaves_once(tmp_path):
    partition = open_partition(tmp_path / "p0.db")
    store, changelog, emitted = StallingStore(partition), [], []
    window = _window(store, changelog)
    partition.write(KEY, Entry(EntryKind.FRAME, 5_000, b"jpeg", 1_000).encode())
    space = SpacePause("the join", lambda: 10**12, resume_bytes=0, poll_s=0.01)

    async def on_due(key, entry, number):
        emitted.append(key)
        return DueOutcome(Entry(EntryKind.EXPIRED, 60_000))

    async def two_sweeps():
        return [await window.shed(10_000, on_due, space.retry) for _ in range(2)]

    try:
        assert asyncio.run(two_sweeps()) == [1, 0]
        assert store.refusals == 0, "the write was never refused"
        assert emitted == [KEY]
        assert Entry.decode(partition.get(KEY)).kind == EntryKind.EXPIRED
        assert [key for key, _ in changelog] == [KEY]
        assert not space.paused  # space was free: a stall is retried, not a full disk
    finally:
        partition.close()
