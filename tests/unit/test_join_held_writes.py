"""A join decision changes the state only when the agent applies it, after its output is
delivered: a worker killed in between finds the pending entry again on redelivery (R12)."""

import pytest

from streamapp import wire
from streamapp.agents.join import CHANGELOG_ROOM_BYTES, HeldWrites, check_fits
from streamapp.tables.entry import EntryKind

from tests.unit.test_join_logic import DictState, frame, joiner, result


def test_a_completed_join_leaves_the_pending_entry_until_applied():
    state, join = DictState(), joiner()
    join.on_frame(state, *frame(3), now_ms=0)
    held = HeldWrites(state)
    assert join.on_result(held, *result(3), now_ms=5) is not None
    assert state[b"cam:1:3"].kind == EntryKind.FRAME  # killed now: the redelivered result joins again
    assert join.on_result(HeldWrites(state), *result(3), now_ms=6) is not None
    held.apply()
    assert state[b"cam:1:3"].kind == EntryKind.JOINED
    assert join.on_result(HeldWrites(state), *result(3), now_ms=7) is None


def test_held_writes_read_their_own_writes():
    state, join = DictState(), joiner()
    held = HeldWrites(state)
    join.on_frame(held, *frame(4), now_ms=0)
    assert b"cam:1:4" not in state
    assert join.on_result(held, *result(4), now_ms=1) is not None
    held.apply()
    assert state[b"cam:1:4"].kind == EntryKind.JOINED and not held.held


def test_records_the_changelog_would_refuse_are_wire_errors():
    limit = 10_000
    check_fits(b"x" * (limit - CHANGELOG_ROOM_BYTES), limit)
    with pytest.raises(wire.WireError, match="changelog"):
        check_fits(b"x" * (limit - CHANGELOG_ROOM_BYTES + 1), limit)
