"""The import contracts of pyproject.toml ([tool.importlinter]) hold: tools -> cli -> agents ->
worker -> tables -> vocabulary, the vocabulary imports nothing above it, the stages, the join store
and the topic plan stay off the broker admin, and no package's modules import each other in a
cycle, counting imports made for type checking only.

``agents/`` and ``tables/`` install as streamapp.agents and streamapp.tables from folders outside
``streamapp/``, and import-linter reads a package from its folder, so the check runs on a copy
laid out as installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def installed_layout(into: Path) -> Path:
    package = into / "streamapp"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "streamapp", package, ignore=ignore)
    for folder in ("agents", "tables"):
        shutil.copytree(REPO / folder, package / folder, ignore=ignore)
    return into


@pytest.mark.slow  # lint-imports on a copy of the tree
def test_imports_follow_the_layers(tmp_path):
    root = installed_layout(tmp_path)
    finished = subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml")], cwd=root,
                              env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "0 broken" in finished.stdout


MODULE_CYCLES = """
import grimp
graph = grimp.build_graph("streamapp", include_external_packages=False, exclude_type_checking_imports=False)
cycles = {frozenset(graph.find_shortest_chain(imported, importer) or ()) | {importer, imported}
          for importer in graph.modules for imported in graph.find_modules_directly_imported_by(importer)
          if graph.find_shortest_chain(imported, importer)}
print(len(graph.modules), sorted(sorted(cycle) for cycle in cycles))
"""


@pytest.mark.slow
def test_no_module_imports_itself_through_others(tmp_path):
    """Across packages too, imports for type checking included."""
    root = installed_layout(tmp_path)
    finished = subprocess.run([sys.executable, "-c", MODULE_CYCLES], cwd=root, env={"PYTHONPATH": str(root)},
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    count, cycles = finished.stdout.split(" ", 1)
    assert int(count) > 60 and cycles.strip() == "[]", cycles


def importlinter_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_imports_for_type_checking_only_count():
    assert importlinter_config()["exclude_type_checking_imports"] is False


def test_every_vocabulary_module_is_under_contract():
    config = importlinter_config()
    vocabulary, = (contract for contract in config["contracts"] if contract["name"].startswith("the vocabulary"))
    root_modules = {f"streamapp.{path.stem}" for path in (REPO / "streamapp").glob("*.py")
                    if path.stem not in ("__init__", "app")}
    # streamapp.kafka, the library seams, sits with the vocabulary: the join store uses it.
    assert set(vocabulary["source_modules"]) == root_modules | {"streamapp.kafka"}


IMPORT_ALL = """
import importlib, pkgutil
import streamapp, streamapp.agents, streamapp.tables
packages = (streamapp, streamapp.agents, streamapp.tables)
modules = {m.name for p in packages for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")}
names = sorted(modules - {"streamapp.app"})
for name in names:
    importlib.import_module(name)
from streamapp.worker.stage import Stage
print(len(names), Stage.__name__)
"""


def test_importing_anything_but_the_app_builds_nothing(tmp_path):
    env = {**os.environ, "STREAMAPP_DATA_DIR": "data"}
    env.pop("PYTHONPATH", None)
    finished = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    count, stage = finished.stdout.split()
    assert int(count) > 60 and stage == "Stage"
    assert list(tmp_path.iterdir()) == []


# Every variable read by name (os.environ.get, os.getenv) whose name starts STREAMAPP_, recorded
# before anything is imported; a copy of the whole environment (for a subprocess) is no read.
WATCH_SETTINGS = """
import os
read = set()
Environ, get = type(os.environ), type(os.environ).get
def watched(env, key, default=None):
    if key.startswith("STREAMAPP_"):
        read.add(key)
    return get(env, key, default)
Environ.get = watched
"""


def test_importing_anything_but_the_app_reads_no_setting_and_registers_nothing(tmp_path):
    """A process's settings are the Settings it is handed or reads as it starts: importing a module
    reads none (what an import read would overrule the Settings handed to create_app), nor adds to
    Faust's registries."""
    env = {**os.environ, "STREAMAPP_MAX_FRAME_PIXELS": "1000"}
    env.pop("PYTHONPATH", None)
    told = ("from faust.stores import STORES\nfrom streamapp.tables.window import STORE_SCHEME\n"
            "print(sorted(read), STORE_SCHEME in STORES.aliases)\n")
    finished = subprocess.run([sys.executable, "-c", WATCH_SETTINGS + IMPORT_ALL + told],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.splitlines()[-1] == "[] False"
