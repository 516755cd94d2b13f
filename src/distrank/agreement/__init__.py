r"""The second study: model agreement via anchoring, measured.

E. Eaton, S. Goel, M. Hussing, M. Kearns, A. Roth, S. B. Sengupta, J. Sorrell,
"Model Agreement via Anchoring", arXiv:2602.23360 (2026), prove that two models
trained independently disagree little, :math:`D(f_1, f_2) = \mathbb E (f_1(x) -
f_2(x))^2 \to 0`, as a natural resource grows, by anchoring both to their average
:math:`\bar f` and the midpoint identity

.. math::
    D(f_1, f_2) = 2\bigl(\mathrm{MSE}(f_1) + \mathrm{MSE}(f_2) - 2\,\mathrm{MSE}(\bar f)\bigr).

The paper has no experiments; this package is its empirical companion, one module
per family (scikit-learn only, CPU, seeded):

========================  ==============================  ==========================
module                    family (resource)               output stem
========================  ==============================  ==========================
:mod:`.stacking`          stacked trees (:math:`k`)       ``A1_stacking``
:mod:`.boosting`          gradient boosting (rounds)      ``A2_boosting``
:mod:`.networks`          ReLU networks (width)           ``A3_networks``
:mod:`.trees`             regression trees (depth)        ``A4_trees``
:mod:`.tightness`         the constant 4 is attained      ``A5_tightness``
:mod:`.general_losses`    multi-output, logistic loss     ``A6_general_losses``
========================  ==============================  ==========================

:mod:`.core` holds the identity, the learning-curve bound, the pair runner and the
intervals; :mod:`.data` the distributions; :mod:`.figures` the shared figure;
:mod:`.study` runs a family from its config section and writes its outputs.
"""

from distrank._lazy import lazy_getattr, lazy_names

#: Family -> output stem (fixed names); torch-, scipy- and scikit-learn-free, for the
#: Snakefile.
FAMILIES = {
    "stacking": "A1_stacking",
    "boosting": "A2_boosting",
    "networks": "A3_networks",
    "trees": "A4_trees",
    "tightness": "A5_tightness",
    "general_losses": "A6_general_losses",
}

_LAZY = {  # submodule -> the names it defines
    "core": (
        "learning_curve_pairs",
        "lemma_bound",
        "loss_terms",
        "mean_ci",
        "midpoint_terms",
        "summarize",
    ),
    "study": ("run_family", "write_family"),
}

__all__ = ["FAMILIES", *lazy_names(_LAZY)]


# PEP 562: the rest loads scipy and scikit-learn on first use
__getattr__ = lazy_getattr(__name__, _LAZY)
