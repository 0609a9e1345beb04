"""aiokafka's debug log without SASL credentials.

At DEBUG, ``aiokafka.conn`` logs every request and response it sends and reads, whole. The SASL
authentication exchange (Kafka API 36) is among them: PLAIN's request holds the password,
OAUTHBEARER's the token. A filter on that logger replaces those two structs by their name, so
``faust worker -l debug`` keeps every other line and no secret.
"""

from __future__ import annotations

import logging

from aiokafka.protocol.admin import SaslAuthenticateRequest

LOGGER = "aiokafka.conn"


class HiddenSaslBytes(logging.Filter):
    """Shows a SASL authentication request or response as its class name only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(_is_sasl(arg) for arg in record.args):
            record.args = tuple(f"{type(arg).__name__}(***)" if _is_sasl(arg) else arg for arg in record.args)
        return True


def _is_sasl(value: object) -> bool:
    return getattr(value, "API_KEY", None) == SaslAuthenticateRequest.API_KEY


def install() -> None:
    """Filter aiokafka's connection log in this process. Idempotent."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(existing, HiddenSaslBytes) for existing in logger.filters):
        logger.addFilter(HiddenSaslBytes())
