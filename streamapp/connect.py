"""Starting an aiokafka client from a command, with one clear error when no broker answers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Protocol, TypeVar

from aiokafka.errors import KafkaConnectionError

from streamapp.errors import BrokerUnreachable


class KafkaClient(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


Client = TypeVar("Client", bound=KafkaClient)


@contextlib.contextmanager
def quiet_logger(logger_name: str) -> Iterator[None]:
    """Silence a logger while connecting to a broker that may refuse: the caller reports it once."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def start_client(client: Client, bootstrap: str) -> Client:
    """Start ``client``; when no broker answers, close it and raise :class:`BrokerUnreachable`."""
    try:
        with quiet_logger("aiokafka"):
            await client.start()
    except KafkaConnectionError:
        # Closed here, or aiokafka reports an "Unclosed AIOKafkaProducer" at exit.
        await client.stop()
        raise BrokerUnreachable(bootstrap) from None
    return client
