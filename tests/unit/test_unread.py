"""Gaps in the offsets a worker reads, judged against the partition's log start offset: the part
below it was deleted by retention before it was read, and is counted exactly."""

from faust.types import TP

from streamapp.unread import METRIC, UnreadGaps

FRAMES, DETECTIONS = TP("frames", 0), TP("detections", 1)


def test_the_part_of_a_gap_below_the_log_start_is_counted_as_deleted_unread():
    gaps = UnreadGaps()
    gaps.add(FRAMES, 100, 250)  # read up to 99, then 250: retention moved the log start to 250
    [deleted] = gaps.judge({FRAMES: 250})
    assert (deleted.first, deleted.last, deleted.records) == (100, 249, 150)
    assert gaps.counts[FRAMES] == 150
    assert "150 records of frames partition 0 (offsets 100-249)" in deleted.warning()
    assert "retention" in deleted.warning() and "\n" not in deleted.warning()


def test_a_log_start_that_moved_on_after_the_gap_counts_no_more_than_the_gap():
    gaps = UnreadGaps()
    gaps.add(FRAMES, 100, 250)
    assert [d.records for d in gaps.judge({FRAMES: 400})] == [150]  # 250..399 were read before deletion


def test_a_gap_above_the_log_start_is_not_a_deletion():
    gaps = UnreadGaps()
    gaps.add(FRAMES, 41, 42)  # a transaction marker at 41, still in the log
    assert gaps.judge({FRAMES: 0}) == []
    assert gaps.counts[FRAMES] == 0


def test_only_the_deleted_part_of_a_gap_across_the_log_start_counts():
    gaps = UnreadGaps()
    gaps.add(FRAMES, 10, 30)
    assert [d.records for d in gaps.judge({FRAMES: 20})] == [10]


def test_gaps_wait_until_their_partition_is_judged_and_are_judged_once():
    gaps = UnreadGaps()
    gaps.add(FRAMES, 0, 5)
    gaps.add(DETECTIONS, 7, 9)
    gaps.add(FRAMES, 8, 9)
    assert gaps.waiting == [FRAMES, DETECTIONS]
    assert sum(d.records for d in gaps.judge({FRAMES: 9})) == 6
    assert gaps.waiting == [DETECTIONS]
    assert gaps.judge({FRAMES: 9}) == []
    assert gaps.counts[FRAMES] == 6


def test_an_empty_gap_is_ignored():
    gaps = UnreadGaps()
    gaps.add(FRAMES, 5, 5)
    assert gaps.waiting == []


def test_every_partition_read_shows_a_count_from_zero_and_counted_ones_stay():
    gaps = UnreadGaps()
    gaps.add(DETECTIONS, 0, 3)
    gaps.judge({DETECTIONS: 3})
    assert gaps.as_metrics([FRAMES]) == {f'{METRIC}{{topic="detections",partition="1"}}': 3,
                                         f'{METRIC}{{topic="frames",partition="0"}}': 0}
