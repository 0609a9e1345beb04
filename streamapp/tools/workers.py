"""Worker processes: one ``faust -A streamapp.app worker`` per stage, started, watched, stopped.

Used by everything that runs the pipeline as separate processes: the demo, the benchmarks and
the tests that kill, restart or scale workers.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from streamapp.errors import StreamappError
from streamapp.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# Faust logs this once partitions are assigned and the tables are recovered.
READY_MARKER = "Worker ready"


class WorkerExited(StreamappError, RuntimeError):
    """A worker process ended while it was expected to run."""


class Process:
    """A child process in its own session (so stopping it stops its children), its output in a
    log file; ready once the log shows ``ready_marker``."""

    def __init__(self, name: str, argv: list[str], log_path: Path, ready_marker: str,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self.ready_marker = ready_marker
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise WorkerExited(f"the {self.name} exited with {self.process.returncode}; see {self.log_path}")
        return self.ready_marker in self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown, no final commit, no flush."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("the %s did not stop in %.0f s; killing it", self.name, timeout_s)
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


class Worker(Process):
    """One worker process running the stages of ``settings`` (usually one stage)."""

    def __init__(self, stage: str, settings: Settings, log_dir: Path) -> None:
        self.stage = stage
        self.settings = settings
        faust = Path(sys.executable).with_name("faust")
        super().__init__(
            f"{stage} worker",
            [str(faust), "-A", "streamapp.app", "worker", "-l", "info", "--web-port", str(settings.web_port)],
            log_dir / f"{stage}.log", READY_MARKER, env={**os.environ, **settings.to_env()})

    def stats(self, timeout_s: float = 5.0) -> dict:
        return json.loads(self.get("/streamapp/stats/", timeout_s))

    def get(self, path: str, timeout_s: float = 5.0) -> bytes:
        """The body of a route of the worker's web port, with its token if it has one."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.settings.web_port}{path}")
        if self.settings.web_token:
            request.add_header("Authorization", f"Bearer {self.settings.web_token}")
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read()

    def readiness(self, timeout_s: float = 5.0) -> tuple[int, dict]:
        """``/readyz``: its status (200 ready, 503 not) and the conditions it reports."""
        url = f"http://127.0.0.1:{self.settings.web_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, *, poll_s: float = 0.25) -> T:
    """Poll ``condition`` until it returns something true, and return that; TimeoutError naming
    ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
    return value
