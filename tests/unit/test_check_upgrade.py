"""`streamapp check-upgrade`'s report: one row per seam with the pinned and the newest version of its
library, the exit code from whether any moved, and the pins read from the installed project."""

from __future__ import annotations

from streamapp.cli.upgrade import pinned_versions, report
from streamapp.kafka import seams

FOUND = {
    "versions": {"aiokafka": "0.15.0", "faust-streaming": "0.15.3", "python": "3.11.7"},
    "seams": [
        {"name": "write: produce requests unjoined", "package": "aiokafka",
         "moved": "aiokafka.conn:AIOKafkaConnection.send changed"},
        {"name": "consumer: fetch loop", "package": "faust-streaming", "moved": None},
    ],
}
PINNED = {"aiokafka": "0.14.0", "faust-streaming": "0.15.3", "python": "3.11.7"}


def test_each_seam_is_a_row_with_both_versions_and_what_moved():
    text, moved = report(PINNED, FOUND)
    header, aiokafka, faust, summary = text.splitlines()
    assert header.split() == ["library", "pinned", "newest", "seam", "result"]
    assert aiokafka.split()[:3] == ["aiokafka", "0.14.0", "0.15.0"]
    assert aiokafka.endswith("write: produce requests unjoined  moved: aiokafka.conn:AIOKafkaConnection.send changed")
    assert faust.split()[:3] == ["faust-streaming", "0.15.3", "0.15.3"] and faust.split()[-1] == "ok"
    assert aiokafka.index("write:") == faust.index("consumer:")  # columns line up
    assert (moved, summary) == (1, "1 of 2 seams moved")


def test_none_moved_says_so():
    found = {**FOUND, "seams": [{**seam, "moved": None} for seam in FOUND["seams"]]}
    text, moved = report(PINNED, found)
    assert moved == 0 and text.splitlines()[-1] == "none of 2 seams moved"


def test_the_pins_are_the_projects_exact_ones_for_every_library_a_seam_reaches_into():
    pins = pinned_versions()
    assert {seam.package for seam in seams.SEAMS} <= set(pins)
    assert all(pins[library] == seams.installed_version(library) for library in seams.PACKAGES)
