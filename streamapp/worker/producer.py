"""Faust's Kafka producer, with a flush that waits for what was sent before it, not for silence.

Before committing offsets Faust flushes its producer, so that the changelog records and outputs
of the events being committed are on the broker first. Its send buffer's flush waits until the
buffer is empty, one record at a time, and gives up as soon as one record takes longer than
0.1 s. Under load both go wrong: while a stage keeps sending through it the buffer is never
empty, so a commit can wait indefinitely (one took 389 s in a drain, most likely this); and one
slow send ends the flush early, so offsets can commit before their events' outputs are
acknowledged. (The join's changelog records bypass this buffer, streamapp.tables.changelog, and
are covered by the Kafka producer's flush.)

Here a flush waits for exactly the records handed to the send buffer before it was called, then
for everything already in the Kafka producer, as Faust's does next.
"""

from __future__ import annotations

import asyncio

from faust.transport.drivers import aiokafka as faust_aiokafka

from streamapp.worker.budget import SendBufferBytes


class StreamappProducer(faust_aiokafka.Producer):
    async def flush(self) -> None:
        pending = self.buffer.pending
        if isinstance(pending, SendBufferBytes):  # the app sets it at its first start
            unsent = pending.unsent()
            if unsent:
                await asyncio.wait(unsent)
        else:
            await self.buffer.flush()
        if self._producer is not None:
            await self._producer.flush()
        for transaction_producer in self._transaction_producers.values():
            await transaction_producer.flush()
