"""Measured speeds live in docs/benchmarks.md: the README's one table is its current join table, cell
for cell, and the other front docs link there instead of keeping figures that go stale."""

import re
from pathlib import Path

REPO = Path(__file__).parents[2]
RATE = re.compile(r"\d pairs/s")


def first_table(markdown: str, heading: str) -> list[str]:
    """The rows of the first table after `heading`, before the next heading of its level."""
    level = heading.split(" ")[0]
    section = markdown.split(f"\n{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]
    rows: list[str] = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    assert rows, f"no table under {heading}"
    return rows


def test_readme_table_is_the_current_join_table():
    readme = first_table((REPO / "README.md").read_text(), "## Benchmarks")
    current = first_table((REPO / "docs" / "benchmarks.md").read_text(), "## Join benchmark")
    assert readme == current


def test_front_docs_state_no_rates_of_their_own():
    readme = (REPO / "README.md").read_text()
    for row in first_table(readme, "## Benchmarks"):
        readme = readme.replace(row, "")
    texts = {"README.md": readme, **{name: (REPO / "docs" / name).read_text()
                                     for name in ("architecture.md", "operations.md")}}
    for name, text in texts.items():
        assert not RATE.findall(text), f"{name}: link to docs/benchmarks.md instead of stating a rate"
