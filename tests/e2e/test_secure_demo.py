"""The synthetic demo over SASL_SSL + SCRAM-SHA-512 (the ``secure_kafka`` broker): every frame out
exactly once, as the admin, and as the pipeline user holding only the ACLs docs/operations.md
lists (pipeline_acls), on topics an admin made with ``streamapp topics create``."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from streamapp.settings import Settings
from streamapp.tools.demo import DemoOptions, run_demo
from streamapp.tools.localkafka.acls import create_acls, pipeline_acls
from streamapp.tools.localkafka.processes import run_async
from streamapp.tools.localkafka.security import ADMIN, PIPELINE

pytestmark = pytest.mark.e2e


def demo(secure_kafka, settings: Settings, tmp_path) -> dict:
    port = int(secure_kafka.bootstrap.rsplit(":", 1)[1])
    options = DemoOptions(synthetic=True, streams=2, frames=30, fps=20.0, out=tmp_path / "out",
                          broker_port=port, timeout_s=120)
    # A TTL well above the pipeline's latency on a loaded machine, as in test_demo.
    return run_demo(options, settings.replace(join_ttl_s=15.0))


def assert_exactly_once(summary: dict) -> None:
    assert summary["frames_produced"] == 60
    assert summary["exactly_once"] is True and summary["joined"] == 60
    assert summary["ground_truth_mismatches"] == 0


def test_the_demo_over_sasl_ssl_as_admin(secure_kafka, tmp_path):
    assert_exactly_once(demo(secure_kafka, Settings.from_env(secure_kafka.admin_env()), tmp_path))


def test_the_demo_as_the_pipeline_user_with_only_its_acls(secure_kafka, tmp_path):
    prefix = f"sdemo-{uuid.uuid4().hex[:8]}."
    pipeline = Settings.from_env({**secure_kafka.env(PIPELINE), "STREAMAPP_TOPIC_PREFIX": prefix})
    run_async(lambda: create_acls(secure_kafka.bootstrap, f"User:{PIPELINE}", pipeline_acls(pipeline),
                                  secure_kafka.client_options(ADMIN)))
    # The admin makes the topics (the join worker's changelog too); the pipeline user may not.
    env = {name: value for name, value in os.environ.items() if not name.startswith("STREAMAPP_")}
    made = subprocess.run([sys.executable, "-m", "streamapp.cli.main", "topics", "create"], capture_output=True,
                          text=True, timeout=120, env={**env, **secure_kafka.admin_env(),
                                                       "STREAMAPP_TOPIC_PREFIX": prefix, "STREAMAPP_STAGES": "join"})
    assert made.returncode == 0, made.stderr
    assert_exactly_once(demo(secure_kafka, pipeline, tmp_path))
    logs = [path.read_text(errors="replace") for path in (tmp_path / "out" / "logs").rglob("*.log")]
    assert len(logs) == 4 and not any(secure_kafka.passwords[PIPELINE] in log for log in logs)
