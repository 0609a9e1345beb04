"""Faust's Kafka consumer, mended where a rebalance loses records it has fetched.

Mid-rebalance Faust drops the records its consumer has fetched but not yet handed to a stream
(flow is suspended, or the generation changed), while the consumer's position is already past
them. It relies on the seek after the rebalance to rewind: every partition goes back to its
committed offset. A partition nobody has committed yet is not moved, so what was dropped on it
is never read. This is common right after a worker starts: a join worker killed before its
first commit leaves its partitions uncommitted, and the survivor lost the records it fetched
from them while taking them over. Here such partitions go back to their first offset, where a
new consumer of the group starts (``auto_offset_reset=earliest``).

The consumer also says where each input partition is read from in a generation (its committed
offset, as sought), which the join needs to tell "caught up" before it has read a partition.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from streamapp.worker.producer import StreamappProducer


class StreamappConsumer(faust_aiokafka.Consumer):
    #: Where each input partition is read from in a generation (see :meth:`start_offset`).
    read_from: Mapping[TP, tuple[int, int | None]] = MappingProxyType({})

    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed = await super().seek_to_committed()
        inputs = [tp for tp in committed if not self._is_changelog_tp(tp)]  # recovery places changelogs
        uncommitted = [tp for tp in inputs if not committed[tp]]
        first: Mapping[TP, int] = {}
        if uncommitted and self.app.conf.consumer_auto_offset_reset == "earliest":
            await self._thread.seek_to_beginning(*uncommitted)
            first = await self.earliest_offsets(*uncommitted)
        generation = self.app.consumer_generation_id
        self.read_from = {tp: (generation, committed[tp] or first.get(tp)) for tp in inputs}
        return committed

    def start_offset(self, tp: TP) -> int | None:
        """The offset this generation reads ``tp`` from: its committed offset, or its first one
        when none is committed (None: unknown). Unlike the consumer's position, which runs ahead
        as records are fetched, it says what is left to process before anything is."""
        generation, offset = self.read_from.get(tp, (None, None))
        return offset if generation == self.app.consumer_generation_id else None


class Transport(faust_aiokafka.Transport):
    Consumer = StreamappConsumer
    Producer = StreamappProducer
