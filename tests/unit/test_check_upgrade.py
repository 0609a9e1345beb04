"""`streamapp check-upgrade`'s report: one row per seam with the pinned and the newest version of its
library, the exit code from whether any moved, and the pins read from the installed project, the
Python it pins included."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from streamapp.cli.upgrade import configure, pinned_versions, report, run
from streamapp.errors import StreamappError
from streamapp.kafka import seams

ROOT = Path(__file__).resolve().parents[2]

FOUND = {
    "versions": {"aiokafka": "0.15.0", "faust-streaming": "0.15.3", "python": "3.12.1"},
    "seams": [
        {"name": "write: produce requests unjoined", "package": "aiokafka",
         "moved": "aiokafka.conn:AIOKafkaConnection.send changed"},
        {"name": "consumer: fetch loop", "package": "faust-streaming", "moved": None},
        {"name": "buffers: asyncio's queue internals", "package": "python",
         "moved": "asyncio:Queue.put_nowait changed"},
    ],
}
PINNED = {"aiokafka": "0.14.0", "faust-streaming": "0.15.3", "python": "3.11"}


def test_each_seam_is_a_row_with_both_versions_and_what_moved():
    text, moved = report(PINNED, FOUND)
    header, aiokafka, faust, python, summary = text.splitlines()
    assert header.split() == ["library", "pinned", "newest", "seam", "result"]
    cells = [re.split(r" {2,}", row) for row in (aiokafka, faust, python)]
    assert cells == [
        ["aiokafka", "0.14.0", "0.15.0", "write: produce requests unjoined",
         "moved: aiokafka.conn:AIOKafkaConnection.send changed"],
        ["faust-streaming", "0.15.3", "0.15.3", "consumer: fetch loop", "ok"],
        ["python", "3.11", "3.12.1", "buffers: asyncio's queue internals", "moved: asyncio:Queue.put_nowait changed"],
    ]
    assert aiokafka.index("write:") == faust.index("consumer:") == python.index("buffers:")  # columns line up
    assert (moved, summary) == (2, "2 of 3 seams moved")


def test_none_moved_says_so():
    found = {**FOUND, "seams": [{**seam, "moved": None} for seam in FOUND["seams"]]}
    text, moved = report(PINNED, found)
    assert moved == 0 and text.splitlines()[-1] == "none of 3 seams moved"


def test_the_pins_are_the_projects_exact_ones_for_every_library_a_seam_reaches_into():
    pins = pinned_versions()
    assert {seam.package for seam in seams.SEAMS} <= set(pins)
    assert all(pins[library] == seams.installed_version(library) for library in seams.PACKAGES if library != "python")


def test_the_python_pinned_is_the_projects_minor_version_which_the_image_runs():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    [image] = re.findall(r"^FROM python:(\d+\.\d+)-slim\b", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert requires == f"=={image}.*"
    assert pinned_versions()["python"] == image  # not the interpreter running, whatever its patch level
    assert seams.installed_version("python").startswith(f"{image}.")  # the tests run on the pin


def test_another_python_to_try_must_exist(tmp_path):
    parser = argparse.ArgumentParser()
    configure(parser)
    with pytest.raises(StreamappError, match=r"--python .*python9\.9: no such interpreter"):
        run(parser.parse_args(["--python", str(tmp_path / "python9.9")]))
