"""ScoreOptions: composed of the shared options and every registered metric's own, each
declared once (an ``Option``); the CLI's flags and Flower's request keys are made from
the declarations, the pipeline's schema, config.yaml, the Flower app's TOML and the
engines' restated defaults are checked against them; checked once, taken by every
scorer."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from distrank.cli import build_parser
from distrank.metrics import ScoreOptions, score, score_options
from distrank.metrics._bootstrap import bootstrap_scores, flat_summary
from distrank.metrics._metric import METRIC_KEYS
from distrank.metrics._options import package_specs, specs
from distrank.metrics._reaggregate import score_partitions
from distrank.metrics._scoring import score_client
from distrank.metrics.kd._privacy import private_scores

REPO = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
RNG = np.random.default_rng(19)


def cli_defaults() -> dict:
    args = build_parser("score").parse_args(
        ["score", "--reference", "r.npz", "--model", "a=a.npz", "--out", "s.csv"]
    )
    values = {name: getattr(args, name) for name in ScoreOptions.names()}
    values["metrics"] = tuple(values["metrics"])
    values["kernel_params"] = dict(values["kernel_params"]) or None
    return values


#: The names users write (config keys; with - for _, CLI flags and Flower keys): unchanged.
NAMES = (
    "metrics",
    "kernel",
    "kernel_params",
    "kd_estimator",
    "n_subsets",
    "subset_size",
    "seed",
    "weights",
    "pr_k",
    "dc_k",
    "dtype",
)


def test_the_options_are_their_declarations():
    assert ScoreOptions.names() == tuple(package_specs()) == NAMES
    defaults = ScoreOptions.defaults()
    assert defaults == {name: option.default for name, option in specs().items()}
    assert defaults == ScoreOptions().as_dict() | {"metrics": METRIC_KEYS}
    assert cli_defaults() == defaults
    commands = next(a for a in build_parser("score")._actions if a.dest == "command")
    flags = {a.dest: a for a in commands.choices["score"]._actions if a.dest in defaults}
    for name, option in specs().items():  # each flag is the declaration's
        if name not in ("metrics", "kernel_params"):
            assert flags[name].option_strings == [f"--{option.key}"]
            assert flags[name].help == f"{option.help} (default: %(default)s)"
            assert tuple(flags[name].choices or ()) == option.choices


def test_the_schema_and_config_yaml_are_the_declarations():
    """The schema's metrics section declares the package's options with their defaults,
    values and bounds (a subset of the values: the pipeline scores no KD subsets), and
    config.yaml's metrics section sets options whose every departure from the default
    names the default in its comment."""
    section = SCHEMA["properties"]["metrics"]
    assert "required" not in section  # every key has a default
    options = package_specs()
    for key, spec in section["properties"].items():
        option = options[key]
        default = tuple(spec["default"]) if key == "metrics" else spec["default"]
        assert default == option.default, key
        assert set(spec.get("enum", [])) <= set(option.choices), key
        if option.type is int:
            assert (spec["type"], spec["minimum"]) == ("integer", option.minimum), key
        for value in spec.get("enum", []):  # every value the schema allows is taken
            assert getattr(ScoreOptions(**{key: value}), key) == value
    lines = (REPO / "config.yaml").read_text().split("\nmetrics:\n")[1].split("\n\n")[0]
    config = yaml.safe_load((REPO / "config.yaml").read_text())["metrics"]
    assert score_options(config)  # every key an option, every value one it takes
    for line in lines.splitlines():
        key, _, rest = line.strip().partition(":")
        value, _, comment = rest.partition("#")
        if config[key] != options[key].default:
            assert str(options[key].default) in comment, line


def test_the_flower_run_config_and_request_are_the_declarations():
    pytest.importorskip("flwr")
    from distrank.flower.federation import RUN_CONFIG, RunSettings
    from distrank.flower.secure import SECURE_CONFIG

    app = tomllib.loads((REPO / "src/distrank/flower/app/pyproject.toml").read_text())
    assert app["tool"]["flwr"]["app"]["config"] == RUN_CONFIG | SECURE_CONFIG
    run = RunSettings.from_run_config(
        RUN_CONFIG | {"models": "a=/a.npz", "sites": "x", "out": "/o.csv"}
    )
    assert run.score_options == ScoreOptions(kernel_params={})
    assert run.score_options.as_dict() | {"kernel_params": None} == ScoreOptions().as_dict()
    from distrank.flower.messages import option_keys

    assert tuple(option_keys()) == tuple(n for n in NAMES if n != "weights")  # a site's
    assert tuple(RUN_CONFIG)[4:-1] == tuple(option.key for option in package_specs().values())


def test_no_scorer_restates_a_default():
    options = set(ScoreOptions.names())
    for scorer in (score, score_client, score_partitions, bootstrap_scores, private_scores):
        restated = options & set(inspect.signature(scorer).parameters)
        assert not restated, (scorer.__name__, restated)


def test_the_math_functions_default_to_the_dataclass():
    """The engines below the scorers restate some defaults (they are imported by the
    registry's families, so they cannot import the options): each equals its declaration's,
    and every block size defaults to None (64 MiB blocks, ``_arrays.product_rows``)."""
    from distrank.metrics.kd import _resample as resample
    from distrank.metrics.kd import _subsets as subsets
    from distrank.metrics.kd import _sums as sums
    from distrank.metrics.prdc import _scores as scores

    defaults = ScoreOptions.defaults()
    defaults["estimator"] = defaults["kd_estimator"]
    engines = (
        sums.kernel_sums,
        sums.KDObjective,
        sums.kernel_distance,
        subsets.subset_kd,
        resample.resampled_kernel_sums,
        scores.prdc,
    )
    checked = 0
    for engine in engines:
        for name, parameter in inspect.signature(engine).parameters.items():
            if parameter.default is inspect.Parameter.empty:
                continue
            if name in defaults and name != "metrics":
                assert parameter.default == defaults[name], (engine.__name__, name)
                checked += 1
            if name == "block_size":
                assert parameter.default is None, engine.__name__
    assert checked >= 12


@pytest.mark.parametrize(
    "change,match",
    [
        ({"metrics": ["kd", "fid"]}, "metrics: expected a non-empty subset"),
        ({"kernel": "cosine"}, r"kernel: expected one of \('poly', 'rbf'"),
        ({"kd_estimator": "jackknife"}, "kd_estimator: expected one of"),
        ({"weights": "equal"}, r"weights: expected one of \('size', 'uniform'\)"),
        ({"dtype": "float16"}, "dtype: expected one of"),
        ({"pr_k": 0}, "pr_k: expected an integer >= 1, got 0"),
        ({"dc_k": 2.0}, "dc_k: expected an integer >= 1"),
        ({"n_subsets": True}, "n_subsets: expected an integer"),
        ({"seed": -1}, "seed: expected an integer >= 0"),
        ({"kernel_params": 2.5}, "kernel_params: expected a mapping"),
    ],
)
def test_a_bad_option_is_named_at_construction(change, match):
    with pytest.raises(ValueError, match=match):
        ScoreOptions(**change)


def test_options_are_normalised_and_frozen():
    params = {"bandwidth": 2.0}
    opts = ScoreOptions(metrics=["kd", "kd", "fd"], kernel="rbf", kernel_params=params)
    assert opts.metrics == ("kd", "fd")
    params["bandwidth"] = 3.0  # a copy was kept
    assert opts.kernel_params == {"bandwidth": 2.0}
    with pytest.raises(AttributeError):
        opts.pr_k = 4
    assert opts.replace(pr_k=4).pr_k == 4 and opts.pr_k == 3


def test_a_mapping_such_as_the_pipeline_section_is_read_and_checked():
    section = {"kernel": "poly", "kd_estimator": "biased", "weights": "uniform", "pr_k": 2}
    opts = score_options(section, dtype="float64")
    assert (opts.kd_estimator, opts.weights, opts.pr_k, opts.dtype) == (
        "biased",
        "uniform",
        2,
        "float64",
    )
    with pytest.raises(ValueError, match=r"unknown scoring option\(s\) \['pr-k'\]"):
        score_options({"pr-k": 2})


def test_options_and_keywords_give_the_same_table():
    x, clients = RNG.normal(size=(60, 3)), np.repeat([0, 1, 2], 20)
    models = {"g": RNG.normal(size=(30, 3)), "h": RNG.normal(0.5, size=(30, 3))}
    opts = ScoreOptions(metrics=("kd", "recall"), weights="uniform", dtype="float64", pr_k=2)
    by_options = score(x, clients, models, opts)
    by_keywords = score(
        x, clients, models, metrics=["kd", "recall"], weights="uniform", dtype="float64", pr_k=2
    )
    pd.testing.assert_frame_equal(by_options, by_keywords)
    # a change on top of the options wins
    unequal = np.repeat([0, 1, 2], [10, 20, 30])
    uniform, sized = (
        score(x, unequal, models, opts),
        score(x, unequal, models, opts, weights="size"),
    )
    pooled = uniform[uniform.aggregation == "client"].pivot(
        index=["model", "metric"], columns="client", values="value"
    )
    avg = sized[sized.aggregation == "avg"].set_index(["model", "metric"]).value
    np.testing.assert_allclose(avg, pooled.to_numpy() @ np.array([10, 20, 30]) / 60, rtol=1e-12)
    bootstrap = bootstrap_scores(
        x, clients, models, opts.replace(metrics=("kd",)), summary=flat_summary, n_resamples=3
    )
    kd = by_options[by_options.metric == "kd"]
    np.testing.assert_allclose(
        bootstrap.point.values[0, :, 0], kd[kd.aggregation == "all"].value, rtol=1e-12
    )
