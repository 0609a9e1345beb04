"""The worker's Faust app where it replaces Faust's private parts: the Kafka transport, and the
table manager's start."""

from __future__ import annotations

import faust
from faust.tables import TableManager

from streamapp.kafka import consumer


class KafkaApp(faust.App):
    """A Faust app on :class:`streamapp.kafka.consumer.Transport`."""

    def _new_transport(self):
        # Faust's Kafka transport, with a consumer that loses nothing in a rebalance (consumer.py) and a
        # producer whose flush before a commit waits for what was sent before it (producer.py).
        return consumer.Transport(self.conf.broker_consumer, self)


class PromptTableManager(TableManager):
    """Faust's table manager without the fixed one-second sleep it starts with (there to let
    tables be defined; ours all are, in create_app, before the worker starts). Every worker
    pays that second at every start, inside a restart's time budget."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()
