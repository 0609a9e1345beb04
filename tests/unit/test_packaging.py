"""``agents/`` and ``tables/`` install as ``streamapp.agents`` and ``streamapp.tables``, and never
as top-level ``agents`` / ``tables`` (which would shadow PyTables and others). The package the
image installs holds what runs in production; the tools are a distribution of their own, the
``tools`` extra, and their commands say what to install when it is missing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

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


# --- the production package and the tools distribution -----------------------------------------

TOOLS = "streamapp/tools"


def tracked(*folders: str) -> list[str]:
    listed = subprocess.run(["git", "ls-files", *folders], cwd=REPO, capture_output=True, text=True, check=True)
    return listed.stdout.split()


def image_sources(into: Path) -> Path:
    """The files the Dockerfile copies into /src before `pip install /src`, copied into ``into``."""
    copies = [line.split()[1:] for line in (REPO / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and "--from" not in line]
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for *sources, _ in copies:
        for source in sources:
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, into / source, ignore=ignore)
            else:
                shutil.copy(REPO / source, into / source)
    return into


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, zipfile.ZipFile]:
    """The wheels of the image's sources and of the tools, built as pip builds them."""
    source = image_sources(tmp_path_factory.mktemp("src"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--disable-pip-version-check",
                    "-w", str(dist), str(source), str(source / TOOLS)], check=True, timeout=600)
    return {path.name.split("-")[0]: zipfile.ZipFile(path) for path in dist.glob("*.whl")}


def installed_path(repo_path: str) -> str:
    for folder in ("agents", "tables"):
        if repo_path.startswith(folder + "/"):
            return "streamapp/" + repo_path
    return repo_path


def modules_and_data(wheel: zipfile.ZipFile) -> set[str]:
    return {name for name in wheel.namelist() if ".dist-info/" not in name}


def metadata(wheel: zipfile.ZipFile, name: str) -> str:
    [path] = [path for path in wheel.namelist() if path.endswith(".dist-info/" + name)]
    return wheel.read(path).decode()


def test_the_image_installs_production_only(wheels):
    production = modules_and_data(wheels["streamapp"])
    assert not {path for path in production if path.startswith(TOOLS + "/")}
    expected = {installed_path(path) for path in tracked("streamapp", "agents", "tables")
                if not path.startswith(TOOLS + "/")}
    assert production == expected
    assert "streamapp = streamapp.cli.main:main" in metadata(wheels["streamapp"], "entry_points.txt")


def test_the_tools_are_one_extra_away(wheels):
    assert modules_and_data(wheels["streamapp_tools"]) == {
        path for path in tracked(TOOLS) if path != TOOLS + "/pyproject.toml"}
    requires = metadata(wheels["streamapp"], "METADATA")
    assert "Requires-Dist: streamapp-tools==0.1.0; extra == \"tools\"" in requires
    assert "Requires-Dist: streamapp==0.1.0" in metadata(wheels["streamapp_tools"], "METADATA")


def test_the_test_extra_brings_what_the_tools_need():
    """The tests import the tools from the checkout, not through the streamapp-tools distribution."""
    tools = tomllib.loads((REPO / TOOLS / "pyproject.toml").read_text())["project"]["dependencies"]
    test_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert set(tools) - {"streamapp==0.1.0"} <= set(test_extra)


RUN_CLI = "import sys; from streamapp.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def production_only(wheels, tmp_path_factory) -> Callable[..., subprocess.CompletedProcess]:
    """``streamapp`` as the production wheel alone installs it, the tools absent: the wheel
    unpacked first on the path, then this environment's libraries, without its site hooks (the
    checkout's editable installs)."""
    target = tmp_path_factory.mktemp("site")
    wheels["streamapp"].extractall(target)
    path = os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])

    def streamapp(*argv: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", "-c", RUN_CLI, *argv], cwd=target, capture_output=True,
                              text=True, env={"PYTHONPATH": path, "PATH": os.environ["PATH"], **env}, timeout=120)

    return streamapp


@pytest.mark.parametrize("argv", [["bench", "join", "--pairs", "3"], ["demo", "--synthetic"], ["broker"],
                                  ["record", "--help"]])
def test_a_tool_without_the_tools_says_what_to_install(production_only, argv):
    finished = production_only(*argv)
    assert finished.returncode == 1, finished.stderr
    assert finished.stderr == (f"streamapp: error: `streamapp {argv[0]}` comes with the streamapp tools, which are "
                               "not installed — pip install 'streamapp[tools]' (in a checkout: pip install "
                               "./streamapp/tools)\n")


def test_production_commands_run_without_the_tools(production_only):
    """What the image runs (docker-compose.yml, the chart): the commands list, and ``topics create``
    and ``produce`` load all they need and get as far as the broker (none answers here: exit 6)."""
    listed = production_only("--help")
    assert listed.returncode == 0, listed.stderr
    assert "topics" in listed.stdout and "produce" in listed.stdout
    assert "bench" in listed.stdout and "[needs streamapp[tools]]" in listed.stdout
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"kafka://127.0.0.1:{closed.getsockname()[1]}"
    for argv in (["topics", "create"], ["produce", "--synthetic", "--frames", "1"]):
        finished = production_only(*argv, STREAMAPP_BROKER=nobody)
        assert finished.returncode == 6, finished.stderr
        assert finished.stderr.startswith("streamapp: error: no Kafka broker answers"), finished.stderr
