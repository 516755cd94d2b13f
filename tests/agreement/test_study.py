"""Every family runs from a config section and writes its outputs under the fixed
names; a misspelt key is named; failure points are marked on the figure."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from distrank.agreement.figures import FAILURE_LABEL, agreement_figure
from distrank.agreement.study import FAMILIES, run_family, write_family

TINY = {
    "stacking": {
        "data": ["friedman1", "diabetes"],
        "ks": [1, 2],
        "n_pairs": 2,
        "n_base": 50,
        "depth": 2,
        "n_eval": 300,
    },
    "boosting": {
        "data": ["friedman1"],
        "ks": [1, 2, 4],
        "n_train": 200,
        "max_depth": 2,
        "n_pairs": 2,
        "n_eval": 300,
        "exact_oracle": {"p": 8, "rho": 0.5, "scale": 1.0, "ks": [1, 2, 4, 8]},
    },
    "networks": {
        "data": ["friedman1"],
        "widths": [1, 2],
        "n_train": 200,
        "n_pairs": 2,
        "restarts": 1,
        "max_iter": 100,
        "n_eval": 300,
    },
    "trees": {
        "data": ["friedman1", "diabetes"],
        "depths": [1, 2],
        "n_train": 200,
        "n_pairs": 2,
        "n_eval": 300,
    },
    "tightness": {"ks": [1, 2, 4], "sigma2s": [1.0, 4.0], "m": 500, "n_pairs": 2},
    "general_losses": {"depths": [1, 2], "n_train": 300, "n_pairs": 2, "logit_bound": 3.0},
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_writes_fixed_names(family, tmp_path):
    pairs, summary, fig = run_family(family, {"enabled": True, **TINY[family]}, seed=0)
    for col in ("resource", "pair", "D"):
        assert col in pairs
    assert {"D_mean", "D_lo", "D_hi", "failure", "n_pairs"} <= set(summary.columns)
    paths = write_family(
        family, pairs, summary, fig, results=tmp_path / "results", figures=tmp_path / "figures"
    )
    stem = FAMILIES[family]
    expected = {tmp_path / "results" / f"{stem}.{ext}" for ext in ("csv", "md", "tex")}
    expected |= {tmp_path / "results" / f"{stem}_pairs.csv"}
    expected |= {tmp_path / "figures" / f"{stem}.{ext}" for ext in ("pdf", "png")}
    assert set(paths.values()) == expected and all(p.stat().st_size > 0 for p in expected)
    back = pd.read_csv(tmp_path / "results" / f"{stem}_pairs.csv")
    np.testing.assert_array_equal(back["D"].to_numpy(), pairs["D"].to_numpy())  # full precision


def test_runs_are_seeded():
    a = run_family("trees", TINY["trees"], seed=3)[0]
    b = run_family("trees", TINY["trees"], seed=3)[0]
    c = run_family("trees", TINY["trees"], seed=4)[0]
    assert a.equals(b) and not a["D"].equals(c["D"])


def test_misspelt_key_is_named():
    with pytest.raises(
        ValueError, match=r"^agreement\.trees: missing keys \[\], unknown keys \['n_pair'\]$"
    ):
        run_family("trees", {**TINY["trees"], "n_pair": 3}, seed=0)
    with pytest.raises(ValueError, match=r"^family must be one of .*, got 'forests'$"):
        run_family("forests", {}, seed=0)


def test_failure_points_are_marked():
    summary = pd.DataFrame(
        {
            "data": "friedman1",
            "resource": [1, 2, 4],
            "D_mean": [1.0, 1.0, 1.0],
            "D_lo": 0.9,
            "D_hi": 1.1,
            "bound_mean": [3.0, 0.5, -1.0],
            "bound_lo": 0.0,
            "bound_hi": 4.0,
            "failure": [False, True, True],
        }
    )
    fig = agreement_figure(summary, resource_label="k", bounds={"bound": "bound"})
    marked = [line for line in fig.axes[0].lines if line.get_label() == FAILURE_LABEL]
    assert len(marked) == 1 and list(marked[0].get_xdata()) == [2.0, 4.0]


def _agreement_schema():
    import yaml

    root = Path(__file__).resolve().parents[2]
    schema = yaml.safe_load((root / "workflow/schemas/config.schema.yaml").read_text())
    config = yaml.safe_load((root / "config.yaml").read_text())
    sub = {**schema["properties"]["agreement"], "$defs": schema["$defs"]}
    return sub, config["agreement"]


def test_schema_checks_the_default_section_and_names_a_typo():
    import copy

    import jsonschema

    schema, section = _agreement_schema()
    jsonschema.validate(section, schema)
    assert set(section) - {"enabled"} == set(FAMILIES)
    for family, settings in section.items():
        if family != "enabled":
            assert settings["n_pairs"] >= 30  # the study's intervals
    bad = copy.deepcopy(section)
    bad["trees"]["depht"] = bad["trees"].pop("depths")
    with pytest.raises(
        jsonschema.ValidationError,
        match=r"^Additional properties are not allowed \('depht' was unexpected\)",
    ):
        jsonschema.validate(bad, schema)
