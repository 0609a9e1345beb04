"""``streamapp check-upgrade``: which seams (streamapp.kafka) the newest releases of the libraries
move, checked in a scratch environment, never in the one running.

It makes a virtual environment in a temporary folder, installs the newest releases of the
libraries the seams reach into from PyPI without constraints (pip resolves them together), installs
this project there without its dependencies, and runs the seam checks there
(``python -m streamapp.kafka.seams``). It prints one row per seam and exits 0 when none moved.
The environment's Python is the one running, or ``--python``'s (a newer one to try), reported
against the minor version the project pins (``requires-python``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from streamapp.errors import ExitCode, StreamappError
from streamapp.kafka.seams import PACKAGES

HELP = ("install the newest aiokafka, Faust, mode and prometheus_client in a scratch environment "
        "and report which seams moved")
PIP_TIMEOUT_S = 900
# What pip needs of the source to install the project (pyproject.toml's packages and readme).
PROJECT_FILES = ("pyproject.toml", "README.md", "streamapp", "agents", "tables")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep", action="store_true", help="keep the scratch environment and print where it is")
    parser.add_argument("--python", default=sys.executable, metavar="PATH",
                        help="the Python to make the scratch environment with (default: the one running)")


def run(args: argparse.Namespace) -> int:
    source = project_source()
    python = shutil.which(args.python)
    if python is None:
        raise StreamappError(f"--python {args.python}: no such interpreter", "give the path of a Python to try")
    scratch = Path(tempfile.mkdtemp(prefix="streamapp-check-upgrade-"))
    try:
        found = scratch_results(scratch, source, python)
    finally:
        if args.keep:
            print(f"scratch environment: {scratch}/venv")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    text, moved = report(pinned_versions(), found)
    print(text)
    return ExitCode.SEAM_MOVED if moved else 0


def project_source() -> Path:
    """This project's source folder (pip installs it from there)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise StreamappError(f"no pyproject.toml at {root}: streamapp is installed without its source",
                             "run check-upgrade from a clone of the repository (pip install -e .)")
    return root


def pinned_versions() -> dict[str, str]:
    """The exact pins of this project's dependencies (``name==version``), and its Python's minor
    version (``requires-python = "==3.11.*"``)."""
    pins = {}
    for requirement in metadata.requires("streamapp") or []:
        pinned = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", requirement.strip())
        if pinned:
            pins[pinned.group(1)] = pinned.group(2)
    python = re.fullmatch(r"==(\d+\.\d+)\.\*", metadata.metadata("streamapp")["Requires-Python"] or "")
    pins["python"] = python.group(1) if python else "?"
    return pins


def scratch_results(scratch: Path, source: Path, interpreter: str) -> dict[str, Any]:
    venv = scratch / "venv"
    python = venv / "bin" / "python"
    _run([interpreter, "-m", "venv", str(venv)], f"make the scratch environment with {interpreter}")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--upgrade", *(library for library in PACKAGES if library != "python")],
         "install the newest releases from PyPI (is PyPI reachable?)")
    # From a copy: pip would leave its build folder in the source. On any Python: trying one
    # outside the pin is the point.
    _run([*pip, "--no-deps", "--ignore-requires-python", str(_copy_project(source, scratch / "source"))],
         "install this project into the scratch environment")
    # From the scratch folder: the source folder on sys.path would shadow what was installed.
    checked = _run([str(python), "-m", "streamapp.kafka.seams"], "run the seam checks", cwd=scratch)
    return json.loads(checked)


def _copy_project(source: Path, into: Path) -> Path:
    into.mkdir()
    for part in PROJECT_FILES:
        if (source / part).is_dir():
            shutil.copytree(source / part, into / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(source / part, into / part)
    return into


def _run(command: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        finished = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise StreamappError(f"could not {what}: no answer in {PIP_TIMEOUT_S} s") from exc
    if finished.returncode != 0:
        last = (finished.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise StreamappError(f"could not {what}: {last}")
    return finished.stdout


def report(pinned: dict[str, str], found: dict[str, Any]) -> tuple[str, int]:
    """The table of every seam (library, pinned, newest, ok or what moved) and how many moved."""
    newest = found["versions"]
    rows = [("library", "pinned", "newest", "seam", "result")]
    moved = 0
    for seam in found["seams"]:
        library = seam["package"]
        moved += seam["moved"] is not None
        result = "ok" if seam["moved"] is None else f"moved: {seam['moved']}"
        rows.append((library, pinned.get(library, "?"), newest.get(library, "?"), seam["name"], result))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4]
             for row in rows]
    lines.append(f"{moved} of {len(found['seams'])} seams moved" if moved else
                 f"none of {len(found['seams'])} seams moved")
    return "\n".join(lines), moved
