"""mypy over the package as it installs, with the findings under the repository's own paths.

pyproject's package-dir installs agents/ and tables/ as streamapp.agents and streamapp.tables.
mypy cannot follow that mapping from the source tree, nor through setuptools' editable finder,
so this lays the installed shape out as symlinks in build/mypy-tree ([tool.mypy] mypy_path) and
runs mypy there. Usage: python .ci/typecheck.py [mypy options]; the exit code is mypy's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "build" / "mypy-tree"


def moved_packages(package_dirs: dict[str, str]) -> dict[str, str]:
    """The packages whose folder is not where their dotted name puts it: {name: folder}."""
    return {name: folder for name, folder in package_dirs.items() if folder != name.replace(".", "/")}


def lay_out_tree(package_dirs: dict[str, str]) -> dict[str, str]:
    """Build TREE in the installed shape; return {path prefix in TREE: path prefix in REPO}."""
    shutil.rmtree(TREE, ignore_errors=True)
    prefixes = {}
    for name, folder in moved_packages(package_dirs).items():
        parent, _, leaf = name.rpartition(".")
        if not parent or parent.replace(".", "/") != package_dirs.get(parent):
            raise SystemExit(f"typecheck: {name} -> {folder}: only a direct child of an unmoved package can move")
        real_parent, tree_parent = REPO / parent.replace(".", "/"), TREE / parent.replace(".", "/")
        if not tree_parent.exists():
            tree_parent.mkdir(parents=True)
            for child in real_parent.iterdir():
                if child.name != "__pycache__":
                    (tree_parent / child.name).symlink_to(child)
                    prefixes[relative(tree_parent / child.name)] = relative(child)
        (tree_parent / leaf).symlink_to(REPO / folder)
        prefixes[relative(tree_parent / leaf)] = folder
    return prefixes


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def repository_paths(output: str, prefixes: dict[str, str]) -> str:
    """mypy names files by their path in TREE; name them by their path in the repository."""
    lines = []
    for line in output.splitlines(keepends=True):
        for tree_prefix, repo_prefix in prefixes.items():
            if line.startswith(tree_prefix + "/") or line.startswith(tree_prefix + ":"):
                line = repo_prefix + line[len(tree_prefix):]
                break
        lines.append(line)
    return "".join(lines)


def main() -> int:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    prefixes = lay_out_tree(pyproject["tool"]["setuptools"]["package-dir"])
    proc = subprocess.run([sys.executable, "-m", "mypy", *sys.argv[1:]], cwd=REPO,
                          env={**os.environ, "MYPY_FORCE_COLOR": "0"}, capture_output=True, text=True)
    sys.stdout.write(repository_paths(proc.stdout, prefixes))
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
