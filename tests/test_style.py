"""The tree is clean under the formatters and linters that CI runs (ruff, snakefmt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["snakefmt", "--check", "Snakefile", "workflow"],
    ],
    ids=["ruff-check", "ruff-format", "snakefmt"],
)
def test_clean(command):
    run = subprocess.run(
        [str(BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
