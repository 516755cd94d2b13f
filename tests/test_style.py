"""The tree is clean under the formatters and linters that CI runs (ruff, snakefmt,
snakemake --lint)."""

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


def test_snakemake_lint_is_clean(tmp_path):
    cmd = [str(BIN / "snakemake"), "--lint", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path)]
    cmd += ["--configfile", str(REPO / "config.yaml")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "Congratulations" in run.stdout + run.stderr, (
        run.stdout + run.stderr
    )[-3000:]


#: Files another branch of issue 19 splits (bootstrap_scores, resampled_kernel_sums):
#: empty this when it is merged.
def test_no_function_is_over_80_lines():
    """A longer one is split into named steps (ruff's C901 and PLR0915 bound the rest); its
    docstring does not count."""
    import ast

    long = []
    for path in sorted((REPO / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if ast.get_docstring(node) is not None:
                    doc = node.body[0]
                    lines -= doc.end_lineno - doc.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines})")
    assert not long, long


def test_scripts_only_wire_files_to_functions():
    """A Snakemake entry point is at most 20 lines and defines nothing: its logic lives in
    the package, where it is tested."""
    import ast

    bad = []
    for path in sorted((REPO / "scripts").glob("*.py")):
        text = path.read_text()
        defined = [
            node.name
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        ]
        if len(text.splitlines()) > 20 or defined:
            bad.append(f"{path.name}: {len(text.splitlines())} lines, defines {defined}")
    assert not bad, bad


#: the most lines a module of the package or the benchmarks may have: a longer one is split
#: into rooms (metrics.fd._bands from frechet, experiments.sketch_forms from E11)
MAX_MODULE_LINES = 450


def test_no_module_is_over_450_lines():
    too_long = {
        str(path.relative_to(REPO)): n
        for root in ("src", "bench")
        for path in sorted((REPO / root).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them): {too_long}"


def test_no_module_or_name_of_distrank_is_imported_under_another_name():
    """``from distrank.metrics import table as score_table`` makes a reader learn a second
    name for one thing: the package and its benchmarks import names as they are."""
    import ast

    aliased = []
    for root in ("src", "bench"):
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                module = getattr(node, "module", None) or ""
                for alias in node.names:
                    full = f"{module}.{alias.name}" if module else alias.name
                    if alias.asname and full.startswith("distrank"):
                        where = f"{path.relative_to(REPO)}:{node.lineno}"
                        aliased.append(f"{where} {full} as {alias.asname}")
    assert not aliased, aliased


#: the package's public faces: what users import (docs/api lists them)
FACES = [
    "distrank.metrics",
    "distrank.metrics.kd",
    "distrank.metrics.fd",
    "distrank.metrics.prdc",
    "distrank.metrics.sketch",
    "distrank.clients",
    "distrank.features",
    "distrank.data",
    "distrank.zoo",
    "distrank.training",
    "distrank.experiments",
    "distrank.agreement",
]


@pytest.mark.parametrize("module", FACES)
def test_the_public_face_has_numpy_docstrings(module):
    """Every function and class a public face exports documents its parameters and what it
    returns (or its attributes) in numpy sections, shapes included."""
    import importlib
    import inspect

    face = importlib.import_module(module)
    missing = []
    for name in face.__all__:
        obj = getattr(face, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # constants and registries: documented where they are defined
        doc = inspect.getdoc(obj) or ""
        if inspect.isclass(obj):
            wanted = ("Attributes\n----------",) if "Parameters\n" not in doc else ()
        else:
            signature = inspect.signature(obj)
            returns = signature.return_annotation not in (None, "None")
            wanted = ("Parameters\n----------",) if signature.parameters else ()
            wanted += ("Returns\n-------",) if returns else ()
        missing += [f"{name}: {w.split()[0]}" for w in wanted if w not in doc]
    assert not missing, missing
