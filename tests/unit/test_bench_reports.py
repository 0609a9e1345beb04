"""Benchmark reports stay small: written on one line, committed gzipped, and docs/ within its
byte budget, so that the runs never again outweigh the code."""

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from streamapp.tools.bench.report import write_json

REPO = Path(__file__).parents[2]
MIB = 1024**2


def tracked(under: str) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", under], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return [REPO / name for name in listed.stdout.decode().split("\0") if name]


def test_a_report_is_written_on_one_line(tmp_path):
    report = {"systems": {"streamapp": {"pairs_per_s": 3728.4, "label": "join × 2"}}, "samples": [[1, 2.5]] * 3}
    write_json(tmp_path / "report.json", report)
    text = (tmp_path / "report.json").read_text()
    assert text.count("\n") == 1 and ", " not in text and ": " not in text
    assert json.loads(text) == report


def test_committed_reports_are_compact_and_gzipped():
    reports = [path for path in tracked("docs") if path.name.startswith("report.json")]
    assert reports
    for path in reports:
        assert path.name == "report.json.gz", f"{path.relative_to(REPO)}: commit it as `gzip -9n report.json`"
        text = gzip.decompress(path.read_bytes()).decode()
        assert text.count("\n") == 1, f"{path.relative_to(REPO)}: not compact"
        json.loads(text)


def test_docs_stay_within_their_budget():
    sizes = {path: path.stat().st_size for path in tracked("docs")}
    assert not [path for path, size in sizes.items() if size > MIB]
    assert sum(sizes.values()) < 3 * MIB
