"""docs/operations.md stays complete: every setting and every metric has its row."""

import re
from pathlib import Path

from streamapp.metrics import HELP
from streamapp.settings import _ENV

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


def rows() -> set[str]:
    """The first cell of every table row, where it is one `code` name."""
    return set(re.findall(r"^\| `([A-Za-z_]+)`", DOC, re.M))


def test_every_setting_is_documented():
    variables = {variable for variable, _ in _ENV.values()} | {"STREAMAPP_RESIZE"}
    assert variables <= rows(), f"not in docs/operations.md: {sorted(variables - rows())}"


def test_every_metric_is_documented():
    assert set(HELP) <= rows(), f"not in docs/operations.md: {sorted(set(HELP) - rows())}"
