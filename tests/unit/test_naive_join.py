"""The soak's baseline join (a dict): pairs either arrival order, a repeat of one side replaces
the waiting one, and pending bytes count only what waits."""

from streamapp import wire
from streamapp.tools.bench.naive import DictJoin


def frame(index: int) -> wire.Frame:
    return wire.Frame(wire.FrameId("cam", 1, index), 1_000 + index, 64, 48, b"jpeg")


def result(index: int) -> wire.Detections:
    return wire.Detections(wire.FrameId("cam", 1, index), (), "color", 1.0, 64, 48)


def test_either_side_first_joins_the_pair_and_frees_its_bytes():
    join = DictJoin()
    assert join.add(frame(0), 100) is None
    assert join.add(result(1), 10) is None
    assert join.stats() == {"join_pending_entries": 2, "join_pending_bytes": 110, "join_joined_total": 0}
    assert join.add(result(0), 10) == wire.Joined(frame(0), result(0))
    assert join.add(frame(1), 100) == wire.Joined(frame(1), result(1))
    assert join.stats() == {"join_pending_entries": 0, "join_pending_bytes": 0, "join_joined_total": 2}


def test_a_repeat_of_the_waiting_side_replaces_it():
    join = DictJoin()
    join.add(frame(0), 100)
    assert join.add(frame(0), 120) is None
    assert join.stats() == {"join_pending_entries": 1, "join_pending_bytes": 120, "join_joined_total": 0}
