r"""E4: a diversity knob on variance-limited clients (one class per client).

Each *family* is one model swept over one knob that trades diversity for typicality:
the GAN's truncation :math:`\psi`, the VAE's temperature, the diffusion model's
guidance scale (diversity falls as guidance grows), a published checkpoint's
truncation at full scale, and two families computed in feature space (no network):
*simulated*, held-out real features pulled toward their class means,

.. math::  x' = \mu_c + \tau\,(x - \mu_c), \qquad \tau = 1 \text{ is the real data},

and *fitted*, Theorem 2's own setting on the clients' statistics: client i's share
:math:`\lambda_i` of the samples drawn from :math:`N(\mu_i, s\,C_i)`, :math:`\mu_i, C_i`
the mean and covariance of its rows
(:func:`~distrank.zoo.feature_space.fitted_samples`), so that the model's
Gaussian is :math:`N(\bar\mu, sW + B)` (:math:`W = \sum_i \lambda_i C_i`, :math:`B` the
between-client covariance): FD_all is least at :math:`s = 1`, and FD_avg's least
:math:`s` follows in closed form (the ``_theory`` table).

For every knob value, metric and aggregation the score is read from the pipeline's
scoring (clients score locally, the server averages; the pool is scored centrally),
and the table gives the best knob (argmin for distances, argmax for PRDC) of the
curve averaged over ``seeds`` sampling seeds, the spread of each seed's best knob, and
the Spearman correlation of the curve with the knob's diversity. Theorem 1 makes the
KD gap the same for every model, so KD_all and KD_avg pick the same knob. Theorem 2
predicts that on variance-limited clients FD_avg, minimised by the Wasserstein
barycenter of the client Gaussians (no between-client spread), prefers *less*
diversity than FD_all, minimised by the pooled Gaussian (paper.md, "Facts derived from
the theory"). If a knob scaled the model's covariance, :math:`C_Y = sA`, and left its
mean alone, the best scales would be :math:`s^*_\mathrm{all} = (f(\bar C)/\operatorname{tr}A)^2`
and :math:`s^*_\mathrm{avg} = (\sum_i \lambda_i f(C_i)/\operatorname{tr}A)^2` with
:math:`f(C) = \operatorname{tr}(A^{1/2} C A^{1/2})^{1/2}`, concave and monotone, so
:math:`s^*_\mathrm{avg} \le s^*_\mathrm{all}` always.

FD is estimated from samples, with a bias that depends on the sample sizes and on the
spectrum, so on the knob. The centralized pre-step
(``FdSettings``) computes FD in
several *settings*: ``features`` (as scored), ``pca<d>`` (features projected on the
pool's first d principal axes, where the samples exceed d many times) and
``extrapolated`` (FD at several sample sizes, a line in 1/m, its intercept), with
FD's terms (the mean term, tr C_Y and the root term
:math:`\operatorname{tr}(C_X^{1/2} C_Y C_X^{1/2})^{1/2}`: FD_all and FD_avg differ only by
constants and by the root term). The verdict table (``_theorem2``) says, per family and
setting, where FD_all and FD_avg are best, over how many seeds FD_avg's best knob is
less, as or more diverse than FD_all's, and (fitted family) where the theory puts them.

Generated families sample only the classes that the clients hold (balanced), so that
the knob, not the missing classes, is what the scores see; the simulated family uses
the held-out rows of those classes.

The sweep's models, config checks, tables and ``run`` are in
:mod:`~distrank.experiments.e4_diversity_sweep.sweep`, its pre-steps in
:mod:`~distrank.experiments.e4_diversity_sweep.steps` and its figures in
:mod:`~distrank.experiments.e4_diversity_sweep.figures`.
"""

from __future__ import annotations

from distrank.experiments.e4_diversity_sweep.steps import STEPS
from distrank.experiments.e4_diversity_sweep.sweep import (
    FIGURES,
    METRICS,
    TABLES,
    check,
    run,
    scores,
)

__all__ = ["TABLES", "FIGURES", "METRICS", "STEPS", "check", "scores", "run"]
