"""Running ``streamapp`` commands and workers as a user of a secured broker would, in
subprocesses with a clean environment, and checking the one-line errors they give."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from streamapp.settings import Settings
from streamapp.tools.localkafka.processes import free_port
from streamapp.tools.workers import Worker, wait_until

BIN = Path(sys.executable).parent


def user_env(secure_kafka, user: str, **changes: str) -> dict[str, str]:
    """A clean environment of ``user``'s settings: nothing STREAMAPP_* of the calling shell."""
    base = {name: value for name, value in os.environ.items() if not name.startswith("STREAMAPP_")}
    return {**base, **secure_kafka.env(user), **changes}


def run_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamapp.cli.main", *argv], env=env, capture_output=True,
                          text=True, timeout=180)


def run_worker(env: dict[str, str], tmp_path: Path, stages: str = "infer") -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "faust"), "-A", "streamapp.app", "worker", "--web-port", str(free_port())],
                          env={**env, "STREAMAPP_STAGES": stages, "STREAMAPP_DATA_DIR": str(tmp_path / "data")},
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)


def assert_one_line(proc: subprocess.CompletedProcess, code: int, *phrases: str) -> None:
    assert proc.returncode == code, proc.stderr[-3000:]
    assert proc.stderr.startswith("streamapp: error: ") and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    for phrase in phrases:
        assert phrase in proc.stderr, proc.stderr
    for secret in (PIPELINE_PASSWORD_MARK,):
        assert secret not in proc.stderr


PIPELINE_PASSWORD_MARK = "wrong-password-not-to-be-shown"


def scaled_frames(kafka, count: int, timeout_s: float = 120.0) -> int:
    """How many records the resize stage wrote to its topic (read as admin), waiting for ``count``."""
    from aiokafka import AIOKafkaConsumer

    from streamapp.topics import topic_names

    async def read() -> int:
        consumer = AIOKafkaConsumer(topic_names(kafka.settings)["scaled"], bootstrap_servers=kafka.bootstrap,
                                    group_id=None, auto_offset_reset="earliest", **kafka.client_options("admin"))
        await consumer.start()
        seen = 0
        try:
            async with asyncio.timeout(timeout_s):
                while seen < count:
                    batches = await consumer.getmany(timeout_ms=1000)
                    seen += sum(len(records) for records in batches.values())
        except TimeoutError:
            pass
        finally:
            await consumer.stop()
        return seen

    return asyncio.run(read())


@contextlib.contextmanager
def resize_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Worker]:
    """A resize worker with the settings of ``env``, ready (its partitions assigned), stopped after."""
    settings = Settings.from_env({**env, "STREAMAPP_STAGES": "resize", "STREAMAPP_DATA_DIR": str(tmp_path / "data"),
                                  "STREAMAPP_WEB_PORT": str(free_port())})
    worker = Worker("resize", settings, tmp_path)
    try:
        wait_until(worker.ready, 120, "the resize worker to be ready")
        yield worker
    finally:
        worker.stop()
