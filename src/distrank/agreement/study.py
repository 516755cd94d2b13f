"""The agreement study's families A1-A6: run one from its config section, write its
outputs under the fixed names.

A family's settings are the keys of its ``agreement.<family>`` config section (see
``workflow/schemas/config.schema.yaml``, which holds the defaults); ``data`` lists
the populations of :mod:`distrank.agreement.data` it runs on. Seeds: data set ``j``
of family ``i`` draws its pairs from ``SeedSequence([seed, i, j])``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from distrank._io import atomic_open
from distrank.agreement import (
    FAMILIES,
    boosting,
    general_losses,
    networks,
    stacking,
    tightness,
    trees,
)
from distrank.agreement.core import lemma_summary
from distrank.agreement.data import digits_binary, digits_onehot, population
from distrank.figures import save
from distrank.tables import write_table

__all__ = ["FAMILIES", "run_family", "write_family"]

CAPTIONS = {
    "stacking": "A1: disagreement of least-squares stacks of k trees, with 4 (R_k - R_2k)",
    "boosting": "A2: disagreement after k boosting rounds; plug-in and rate bounds, log-log slopes",
    "networks": "A3: disagreement of ReLU networks of width n, plug-in bound from width 2n",
    "trees": "A4: disagreement of depth-d regression trees, plug-in bound from depth 2d",
    "tightness": "A5: the stacking construction where the constant 4 is attained",
    "general_losses": "A6: multi-output squared loss and logistic loss, 4/mu and 8/mu bounds",
}

KEYS = {
    "stacking": {"data", "ks", "n_pairs", "n_base", "depth", "n_eval"},
    "boosting": {"data", "ks", "n_train", "max_depth", "n_pairs", "n_eval", "exact_oracle"},
    "networks": {"data", "widths", "n_train", "n_pairs", "restarts", "max_iter", "n_eval"},
    "trees": {"data", "depths", "n_train", "n_pairs", "n_eval"},
    "tightness": {"ks", "sigma2s", "m", "n_pairs"},
    "general_losses": {"depths", "n_train", "n_pairs", "logit_bound"},
}


def _checked(family: str, settings: Mapping) -> dict:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    missing, unknown = KEYS[family] - set(settings), set(settings) - KEYS[family] - {"enabled"}
    if missing or unknown:
        raise ValueError(
            f"agreement.{family}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}"
        )
    return dict(settings)


Tables = tuple[pd.DataFrame, pd.DataFrame, Figure]


def _per_data(
    s: dict, seed: int, key: list[int], pairs_of: Callable[..., pd.DataFrame], names: tuple
) -> pd.DataFrame:
    """``pairs_of(population, **settings, seed=...)`` for every data set of ``s``, with
    the settings ``names`` of ``s``, stacked; data set ``j`` draws from ``[*key, j]``."""
    pops = [population(name, n_eval=s["n_eval"], seed=seed) for name in s["data"]]
    settings = {name: s[name] for name in names}
    return pd.concat(
        [pairs_of(pop, **settings, seed=[*key, j]) for j, pop in enumerate(pops)],
        ignore_index=True,
    )


def _stacking(s: dict, seed: int, key: list[int]) -> pd.DataFrame:
    return _per_data(s, seed, key, stacking.stacking_pairs, ("ks", "n_pairs", "n_base", "depth"))


def _boosting(s: dict, seed: int, key: list[int]) -> pd.DataFrame:
    names = ("ks", "n_train", "max_depth", "n_pairs")
    gbr = _per_data(s, seed, key, boosting.boosting_pairs, names)
    exact = s["exact_oracle"]
    oracle = boosting.exact_oracle_pairs(
        exact["ks"],
        p=exact["p"],
        rho=exact["rho"],
        scale=exact["scale"],
        n_pairs=s["n_pairs"],
        seed=[*key, len(s["data"])],
    )
    return pd.concat([gbr, oracle], ignore_index=True)


def _networks(s: dict, seed: int, key: list[int]) -> pd.DataFrame:
    names = ("widths", "n_train", "n_pairs", "restarts", "max_iter")
    return _per_data(s, seed, key, networks.networks_pairs, names)


def _trees(s: dict, seed: int, key: list[int]) -> pd.DataFrame:
    return _per_data(s, seed, key, trees.trees_pairs, ("depths", "n_train", "n_pairs"))


def _tightness(s: dict, seed: int, key: list[int]) -> pd.DataFrame:
    pairs = tightness.tightness_pairs(
        s["ks"], sigma2s=s["sigma2s"], m=s["m"], n_pairs=s["n_pairs"], seed=[*key, 0]
    )
    return pairs


def _general_losses(s: dict, seed: int, key: list[int]) -> pd.DataFrame:
    common = {"depths": s["depths"], "n_train": s["n_train"], "n_pairs": s["n_pairs"]}
    pairs = pd.concat(
        [
            general_losses.multi_output_pairs(digits_onehot(), **common, seed=[*key, 0]),
            general_losses.logistic_pairs(
                digits_binary(), **common, seed=[*key, 1], logit_bound=s["logit_bound"]
            ),
        ],
        ignore_index=True,
    )
    return pairs


#: Family -> (pairs from settings, summary from pairs, figure from summary).
RUNNERS = {
    "stacking": (_stacking, stacking.stacking_summary, stacking.stacking_figure),
    "boosting": (_boosting, boosting.boosting_summary, boosting.boosting_figure),
    "networks": (_networks, lemma_summary, networks.networks_figure),
    "trees": (_trees, lemma_summary, trees.trees_figure),
    "tightness": (_tightness, tightness.tightness_summary, tightness.tightness_figure),
    "general_losses": (
        _general_losses,
        general_losses.general_losses_summary,
        general_losses.general_losses_figure,
    ),
}


def run_family(family: str, settings: Mapping, *, seed: int) -> Tables:
    """Pairs table, summary table and figure of ``family`` with ``settings`` (its
    config section; ``enabled`` is ignored here).

    Parameters
    ----------
    family : str
        A key of ``FAMILIES``.
    settings : Mapping
        The family's config section: exactly its keys, and optionally ``enabled``.
    seed : int
        The study's seed; family ``i`` of ``FAMILIES`` draws from ``[seed, i, ...]``.

    Returns
    -------
    tuple of (pandas.DataFrame, pandas.DataFrame, matplotlib.figure.Figure)
        The pairs table, the summary table and the figure.

    Raises
    ------
    ValueError
        If ``family`` is unknown, or ``settings`` misses a key or has an unknown one.
    """
    s = _checked(family, settings)
    pairs_of, summary_of, figure_of = RUNNERS[family]
    pairs = pairs_of(s, seed, [seed, list(FAMILIES).index(family)])
    summary = summary_of(pairs)
    return pairs, summary, figure_of(summary)


def write_family(
    family: str,
    pairs: pd.DataFrame,
    summary: pd.DataFrame,
    fig: Figure,
    *,
    results: str | os.PathLike[str],
    figures: str | os.PathLike[str],
) -> dict[str, Path]:
    """Write ``<results>/<stem>.{csv,md,tex}``, ``<results>/<stem>_pairs.csv`` and
    ``<figures>/<stem>.{pdf,png}`` (``stem`` from ``FAMILIES``), atomically.

    Parameters
    ----------
    family : str
        A key of ``FAMILIES``.
    pairs, summary : pandas.DataFrame
        The pairs and summary tables of :func:`run_family`.
    fig : matplotlib.figure.Figure
        Its figure; closed once written.
    results, figures : str or os.PathLike
        The folders of the tables and of the figure.

    Returns
    -------
    dict of str to pathlib.Path
        The written paths, keyed ``"csv"``, ``"md"``, ``"tex"``, ``"pairs"``, ``"pdf"``
        and ``"png"``.

    Raises
    ------
    ValueError
        If ``family`` is unknown.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    stem = FAMILIES[family]
    paths = dict(write_table(summary, Path(results) / stem, caption=CAPTIONS[family]))
    paths["pairs"] = Path(results) / f"{stem}_pairs.csv"
    with atomic_open(paths["pairs"], "w") as handle:
        handle.write(pairs.to_csv(index=False, lineterminator="\n"))
    paths.update(save(fig, Path(figures) / stem))
    return paths
