"""Readiness conditions and the JSON log format, without a worker (the real worker's routes and
log lines: tests/integration/test_health.py)."""

import io
import json
import logging

import pytest

from streamapp.worker.health import Readiness
from streamapp.worker.logs import WorkerFields, json_formatter


def test_readiness_names_what_is_unmet_at_each_ask():
    disk_full = [False]
    readiness = Readiness()
    readiness.add("partitions assigned", lambda: True)
    readiness.add("join disk not paused", lambda: not disk_full[0])
    assert readiness.unmet() == []
    disk_full[0] = True
    assert readiness.report() == {"partitions assigned": True, "join disk not paused": False}
    assert readiness.unmet() == ["join disk not paused"]
    with pytest.raises(ValueError, match="added twice"):
        readiness.add("join disk not paused", lambda: True)


def test_a_json_line_carries_the_worker_and_the_call_s_fields():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    handler.addFilter(WorkerFields("join", lambda: 6068))
    logger = logging.getLogger("streamapp.test_logs")
    logger.addHandler(handler)
    try:
        logger.warning("lost %d records", 3, extra={"topic": "frames", "partition": 2})
        try:
            raise OSError("disk full")
        except OSError:
            logger.exception("write failed")
    finally:
        logger.removeHandler(handler)
    warning, error = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {key: warning[key] for key in ("level", "logger", "message", "stage", "topic", "partition")} == {
        "level": "WARNING", "logger": "streamapp.test_logs", "message": "lost 3 records", "stage": "join",
        "topic": "frames", "partition": 2}
    assert warning["worker"].endswith(":6068") and warning["time"].endswith("+00:00")
    assert error["level"] == "ERROR" and "OSError: disk full" in error["exc_info"]
