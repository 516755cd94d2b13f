"""PRDC per client and pooled, checked against the independent ``prdc`` package."""

import contextlib
import io

import numpy as np
import prdc as reference_prdc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrank.metrics._metric import PRDC
from distrank.metrics.prdc._scores import prdc


def _naeem(real, fake, k):
    """prdc.compute_prdc (Naeem et al.), without its progress print."""
    with contextlib.redirect_stdout(io.StringIO()):
        return {key: float(v) for key, v in reference_prdc.compute_prdc(real, fake, k).items()}


def _expected(real, fake, pr_k, dc_k):
    pr = _naeem(real, fake, pr_k)
    dc = pr if dc_k == pr_k else _naeem(real, fake, dc_k)
    return {
        "precision": pr["precision"],
        "recall": pr["recall"],
        "density": dc["density"],
        "coverage": dc["coverage"],
    }


def _heterogeneous(seed, sizes, m, d):
    """Clients with shifted means and scales (non-iid), and two generated sets."""
    rng = np.random.default_rng(seed)
    parts = [rng.normal(rng.normal(0, 1.5, d), rng.uniform(0.5, 1.5), (size, d)) for size in sizes]
    labels = np.concatenate([np.full(size, c) for c, size in enumerate(sizes)])
    shuffle = rng.permutation(len(labels))
    reference = np.concatenate(parts)[shuffle]
    models = {"close": rng.normal(0, 1.5, (m, d)), "far": rng.normal(0.7, 1.0, (m, d))}
    return reference, labels[shuffle], models


@pytest.mark.parametrize(
    "pr_k, dc_k, d, block_size, model_names",
    [
        (3, 5, 16, None, ("close", "far")),
        (3, 5, 64, 37, ("far",)),  # odd blocks: running k-NN merge, clients split across blocks
        (1, 2, 8, 50, ("close",)),
        (4, 4, 32, None, ("far",)),
    ],
)
def test_equals_prdc_package_pooled_and_per_client(pr_k, dc_k, d, block_size, model_names):
    sizes = [150, 90, 220, 60]
    reference, clients, models = _heterogeneous(1, sizes, 300, d)
    models = {name: models[name] for name in model_names}
    result = prdc(
        reference, clients, models, pr_k=pr_k, dc_k=dc_k, dtype="float64", block_size=block_size
    )
    assert list(result) == list(models)
    reals = {"all": reference} | {str(c): reference[clients == c] for c in range(len(sizes))}
    for name, fake in models.items():
        expected = {key: _expected(real, fake, pr_k, dc_k) for key, real in reals.items()}
        assert result[name] == {
            metric: {key: expected[key][metric] for key in reals} for metric in PRDC
        }


def test_recall_is_consistent_and_the_others_are_not():
    sizes = [150, 90, 220, 60]
    reference, clients, models = _heterogeneous(2, sizes, 300, 16)
    result = prdc(reference, clients, models, dtype="float64")
    weights = {str(c): size / sum(sizes) for c, size in enumerate(sizes)}
    for values in result.values():
        averaged = {
            metric: sum(w * values[metric][c] for c, w in weights.items()) for metric in PRDC
        }
        assert averaged["recall"] == pytest.approx(values["recall"]["all"], abs=1e-12)
        # The client radii differ from the pooled ones, so these do not average.
        for metric in ("precision", "density", "coverage"):
            assert abs(averaged[metric] - values[metric]["all"]) > 1e-3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n_clients=st.integers(1, 6),
    pr_k=st.integers(1, 4),
    m=st.integers(5, 80),
    n=st.integers(30, 150),
)
def test_recall_identity_over_random_partitions(seed, n_clients, pr_k, m, n):
    rng = np.random.default_rng(seed)
    reference = rng.normal(size=(n, 5)) * rng.uniform(0.5, 2.0, 5)
    clients = rng.integers(0, n_clients, n)
    model = rng.normal(0.3, 1.0, (m, 5))
    recall = prdc(
        reference,
        clients,
        {"g": model},
        pr_k=pr_k,
        metrics=["recall"],
        dtype="float64",
        block_size=int(rng.integers(7, 64)),
    )["g"]["recall"]
    labels, sizes = np.unique(clients, return_counts=True)
    averaged = sum(size / n * recall[str(c)] for c, size in zip(labels, sizes))
    assert abs(averaged - recall["all"]) <= 1e-12
    if m >= pr_k + 2:  # prdc's argpartition needs one row more than k + 1
        assert recall["all"] == _naeem(reference, model, pr_k)["recall"]


