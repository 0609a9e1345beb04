"""``agents/`` and ``tables/`` install as ``streamapp.agents`` and ``streamapp.tables``, and never
as top-level ``agents`` / ``tables`` (which would shadow PyTables and others)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import streamapp.agents, streamapp.tables
found = {"streamapp.agents": streamapp.agents.__file__, "streamapp.tables": streamapp.tables.__file__}
for name in ("agents", "tables"):
    try:
        module = __import__(name)
    except ModuleNotFoundError:
        found[name] = None
    else:
        found[name] = [getattr(module, "__file__", None), *getattr(module, "__path__", [])]
print(json.dumps(found))
"""


def probe(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def inside_repo(path: str | None) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(REPO)


def test_stage_and_store_packages_live_in_the_streamapp_namespace(tmp_path):
    found = probe(tmp_path)
    assert Path(found["streamapp.agents"]).resolve() == REPO / "agents" / "__init__.py"
    assert Path(found["streamapp.tables"]).resolve() == REPO / "tables" / "__init__.py"


def test_top_level_agents_and_tables_are_not_this_project(tmp_path):
    found = probe(tmp_path)
    for name in ("agents", "tables"):
        locations = found[name] or []
        assert not any(inside_repo(location) for location in locations), (name, locations)
