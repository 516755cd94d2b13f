"""The package's layers (pyproject.toml, [tool.importlinter]): every import, function-level
ones included, points to a lower layer, so no two layers import each other in a circle."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint_imports(src: Path) -> tuple[int, str]:
    """`lint-imports` on the package under `src`, with the repository's contract."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    run = subprocess.run(
        [str(LINT), "--no-cache", str(REPO / "pyproject.toml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return run.returncode, run.stdout + run.stderr


def counts(output: str) -> tuple[int, int]:
    match = re.search(r"^Contracts: (\d+) kept, (\d+) broken\.$", output, re.MULTILINE)
    assert match, output[-3000:]
    return int(match[1]), int(match[2])


def test_the_package_keeps_its_layers():
    code, output = lint_imports(REPO / "src")
    assert code == 0 and counts(output) == (1, 0), output[-3000:]


def test_a_function_level_import_upward_breaks_the_contract(tmp_path):
    shutil.copytree(REPO / "src/distrank", tmp_path / "distrank")
    with open(tmp_path / "distrank/_io.py", "a") as handle:
        handle.write("\n\ndef _probe():\n    from distrank.metrics import registry\n")
    code, output = lint_imports(tmp_path)
    assert code != 0 and counts(output) == (0, 1), output[-3000:]
    assert "distrank._io is not allowed to import distrank.metrics" in output


def test_no_two_modules_import_each_other_in_a_circle():
    """Within a layer too: for every direct import a -> b, grimp finds no chain b -> ... -> a
    (function-level imports included)."""
    import grimp

    graph = grimp.build_graph("distrank")
    circles = [
        (a, *chain)
        for a in sorted(graph.modules)
        for b in sorted(graph.find_modules_directly_imported_by(a))
        if (chain := graph.find_shortest_chain(importer=b, imported=a))
    ]
    assert circles == []
