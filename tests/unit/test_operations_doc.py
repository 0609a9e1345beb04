"""docs/operations.md stays complete: every setting and every metric has its row."""

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from streamapp.settings import _ENV
from streamapp.worker.metrics import HELP, Metrics, faust_monitor

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


def rows() -> set[str]:
    """The first cell of every table row, where it is one `code` name."""
    return set(re.findall(r"^\| `([A-Za-z_]+)`", DOC, re.M))


def family_rows() -> set[str]:
    """Rows of the families that prometheus_client and Faust name: `prefix_*`."""
    return set(re.findall(r"^\| `([a-z_]+)\*`", DOC, re.M))


def test_every_setting_is_documented():
    variables = {variable for variable, _ in _ENV.values()} | {"STREAMAPP_RESIZE"}
    assert variables <= rows(), f"not in docs/operations.md: {sorted(variables - rows())}"


def test_every_metric_is_documented():
    assert set(HELP) <= rows(), f"not in docs/operations.md: {sorted(set(HELP) - rows())}"


def test_every_family_on_the_metrics_page_is_documented():
    metrics = Metrics()
    faust_monitor(metrics.registry)
    metrics.inc("join_joined_total")
    names = {sample.name for family in text_string_to_metric_families(metrics.prometheus_text())
             for sample in family.samples}
    # A histogram's samples are documented by its family's row.
    undocumented = {name for name in names if not (
        {name, re.sub(r"_(bucket|sum|count)$", "", name)} & rows()
        or any(name.startswith(prefix) for prefix in family_rows()))}
    assert {"process_", "python_gc_", "faust_"} <= family_rows()
    assert "join_joined_total" in names and not undocumented, f"not in docs/operations.md: {sorted(undocumented)}"
