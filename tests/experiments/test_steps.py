"""Pre-steps: an experiment's rules beside its own run through scripts/experiment.py,
which finds the function in the module's STEPS by the rule's name."""

import re
from pathlib import Path

import numpy as np
import pytest
from experiments_testkit import clustered_clients

from distrank import experiments
from distrank.experiments import Job, run_rule
from distrank.experiments.e2_fd_counterexample import construct_g2

REPO = Path(__file__).resolve().parents[2]
SHARED_SCRIPTS = {"checkpoint_features.py"}  # one script for E5's and E7's checkpoints


def rules_and_scripts(key: str) -> dict[str, str]:
    """rule name -> its script's file name, in workflow/rules/experiments/<key>.smk."""
    text = (REPO / f"workflow/rules/experiments/{key}.smk").read_text()
    blocks = re.split(r"^rule (\w+):\n", text, flags=re.MULTILINE)[1:]
    found = {}
    for name, body in zip(blocks[::2], blocks[1::2]):
        script = re.search(r'^    script:\n        "([^"]+)"', body, re.MULTILINE)
        found[name] = Path(script[1]).name
    return found


@pytest.mark.parametrize("key", list(experiments.EXPERIMENTS))
def test_every_rule_of_an_experiment_runs_through_the_entry_point(key):
    rules = rules_and_scripts(key)
    exp = experiments.get(key)
    via_entry = {r for r, script in rules.items() if script == "experiment.py"}
    assert via_entry == {key, *exp.steps}, rules
    assert set(rules.values()) <= {"experiment.py", *SHARED_SCRIPTS}, rules


def test_no_relay_script_is_left():
    scripts = {p.name for p in (REPO / "scripts").glob("e[0-9]*.py")}
    assert scripts == set()


def test_a_pre_step_gets_the_rules_files(tmp_path):
    rng = np.random.default_rng(3)
    x, labels, means = clustered_clients(rng, k=4, d=6)
    clients = []
    for c in range(4):
        clients.append(tmp_path / f"c{c}.npz")
        np.savez(clients[-1], features=x[labels == c])
    base = np.concatenate([m + 0.4 * rng.standard_normal((40, 6)) for m in means])
    np.savez(tmp_path / "base.npz", features=base)
    job = Job(
        inputs={"clients": clients, "base": tmp_path / "base.npz"},
        outputs={"g1": tmp_path / "g1.npz", "g2": tmp_path / "g2.npz"},
        params={"classes": None, "seed": 5},
    )
    run_rule("e2_models_centralized", job)
    pooled = np.concatenate([x[labels == c] for c in range(4)])
    owner = np.repeat(np.arange(4), [(labels == c).sum() for c in range(4)])
    with np.load(tmp_path / "g1.npz") as g1, np.load(tmp_path / "g2.npz") as g2:
        np.testing.assert_array_equal(g1["features"], base)
        np.testing.assert_array_equal(
            g2["features"], construct_g2(pooled, owner, base, random_state=5)
        )


@pytest.mark.parametrize("rule", ["e2_nothing", "E99", "e99_models", "all"])
def test_an_unknown_rule_is_named(rule, tmp_path):
    with pytest.raises(ValueError, match=rf"rule {rule!r} is neither"):
        run_rule(rule, Job({}, {}, {}))
