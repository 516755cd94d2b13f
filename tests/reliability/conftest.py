"""Fixtures of the reliability matrix: the loopback HTTP server of the data tests. The
small study (small.yaml) run once, cleanly, is tests/conftest.py's ``small_clean``."""

from __future__ import annotations

import importlib.util
import sys

from reliability_kit import REPO


def _load_data_conftest():
    # The loopback HTTP server of tests/data; loaded by path, as tests/zoo does.
    path = REPO / "tests/data/conftest.py"
    spec = importlib.util.spec_from_file_location("_distrank_data_conftest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


http_server = _load_data_conftest().http_server  # a fixture
