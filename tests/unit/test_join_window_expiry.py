"""A sweep's write after its unmatched frames are delivered: one that RocksDB refuses (a write stall
while its flushes catch up) is waited out, so no frame leaves twice without a crash. Under
exactly-once a sweep sees an entry as the open transactions left it, and the store takes their
changes only once they commit."""

import asyncio
from types import SimpleNamespace

from test_metrics_store import open_partition

from streamapp import wire
from streamapp.diskspace import SpacePause
from streamapp.tables.entry import Entry, EntryKind
from streamapp.tables.transaction import Uncommitted
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
    window.uncommitted = Uncommitted(0)

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


class OpenTransactions:
    """The join's partition transactions, as the window uses them, recorded."""

    generation = 3

    def __init__(self) -> None:
        self.open: dict = {}
        self.committed: list = []

    def producer_in(self, generation, partition):
        return object() if generation == self.generation else None

    def add(self, generation, partition, offsets) -> bool:
        self.open.setdefault(partition, {}).update(offsets or {})
        return generation == self.generation

    def take_open(self):
        taken, self.open = self.open, {}
        return taken

    async def commit_partition(self, generation, partition, offsets=None) -> bool:
        self.committed.append((partition, offsets))
        return True


def test_under_exactly_once_a_sweep_sees_the_open_transactions_and_the_store_takes_them_once_committed(tmp_path):
    partition = open_partition(tmp_path / "p0.db")
    store, changelog, emitted = StallingStore(partition), [], []
    store.refusals = 0
    window = _window(store, changelog)

    async def send_in_transaction(producer, number, changes):
        changelog.extend(changes)
        return []
    window.changelog.send_in_transaction = send_in_transaction
    window.changelog.persisted = lambda number, deliveries: None
    commits = OpenTransactions()
    window.commit_in(commits, lambda write: asyncio.sleep(0, write()), max_bytes=1024)  # type: ignore[arg-type]
    partition.write(KEY, Entry(EntryKind.FRAME, 5_000, b"jpeg", 1_000).encode())
    joined = Entry(EntryKind.JOINED, 60_000).encode()

    async def on_due(key, entry, number):
        emitted.append(key)
        return DueOutcome(Entry(EntryKind.EXPIRED, 60_000))

    async def scenario():
        # A batch of the open transaction joined the frame; the store still has it waiting, due.
        assert await window.write(0, [(KEY, joined)], window.retry, generation=3, offsets={"frames-0": 9})
        before, seen = partition.get(KEY), window.get(0, KEY)
        # The sweep finds the frame due, held: it commits the open transaction, then sees the marker.
        swept = await window.shed(10_000, on_due, window.retry)
        return swept, before, seen

    try:
        swept, before, seen = asyncio.run(scenario())
        assert swept == 0 and emitted == []  # joined in the open transaction: never expired as well
        assert seen is not None and seen.kind == EntryKind.JOINED  # what the next batch reads
        assert Entry.decode(before).kind == EntryKind.FRAME  # the store waited for the commit
        assert commits.committed == [(0, {"frames-0": 9})]
        assert partition.get(KEY) == joined and changelog == [(KEY, joined)]
        assert window.uncommitted.bytes == 0 and window.uncommitted.held == {}
    finally:
        partition.close()


def test_under_exactly_once_the_open_transactions_commit_before_a_batch_that_could_pass_their_bound(tmp_path):
    partition = open_partition(tmp_path / "p0.db")
    store = StallingStore(partition)
    store.refusals = 0
    window = _window(store, [])
    window.changelog.send_in_transaction = lambda producer, number, changes: asyncio.sleep(0, [])
    window.changelog.persisted = lambda number, deliveries: None
    commits = OpenTransactions()
    window.commit_in(commits, lambda write: asyncio.sleep(0, write()), max_bytes=100)  # type: ignore[arg-type]
    waiting = Entry(EntryKind.FRAME, 5_000, b"x" * 40, 1_000).encode()

    async def scenario():
        await window.make_room(1_000)  # nothing held: a batch larger than the bound still goes
        assert await window.write(0, [(KEY, waiting)], window.retry, generation=3, offsets={"frames-0": 1})
        held = window.uncommitted.bytes
        await window.make_room(100 - held)  # fits
        fits = list(commits.committed)
        await window.make_room(100 - held + 1)  # would pass the bound: commit first
        return held, fits

    try:
        held, fits = asyncio.run(scenario())
        assert held == len(KEY) + len(waiting) and fits == []
        assert commits.committed == [(0, {"frames-0": 1})] and partition.get(KEY) == waiting
        assert window.uncommitted.bytes == 0 and window.uncommitted.commits_at_bound == 1
        assert window.uncommitted.as_metrics()["join_uncommitted_commits_at_bound_total"] == 1
    finally:
        partition.close()
