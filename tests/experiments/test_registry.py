"""The experiment registry: distrank.experiments finds every e<n>_<name> module or package
in its folder, one a key."""

import pytest

from distrank import experiments


def test_a_package_experiment_is_found_with_its_key_and_stem():
    exp = experiments.get("E4")
    assert exp.stem == "E4_diversity_sweep"
    assert exp.module.__name__ == "distrank.experiments.e4_diversity_sweep"
    assert hasattr(exp.module, "__path__")  # a package
    assert set(exp.steps) == {"e4_sweep_models", "e4_fitted_centralized", "e4_fd_centralized"}
    assert list(experiments.EXPERIMENTS) == sorted(
        experiments.EXPERIMENTS, key=lambda k: int(k[1:])
    )


def test_discovery_reads_modules_and_packages(tmp_path):
    (tmp_path / "e2_beta.py").write_text("")
    (tmp_path / "e10_gamma").mkdir()
    (tmp_path / "e10_gamma" / "__init__.py").write_text("")
    (tmp_path / "helpers.py").write_text("")
    found = experiments._discover([str(tmp_path)])
    assert [(e.key, e.stem) for e in found.values()] == [("E2", "E2_beta"), ("E10", "E10_gamma")]


def test_two_modules_of_one_key_are_refused_by_name(tmp_path):
    (tmp_path / "e4_diversity_sweep").mkdir()
    (tmp_path / "e4_diversity_sweep" / "__init__.py").write_text("")
    (tmp_path / "e4_other.py").write_text("")
    with pytest.raises(RuntimeError, match="E4") as err:
        experiments._discover([str(tmp_path)])
    assert "'e4_diversity_sweep'" in str(err.value) and "'e4_other'" in str(err.value)
