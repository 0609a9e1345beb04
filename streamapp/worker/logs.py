"""The worker's log format: text (Faust's own, the default) or one JSON object per line
(``STREAMAPP_LOG_FORMAT=json``) for log pipelines such as Loki, Elasticsearch or Cloud Logging.

Faust's worker configures logging itself when it starts (mode's ``setup_logging``, from the
app's ``logging_config`` setting), replacing any handler installed before; so the JSON format is
given to it as that setting, merged into its own configuration, and every line from then on,
Faust's and the project's, goes through it. Each object carries ``time`` (UTC, ISO 8601),
``level``, ``logger``, ``message``, the worker's ``stage`` and ``worker`` (host and web port),
the fields a call passes in ``extra`` (e.g. ``topic``, ``partition``) and ``exc_info`` with the
traceback, if any.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from pythonjsonlogger.json import JsonFormatter


class WorkerFields(logging.Filter):
    """Adds the worker's stage and id to every record (the web port is read at each record: the
    command line sets it after the app is made)."""

    def __init__(self, stage: str, web_port: Callable[[], int]) -> None:
        super().__init__()
        self.stage = stage
        self.web_port = web_port
        self.host = socket.gethostname()

    def filter(self, record: logging.LogRecord) -> bool:
        record.stage = self.stage
        record.worker = f"{self.host}:{self.web_port()}"
        return True


def json_formatter() -> JsonFormatter:
    return JsonFormatter("%(levelname)s %(name)s %(message)s %(stage)s %(worker)s",
                         rename_fields={"levelname": "level", "name": "logger"}, timestamp="time")


def logging_config(stage: str, web_port: Callable[[], int]) -> dict:
    """Faust's ``logging_config`` for JSON lines on stderr, merged into mode's configuration (its
    root level, from ``-l``, stays)."""
    return {
        "version": 1,
        "merge": True,
        "formatters": {"json": {"()": json_formatter}},
        "filters": {"worker": {"()": WorkerFields, "stage": stage, "web_port": web_port}},
        "handlers": {"default": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                                 "formatter": "json", "filters": ["worker"]}},
    }
