"""Fixtures of the reliability matrix: the loopback HTTP server of the data tests, and the
small study (small.yaml) run once, cleanly, for the fault and determinism rows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from reliability_kit import REPO, snakemake


def _load_data_conftest():
    # The loopback HTTP server of tests/data; loaded by path, as tests/zoo does.
    path = REPO / "tests/data/conftest.py"
    spec = importlib.util.spec_from_file_location("_distrank_data_conftest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


http_server = _load_data_conftest().http_server  # a fixture


@pytest.fixture(scope="session")
def small_clean(tmp_path_factory) -> Path:
    """A working directory in which small.yaml has run once, uninterrupted, to the end."""
    workdir = tmp_path_factory.mktemp("small-clean")
    run = snakemake(workdir, "--cores", "2")
    assert run.returncode == 0, run.stdout[-5000:]
    return workdir
