"""Faust's stream buffers (mode's ``ThrowableQueue``) sized in bytes, with drop-oldest for live
video: :class:`ByteBoundedQueue` replaces the queue's own ``_put``/``_get`` and reads its deque, so
mode's flow control and Faust's conductor act on bytes unchanged (the memory plan:
streamapp.worker.budget)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from mode.utils.queues import ThrowableQueue

from streamapp.settings import BACKPRESSURE, DROP_OLDEST
from streamapp.units import event_bytes


def _generation_of(item: Any) -> Any:
    return getattr(getattr(item, "message", None), "generation_id", None)


class ByteBoundedQueue(ThrowableQueue):
    """A Faust stream buffer whose size is the bytes it holds, not its number of records.

    ``qsize()`` answers in bytes and ``maxsize`` is the byte limit, so Faust's own machinery acts
    on bytes unchanged: the conductor pauses a partition at 80 % of the limit and resumes it at
    40 %, and waits (stops draining the fetcher) while the queue is full. With drop-oldest, a
    record that would overfill the queue first pushes out the oldest ones, acked so their
    offsets still commit.

    ``current_generation`` is the consumer group generation now: a flow-control clear at the end
    of a rebalance keeps what was fetched in it (see :meth:`clear`).
    """

    def __init__(self, limit_bytes: int, *, policy: str, dropped: Counter[str],
                 current_generation: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(maxsize=limit_bytes, **kwargs)
        self.bytes = 0
        self.policy = policy
        self.dropped = dropped
        self.current_generation = current_generation

    def qsize(self) -> int:
        return self.bytes

    # Live video never waits for the agent: the oldest records make room instead.
    def full(self) -> bool:
        return self.policy == BACKPRESSURE and super().full()

    def in_pressure_high_state(self, callback) -> bool:
        if self.policy != BACKPRESSURE or not super().in_pressure_high_state(callback):
            return False
        self.dropped["pauses"] += 1
        return True

    def _put(self, item: Any) -> None:
        size = event_bytes(item)
        if self.policy == DROP_OLDEST:
            while self._queue and self.bytes + size > self.maxsize:  # type: ignore[attr-defined]
                self._drop_oldest()
        super()._put(item)
        self.bytes += size

    def _get(self) -> Any:
        item = super()._get()
        self.bytes -= event_bytes(item)
        return item

    def clear(self) -> None:
        """Faust clears stream buffers when a rebalance suspends flow, and again when it resumes
        flow after recovery. By the second clear the consumer has resumed the new assignment and
        may have fetched records into this buffer, with its position already past them: dropped,
        they are never fetched again (and on a partition without a committed offset, offsets
        commit past them). So a clear while flow is active drops only records fetched in an
        earlier generation, which the stream would skip anyway."""
        if self._flow_control.is_active():
            generation = self.current_generation()
            kept = [item for item in self._queue if _generation_of(item) == generation]  # type: ignore[attr-defined]
        else:
            kept = []
        super().clear()
        self._queue.extend(kept)  # type: ignore[attr-defined]
        self.bytes = sum(event_bytes(item) for item in kept)

    def _drop_oldest(self) -> None:
        oldest = self._get()
        self._unfinished_tasks -= 1  # type: ignore[attr-defined]
        self.dropped["records"] += 1
        self.dropped["bytes"] += event_bytes(oldest)
        ack = getattr(oldest, "ack", None)
        if ack is not None:
            ack()