def test_inputs_torch_and_string_labels_and_metric_subset():
    reference, clients, models = _heterogeneous(3, [80, 120], 100, 8)
    expected = prdc(reference, clients, models, dtype="float64")
    names = np.array(["alice", "bob"])[clients]
    got = prdc(
        torch.from_numpy(reference),
        names,
        {k: torch.from_numpy(v) for k, v in models.items()},
        metrics=("coverage", "recall"),
        dtype="float64",
    )
    for name in models:
        assert list(got[name]) == ["coverage", "recall"]
        for metric in ("coverage", "recall"):
            assert got[name][metric] == {
                "all": expected[name][metric]["all"],
                "alice": expected[name][metric]["0"],
                "bob": expected[name][metric]["1"],
            }


def test_float32_close_to_float64():
    reference, clients, models = _heterogeneous(4, [200, 300], 400, 64)
    # A far-off common offset: centring on the reference mean keeps float32 accurate.
    reference, models = reference + 100.0, {k: v + 100.0 for k, v in models.items()}
    exact = prdc(reference, clients, models, dtype="float64")
    approx = prdc(reference.astype(np.float32), clients, models, dtype="float32")
    for name in models:
        for metric in PRDC:
            for key, value in exact[name][metric].items():
                assert approx[name][metric][key] == pytest.approx(value, abs=0.01)


def test_single_client_equals_pool():
    reference, _, models = _heterogeneous(5, [100], 50, 4)
    result = prdc(reference, np.zeros(100, int), models, dtype="float64")
    for values in result.values():
        for metric in PRDC:
            assert values[metric]["0"] == values[metric]["all"]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda a: a.update(reference=np.where(np.eye(40, 3) > 0, np.nan, a["reference"])),
            "reference: contains NaN",
        ),
        (lambda a: a["models"].update(g=np.full((10, 3), np.inf)), r"models\['g'\]: contains NaN"),
        (lambda a: a["models"].update(g=np.zeros((10, 4))), r"models\['g'\]: dimension 4"),
        (lambda a: a["models"].update(g=np.zeros((0, 3))), r"models\['g'\]: empty"),
        (lambda a: a.update(models={}), "models: expected a non-empty"),
        (
            lambda a: a.update(clients=np.r_[np.zeros(36, int), np.ones(4, int)]),
            "clients: client '1' has 4 rows; k=5",
        ),
        (lambda a: a.update(clients=np.zeros(39, int)), "clients: expected 40 labels"),
        (lambda a: a.update(metrics=("precision", "fidelity")), "metrics: expected"),
        (lambda a: a.update(pr_k=0), "pr_k: expected an integer >= 1"),
        (lambda a: a.update(dtype="float16"), "dtype: expected one of"),
        (lambda a: a.update(reference=np.zeros(40)), "reference: expected a 2-d"),
    ],
)
def test_bad_input_names_the_argument(change, message):
    rng = np.random.default_rng(6)
    args = {
        "reference": rng.normal(size=(40, 3)),
        "clients": np.zeros(40, int),
        "models": {"g": rng.normal(size=(10, 3))},
        "metrics": PRDC,
        "pr_k": 3,
        "dtype": "float64",
    }
    change(args)
    with pytest.raises(ValueError, match=message):
        prdc(args.pop("reference"), args.pop("clients"), args.pop("models"), **args)


def test_small_client_is_fine_for_recall_alone():
    rng = np.random.default_rng(7)
    clients = np.r_[np.zeros(30, int), 1]  # client 1 has one row: no radii needed for recall
    result = prdc(
        rng.normal(size=(31, 3)),
        clients,
        {"g": rng.normal(size=(20, 3))},
        metrics=["recall"],
        dtype="float64",
    )
    assert result["g"]["recall"]["1"] in (0.0, 1.0)


@pytest.mark.parametrize("metrics", [["precision", "density"], ["recall"]])
def test_products_need_the_pooled_and_the_model_blocks(metrics):
    """KD's sums come from PRDC's products only when PRDC forms all of them."""
    from distrank.metrics._kernels import make_kernel
    from distrank.metrics.kd._sums import SumsBuilder

    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(40, 3)), rng.normal(size=(30, 3))
    builder = SumsBuilder(make_kernel("poly", None, 3))
    with pytest.raises(ValueError) as raised:
        prdc(x, np.zeros(40, int), {"g": y}, metrics=metrics, products=builder)
    assert str(raised.value) == (
        "products: KD shares PRDC's products only when recall and one of "
        "precision, density, coverage are wanted"
    )
