"""The join's hold-back: a record waits for its partner so that the two are decided in one batch,
bounded in time and bytes, and it never changes what is decided, only when."""

from types import SimpleNamespace

from streamapp.agents.join import HOLD_BEHIND_S, HOLD_CAUGHT_UP_S, PartnerHoldBack
from streamapp.tables.progress import ReadProgress

FRAMES, RESULTS = "frames", "results"
T0 = 1_700_000_000_000


class Source:
    """Records of both sides and what the hold-back's progress sees of their partitions."""

    def __init__(self, max_bytes: int = 10**6) -> None:
        self.end = {FRAMES: 0, RESULTS: 0}  # end offsets: 0 = caught up (nothing to read)
        self.generation = 1
        progress = ReadProgress(FRAMES, RESULTS, end_offset=lambda topic, number: self.end[topic],
                                start_offset=lambda topic, number: 0, generation=lambda: self.generation,
                                clock=lambda: 0)
        self.hold = PartnerHoldBack(progress, max_bytes)
        self.offsets = {FRAMES: 0, RESULTS: 0}

    def record(self, topic: str, index: int, *, key: bytes | None = b"cam:1:0", size: int = 100):
        offset = self.offsets[topic]
        self.offsets[topic] += 1
        message = SimpleNamespace(topic=topic, partition=0, offset=offset, key=key, value=b"v" * size,
                                  timestamp=(T0 + index * 10) / 1000)
        return SimpleNamespace(message=message, name=f"{topic[0]}{index}")

    def take(self, *records, now: float = 0.0) -> set[str]:
        return {event.name for event, *_ in self.hold.take([(record, None, now) for record in records], now)}


def test_a_result_ahead_waits_for_its_frame_and_both_leave_together():
    source = Source()
    source.end[FRAMES] = 10  # frames have a backlog: results read ahead wait for them
    assert source.take(source.record(RESULTS, 0), source.record(RESULTS, 1)) == set()
    assert source.take(source.record(FRAMES, 0), now=1.0) == {"r0", "f0"}
    assert source.take(source.record(FRAMES, 1), now=2.0) == {"r1", "f1"}
    assert not source.hold.holding()


def test_a_frame_ahead_waits_for_its_result():
    source = Source()
    source.end[RESULTS] = 10
    assert source.take(source.record(FRAMES, 0), source.record(FRAMES, 1)) == set()
    assert source.take(source.record(RESULTS, 0)) == {"f0", "r0"}
    assert source.hold.holding()  # f1 still waits for r1


def test_a_record_whose_partner_side_is_read_past_it_leaves_at_once():
    source = Source()
    assert source.take(source.record(FRAMES, 5)) == set()  # results caught up: f5 waits a moment
    assert source.take(source.record(RESULTS, 3)) == {"r3"}  # frames were read past 3
    assert source.take(source.record(RESULTS, 5)) == {"f5", "r5"}


def test_records_of_other_buckets_are_not_partners():
    source = Source()
    source.end[FRAMES] = 10
    assert source.take(source.record(RESULTS, 0, key=b"cam:1:0")) == set()
    assert source.take(source.record(RESULTS, 9, key=b"cam:1:1")) == set()
    assert source.take(source.record(FRAMES, 9, key=b"cam:1:1")) == {"f9"}  # r9 waits behind r0
    assert source.take(source.record(FRAMES, 0, key=b"cam:1:0")) == {"r0", "r9", "f0"}


def test_a_record_never_overtakes_an_earlier_one_of_its_partition():
    """Nothing counts as read past a held record, so it cannot be expired early by its partner."""
    source = Source()
    source.end[RESULTS] = 10
    assert source.take(source.record(FRAMES, 0, key=b"cam:1:0"), source.record(FRAMES, 7, key=b"cam:1:1")) == set()
    assert source.take(source.record(RESULTS, 7, key=b"cam:1:1")) == {"r7"}  # f7 stays behind f0
    assert source.take(source.record(RESULTS, 0, key=b"cam:1:0")) == {"f0", "r0", "f7"}


def test_with_the_partner_side_caught_up_a_record_waits_only_a_moment():
    source = Source()
    assert source.take(source.record(FRAMES, 0), now=0.0) == set()
    assert source.take(now=HOLD_CAUGHT_UP_S / 2) == set()
    assert source.take(now=HOLD_CAUGHT_UP_S) == {"f0"}  # its result is dropped upstream: decided alone


def test_with_the_partner_side_behind_a_record_waits_longer_but_not_for_ever():
    source = Source()
    source.end[RESULTS] = 10
    assert source.take(source.record(FRAMES, 0), now=0.0) == set()
    assert source.take(now=HOLD_CAUGHT_UP_S * 4) == set()
    assert source.take(now=HOLD_BEHIND_S) == {"f0"}


def test_past_the_byte_bound_the_oldest_go_on_counted():
    record_bytes = len(b"cam:1:0") + 100  # key and value
    source = Source(max_bytes=int(2.5 * record_bytes))
    source.end[FRAMES] = 10
    records = [source.record(RESULTS, index, size=100) for index in range(4)]
    assert source.take(*records) == {"r0", "r1"}
    assert source.hold.as_metrics() == {"join_held_bytes": 2 * record_bytes, "join_held_let_go_over_bound_total": 2}


def test_records_held_over_a_rebalance_are_let_go():
    source = Source()
    source.end[FRAMES] = 10
    assert source.take(source.record(RESULTS, 0), source.record(RESULTS, 1)) == set()
    source.generation = 2
    assert source.take() == {"r0", "r1"}  # the batch lets them go unacked: read again
    assert not source.hold.holding()


def test_records_without_a_bucket_key_are_never_held():
    source = Source()
    source.end[RESULTS] = 10
    assert source.take(source.record(FRAMES, 0, key=None)) == {"f0"}


def test_held_records_of_two_buckets_never_hold_each_other_as_a_backlog():
    """Frames of one camera and results of another on one partition, neither ever partnered: what
    either side holds is in hand, so each side's records wait only a moment."""
    source = Source()
    source.end[FRAMES] = source.end[RESULTS] = 1  # each side's one record is taken, and held
    taken = source.take(source.record(FRAMES, 0, key=b"cam:1:0"), source.record(RESULTS, 0, key=b"cam:2:0"))
    assert taken == set()
    assert source.take(now=HOLD_CAUGHT_UP_S) == {"f0", "r0"}


def test_the_oldest_held_record_says_when_it_was_read():
    source = Source()
    source.end[RESULTS] = 10
    assert source.take(source.record(FRAMES, 0), now=1.0) == set()
    assert source.take(source.record(FRAMES, 1), now=2.0) == set()
    assert source.hold.oldest_read_at() == 1.0
    assert source.take(now=1.0 + HOLD_BEHIND_S) == {"f0"}
    assert source.hold.oldest_read_at() == 2.0
