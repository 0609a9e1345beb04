"""Faust's Kafka consumer, mended where a rebalance loses records it has fetched.

Mid-rebalance Faust drops the records its consumer has fetched but not yet handed to a stream
(flow is suspended, or the generation changed), while the consumer's position is already past
them. It relies on the seek after the rebalance to rewind: every partition goes back to its
committed offset. A partition nobody has committed yet is not moved, so what was dropped on it
is never read. This is common right after a worker starts: a join worker killed before its
first commit leaves its partitions uncommitted, and the survivor lost the records it fetched
from them while taking them over. Here such partitions go back to their first offset, where a
new consumer of the group starts (``auto_offset_reset=earliest``).
"""

from __future__ import annotations

from collections.abc import Mapping

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP


class RewindingConsumer(faust_aiokafka.Consumer):
    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed = await super().seek_to_committed()
        uncommitted = [tp for tp, offset in committed.items()
                       if not offset and not self._is_changelog_tp(tp)]  # recovery places changelogs
        if uncommitted and self.app.conf.consumer_auto_offset_reset == "earliest":
            await self._thread.seek_to_beginning(*uncommitted)
        return committed


class Transport(faust_aiokafka.Transport):
    Consumer = RewindingConsumer
