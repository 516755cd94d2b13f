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

import pandas as pd

from distrank.experiments import Outputs, collected, per_model, zoo_scores
from distrank.figures import e1_figure, samples_grid
from distrank.metrics.registry import display

__all__ = ["e1_table", "e1_figure", "e1_samples", "run"]

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


def e1_table(
    scores: pd.DataFrame, metrics: Sequence[str] = ("kd", "fd")
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-model aggregates and per-metric rank agreement for E1.

    Parameters
    ----------
    scores : tidy score table (``model, metric, aggregation, client, value``) with
        ``all`` and ``avg`` rows for every model and metric.
    metrics : metric keys to tabulate, distances first (``"kd"``, ``"fd"``).

    Returns
    -------
    per_model : :func:`distrank.experiments.per_model` with ``<M>_gap`` (``avg - all``),
        sorted by the first metric's ``all`` rank (best first).
    agreement : per metric ``kendall_tau`` (tau-b of avg vs all), ``p_value``,
        ``n_models``, ``rank_flips`` (discordant model pairs).
    """
    table, agreement = per_model(scores, metrics, difference="gap")
    first = display(metrics[0])
    table = table.sort_values([f"{first}_all_rank", "model"], kind="mergesort").reset_index(
        drop=True
    )
    return table, agreement
