"""The lint and type gate: ruff and mypy, configured in pyproject.toml, report nothing."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # mypy takes a minute without its cache


def require_clean(*command: str) -> None:
    proc = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"python {' '.join(command)} exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}",
                    pytrace=False)


def test_ruff_finds_nothing():
    require_clean("-m", "ruff", "check", "--no-cache", "--output-format", "concise", ".")


def test_mypy_finds_nothing():
    require_clean(".ci/typecheck.py")
