"""Read progress of the join's inputs: the facts its expiry and in-step reading stand on (R3)."""

from streamapp.tables.progress import BEHIND_AFTER_MS, MAX_RUNS_PER_PARTITION, ReadProgress, SideProgress

TTL_MS = 5_000


def progress(ends=None, starts=None, generation=None, clock=None, read_through=None):
    ends = {} if ends is None else ends
    starts = {} if starts is None else starts
    read_through = {} if read_through is None else read_through
    generation = generation or [1]
    return ReadProgress("frames", "detections", end_offset=lambda topic, number: ends.get((topic, number)),
                        start_offset=lambda topic, number: starts.get((topic, number)),
                        generation=lambda: generation[0], clock=clock or (lambda: 0),
                        read_through=lambda topic, number: read_through.get((topic, number)))


def record(read, topic, partition, run, event_ms, *, offset):
    read.passed(topic, partition, offset)
    read.observe(topic, partition, run, event_ms)


def test_event_time_is_kept_per_camera_run():
    read = progress()
    record(read, "detections", 0, b"ahead:1", 160_000, offset=0)
    record(read, "detections", 0, b"behind:1", 40_000, offset=1)
    record(read, "detections", 0, b"behind:1", 39_000, offset=2)  # a little out of order: the latest stays
    results = read.side(1, 0)
    assert (results.read_past(b"ahead:1"), results.read_past(b"behind:1"), results.read_past(b"new:1")) == \
        (160_000, 40_000, None)


def test_caught_up_needs_a_known_end_and_a_position_at_it():
    ends, starts = {("detections", 0): 10}, {}
    read = progress(ends, starts)
    assert not read.caught_up(1, 0)                    # nothing read, start unknown
    starts[("detections", 0)] = 10
    assert read.caught_up(1, 0)                        # idle from the start: where it starts is the end
    record(read, "detections", 0, b"cam", 1, offset=7)
    assert not read.caught_up(1, 0)                    # what it read says it is behind
    record(read, "detections", 0, b"cam", 2, offset=9)
    assert read.caught_up(1, 0)
    ends[("detections", 0)] = 12
    assert not read.caught_up(1, 0)
    assert not progress().caught_up(0, 3)              # end unknown (never fetched): not caught up


def test_a_bad_record_read_last_still_leaves_the_side_caught_up():
    read = progress({("detections", 0): 6})
    record(read, "detections", 0, b"cam:1", 1, offset=4)
    read.passed("detections", 0, 5)  # dead-lettered: no event time, but read
    assert read.caught_up(1, 0)


def test_a_side_read_through_the_commit_marker_after_its_last_record_is_caught_up():
    """Written in transactions (exactly-once), a partition ends in a commit marker, an offset no
    record has: the next offset after the last record never reaches the end."""
    ends, through = {("detections", 0): 10}, {}
    read = progress(ends, {("detections", 0): 0}, read_through=through)
    record(read, "detections", 0, b"cam", 1, offset=8)   # offset 9 is its transaction's commit marker
    assert not read.caught_up(1, 0)                      # how far the consumer read is not known yet
    through[("detections", 0)] = (9, 10)                 # it handed over up to 8 and read through 9
    assert read.caught_up(1, 0)
    ends[("detections", 0)], through[("detections", 0)] = 12, (11, 12)  # record 10, marker 11
    assert not read.caught_up(1, 0)                      # record 10 is handed over, not yet decided
    record(read, "detections", 0, b"cam", 2, offset=10)
    assert read.caught_up(1, 0)


def test_a_side_whose_records_were_all_taken_is_in_hand_for_the_hold_back():
    read = progress({("frames", 0): 10}, {("frames", 0): 0}, read_through={("frames", 0): (10, 10)})
    read.side(0, 0).taken(9)
    assert read.all_taken(0, 0) and not read.caught_up(0, 0)  # held back: taken, not decided


def test_a_new_consumer_generation_forgets_what_was_read():
    generation = [1]
    read = progress(generation=generation)
    record(read, "frames", 2, b"cam", 50_000, offset=100)
    generation[0] = 2
    assert read.side(0, 2).read_past(b"cam") is None and read.side(0, 2).next_offset is None


def test_the_side_ahead_by_more_than_the_lead_waits_while_its_partner_is_behind():
    ends, now = {("frames", 0): 1_000, ("detections", 0): 1_000}, [0]
    read = progress(ends, clock=lambda: now[0])
    record(read, "frames", 0, b"cam:1", 20_000, offset=500)
    record(read, "detections", 0, b"cam:1", 20_000 - TTL_MS, offset=100)
    record(read, "frames", 0, b"cam:1", 20_001, offset=501)
    assert read.ahead(0, TTL_MS) is None               # results only just fell behind: maybe a fetch away
    now[0] = BEHIND_AFTER_MS + 1
    assert read.ahead(0, TTL_MS) == 0                   # a backlog: frames wait for results
    record(read, "frames", 0, b"cam:1", 20_000, offset=502)
    record(read, "detections", 0, b"cam:1", 20_001 - TTL_MS, offset=101)
    assert read.ahead(0, TTL_MS) is None                # exactly the lead: in step again
    record(read, "detections", 0, b"cam:1", 19_999 - 3 * TTL_MS, offset=999)
    record(read, "frames", 0, b"cam:1", 30_000, offset=503)
    assert read.ahead(0, TTL_MS) is None                # results caught up: nothing to wait for


def test_live_input_delayed_beyond_the_lead_is_never_paused():
    ends, now = {("frames", 0): 1_000, ("detections", 0): 11}, [0]
    read = progress(ends, clock=lambda: now[0])
    for step in range(10):
        now[0] = step * 500
        record(read, "frames", 0, b"cam:1", 100_000 + step * 500, offset=step)
        record(read, "detections", 0, b"cam:1", 100_000 + step * 500 - 4 * TTL_MS, offset=step)
        ends[("detections", 0)] = step + 2  # one record not fetched yet, each time
        assert read.ahead(0, TTL_MS) is None
        record(read, "detections", 0, b"cam:1", 100_000 + step * 500 - 4 * TTL_MS, offset=step + 1)
        assert read.caught_up(1, 0)


def test_camera_runs_read_only_on_one_side_never_make_the_other_wait():
    now = [0]
    read = progress({("frames", 0): 10, ("detections", 0): 10}, clock=lambda: now[0])
    record(read, "frames", 0, b"no-inference:1", 90_000, offset=0)
    record(read, "detections", 0, b"cam:1", 1_000, offset=0)
    now[0] = 10 * BEHIND_AFTER_MS
    assert read.ahead(0, TTL_MS) is None


def test_runs_beyond_the_limit_forget_the_least_recently_seen():
    side = SideProgress(generation=1)
    for number in range(MAX_RUNS_PER_PARTITION + 1):
        side.observe(f"cam{number}".encode(), number)
    assert side.read_past(b"cam0") is None and side.forgotten_runs == 1
    assert side.read_past(f"cam{MAX_RUNS_PER_PARTITION}".encode()) == MAX_RUNS_PER_PARTITION
