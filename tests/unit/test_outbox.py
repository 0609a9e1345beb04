"""An outbox's ``acked()`` is only for waiting: it is done once every output is acknowledged or
failed, never fails itself, and ``delivered()`` is where a failure is raised (streamapp.worker.outputs)."""

from __future__ import annotations

import asyncio
import gc

import pytest
from aiokafka.errors import KafkaError

from streamapp.worker.outputs import FaustOutbox


class _Emitting:
    """Dead letters' emit as FaustOutbox uses it: each output's delivery, in turn."""

    def __init__(self, deliveries: list[asyncio.Future]) -> None:
        self.deliveries = iter(deliveries)

    async def emit(self, event, **kwargs) -> asyncio.Future:
        return next(self.deliveries)


def test_acked_waits_for_all_outputs_and_leaves_a_failure_to_delivered():
    async def scenario():
        loop = asyncio.get_running_loop()
        unhandled: list[dict] = []
        loop.set_exception_handler(lambda loop, context: unhandled.append(context))
        failed, sent = loop.create_future(), loop.create_future()
        outbox = FaustOutbox(topic=None, dead_letters=_Emitting([failed, sent]), stage="join")
        for _ in range(2):
            await outbox.add(object(), b"key", b"value")
        acked = outbox.acked()
        failed.set_exception(KafkaError("broker gone"))
        await asyncio.sleep(0)
        assert not acked.done()  # the other output is still on its way
        sent.set_result(None)
        await acked  # done, and does not raise
        # A waiter that stopped waiting (input came first) drops it: nothing is left unretrieved.
        outbox.acked()
        await asyncio.sleep(0)
        gc.collect()
        assert unhandled == []
        with pytest.raises(KafkaError, match="broker gone"):
            await outbox.delivered()

    asyncio.run(scenario())
