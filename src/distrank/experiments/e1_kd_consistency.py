r"""E1: KD ranks models the same centrally and averaged over clients; FD need not.

Theorem 1 (KD = squared MMD, any fixed kernel, weights :math:`\lambda_i = n_i/n`):

.. math::
    \mathrm{KD}_\mathrm{avg}(G) = \mathrm{KD}_\mathrm{all}(G)
        + \sum_i \lambda_i \, \mathrm{KD}(\bar P, P_i),

and the offset does not depend on the model :math:`G`, so the gap
:math:`\mathrm{KD}_\mathrm{avg} - \mathrm{KD}_\mathrm{all}` is the same for every
model and both aggregations rank the zoo identically (Kendall tau = 1). FD has no
such identity (Theorem 2): its gap varies across models and model pairs can swap
order ("rank flips").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from distrank.experiments import Outputs, collected, zoo_scores
from distrank.figures import e1_figure, e1_table, samples_grid
from distrank.metrics._metric import METRIC_KEYS
from distrank.metrics._ranking import discordant_pairs
from distrank.metrics._registry import display
from distrank.metrics._table import kendall_tau

__all__ = ["across_networks", "e1_figure", "e1_samples", "read_per_model", "run"]

TABLES = ("", "_agreement")
FIGURES = ("", "_samples")


scores = zoo_scores


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    table, agreement = e1_table(collected(inputs, context))
    figures = {
        "": e1_figure(table, context["extractor"]),
        "_samples": samples_grid(*e1_samples(inputs["images"], inputs["reference"])),
    }
    return Outputs({"": table, "_agreement": agreement}, figures)


def e1_samples(image_files: Sequence, reference) -> tuple[dict, list[int], list[str] | None]:
    """What :func:`distrank.figures.samples_grid` draws for E1: every model's images
    and labels (by its ``model_<name>.npz`` file name), the reference's classes and
    their names (first ten images of each model when the reference has no labels)."""
    from distrank.data.images import load_image_meta, load_images

    _, ref_labels = load_images(reference)
    classes = list(range(10)) if ref_labels is None else sorted(set(ref_labels.tolist()))
    samples = {}
    for path in image_files:
        name = str(path).rsplit("/", 1)[-1].removeprefix("model_").removesuffix(".npz")
        images, labels = load_images(path)
        samples[name] = (images, None if ref_labels is None else labels)
    return samples, classes, load_image_meta(reference).get("label_names")


def read_per_model(paths: Sequence) -> pd.DataFrame:
    """One study's per-model tables (E1's, E6's: :func:`~distrank.figures.per_model`)
    joined on ``model``."""
    tables = [pd.read_csv(p).set_index("model") for p in paths]
    joined = tables[0]
    for table in tables[1:]:
        joined = joined.join(table[table.columns.difference(joined.columns)], how="outer")
    return joined.reset_index()


def across_networks(
    first: pd.DataFrame,
    second: pd.DataFrame,
    extractors: tuple[str, str],
    metrics: Sequence[str] = METRIC_KEYS,
) -> pd.DataFrame:
    """How two feature networks rank the same models, per metric.

    ``first`` and ``second`` are per-model tables of one study each (:func:`read_per_model`),
    their columns named as on their extractor (``FD_all`` on EfficientNet-Lite0,
    ``FID_all`` on Inception-v3). Columns: ``metric`` (both names), ``n_models``,
    ``kendall_tau`` and ``p_value`` (tau-b between the two networks' ``all`` scores), per
    network ``flips_<extractor>`` (model pairs that ``avg`` and ``all`` order oppositely)
    and ``gap_range_<extractor>`` (max - min over the models of ``avg - all``: zero up to
    rounding for KD on any features, Theorem 1), then ``shared_flips`` (pairs flipped on
    both) and ``same_flips`` (the same pairs on both).
    """
    a, b = (t.set_index("model") for t in (first, second))
    if set(a.index) != set(b.index):
        raise ValueError(
            f"the two studies score different models: {sorted(set(a.index) ^ set(b.index))}"
        )
    b = b.loc[a.index]
    rows = []
    for key in metrics:
        names = [display(key, e) for e in extractors]
        tau, p = kendall_tau(a[f"{names[0]}_all"], b[f"{names[1]}_all"])
        row = {"metric": " / ".join(dict.fromkeys(names)), "n_models": len(a)}
        row |= {"kendall_tau": tau, "p_value": p}
        flips = []
        for table, name, extractor in zip((a, b), names, extractors):
            all_, avg = table[f"{name}_all"].to_numpy(float), table[f"{name}_avg"].to_numpy(float)
            flips.append({frozenset(a.index[[i, j]]) for i, j in discordant_pairs(all_, avg)})
            row[f"flips_{extractor}"] = len(flips[-1])
            row[f"gap_range_{extractor}"] = float(np.ptp(avg - all_))
        row |= {"shared_flips": len(flips[0] & flips[1]), "same_flips": flips[0] == flips[1]}
        rows.append(row)
    return pd.DataFrame(rows)
