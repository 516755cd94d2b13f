r"""E6: precision, recall, density and coverage, centrally (all) vs averaged (avg).

Recall (Kynkäänniemi et al. 2019) is the fraction of *reference* points inside the
generated manifold (union of k-NN balls of the generated samples). That manifold
does not depend on the clients, so each reference point counts the same either way
and :math:`\mathrm{Recall}_\mathrm{all} = \sum_i (n_i/n) \mathrm{Recall}_i` exactly.
Precision and density count *generated* points inside the reference manifold and
coverage uses reference k-NN radii; the pooled reference has different neighbours
than each client's, so these need not agree (paper, Sec. "other metrics").
"""

from __future__ import annotations

from collections.abc import Mapping

from distrank.experiments import Outputs, collected, zoo_scores
from distrank.figures import e6_figure, e6_table
from distrank.metrics._metric import PRDC

__all__ = ["PRDC", "e6_figure", "run"]

TABLES = ("", "_agreement")


scores = zoo_scores


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    table, agreement = e6_table(collected(inputs, context))
    return Outputs(
        {"": table, "_agreement": agreement}, {"": e6_figure(table, context["extractor"])}
    )
