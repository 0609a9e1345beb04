"""Where the local broker keeps things: the jar cache and the data directories."""
from __future__ import annotations

import os
from pathlib import Path

from streamapp.tools.localkafka.common import DEFAULT_PORT, KAFKA_VERSION


def kafka_home() -> Path:
    """Where the Kafka jars are cached: ``$STREAMAPP_KAFKA_HOME`` or the user's cache directory."""
    if os.environ.get("STREAMAPP_KAFKA_HOME"):
        return Path(os.environ["STREAMAPP_KAFKA_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "streamapp" / f"kafka-{KAFKA_VERSION}"


def default_data_dir(port: int = DEFAULT_PORT) -> Path:
    """Data directory of ``streamapp broker`` when none is given: one per port, per user."""
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "streamapp" / f"broker-{port}"
