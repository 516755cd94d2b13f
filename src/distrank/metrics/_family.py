"""What a family of metrics implements, and what its paths are given.

A :class:`Family` computes one or more metrics (PRDC's four come from one pass). Its
``plain`` path is required; ``partitions`` and ``resample`` are optional, and where a
family returns None from them the scorer takes the path by scoring afresh. Values
flow as ``{model: {key: (pooled value, per-client values)}}`` (:data:`Values`).
Torch-free: a family imports what it computes with inside its methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

#: model -> output key (a metric, or a spread such as ``kd_std``) -> (pooled, (k,) per client;
#: None where ``Inputs.per_client`` is False and the family skipped them)
Values = dict[str, dict[str, tuple[float, Any]]]


@dataclass(frozen=True)
class Inputs:
    """The checked inputs of every scoring call (``metrics._scoring.prepare``).

    ``metrics.score``, ``metrics.score_partitions`` and ``metrics._bootstrap`` all hand
    their families one of these.

    Attributes
    ----------
    reference
        (n, d) torch tensor of the reference rows.
    partitions
        partition name -> the reference's client groups under it
        (``distrank.clients.ClientGroups``); ``metrics.score`` has one, named "".
    models
        model name -> (m, d) torch tensor of the model's rows.
    options
        the ``ScoreOptions``, with an rbf/laplace bandwidth resolved.
    kernel
        the kernel of KD (None without KD).
    device
        the torch device.
    block_size
        the rows of one product block.
    per_client
        False: only the pooled values are wanted (``metrics._scoring.pooled_of``: a
        client's own scores, the centralized ``all``); a family may then skip its
        per-client values (None in their place), its pooled ones computed as they always
        are, the client groups included (default True).
    """

    reference: Any
    partitions: Mapping[str, Any]
    models: dict[str, Any]
    options: Any  # ScoreOptions
    kernel: Any
    device: Any
    block_size: int
    per_client: bool = True

    @property
    def groups(self):
        """The client groups of the one partition (a plain scoring call's)."""
        if len(self.partitions) != 1:
            raise ValueError(f"inputs: {len(self.partitions)} partitions, expected one")
        return next(iter(self.partitions.values()))

    def partition(self, name: str) -> Inputs:
        """These inputs under partition ``name`` alone."""
        return replace(self, partitions={"": self.partitions[name]})

    def client_rows(self, c: int):
        import torch

        return self.reference[torch.from_numpy(self.groups.rows(c))]


@dataclass
class Run:
    """A prepared computation: ``compute(products=None)`` returns ``Values``.

    Two families may share products (KD's sums from PRDC's distance blocks;
    ``metrics._scoring`` wires them).

    Attributes
    ----------
    compute
        ``compute(products=None)`` -> ``Values`` of the run.
    feeds_products
        whether the run forms every product block a kernel sum needs and hands them to a
        ``kd._sums.SumsBuilder`` passed as ``products`` (default False).
    kernel
        the kernel of the sums that ``from_sums`` takes (default None).
    from_sums
        a ``KernelSums`` -> ``Values``: with ``kernel``, the run can take its values
        from such a builder's ``KernelSums`` instead of its own pass (default None).
    """

    compute: Callable[..., Values]
    feeds_products: bool = False
    kernel: Any = None
    from_sums: Callable[[Any], Values] | None = None


class Family:
    """How a group of metrics is computed (module doc).

    Attributes
    ----------
    uses_kernel
        whether its metrics need KD's kernel (``Inputs.kernel``; default False).
    """

    #: whether its metrics need KD's kernel (``Inputs.kernel``)
    uses_kernel = False

    def plain(self, inputs: Inputs, keys: Sequence[str]) -> Run:
        """The values of ``keys`` for every model, pooled and per client."""
        raise NotImplementedError

    def partitions(self, inputs: Inputs, keys: Sequence[str]) -> dict[str, Values] | None:
        """Partition name -> values of every partition of ``inputs``, sharing the work no
        partition changes; None: score each partition afresh."""
        return None

    def check_resample(self, options) -> None:
        """A ValueError naming the option when the bootstrap cannot resample these metrics
        under ``options`` (a ``ScoreOptions``); by default it always can."""

    def resample(self, inputs: Inputs, keys: Sequence[str], client_draws, model_draws):
        """(batch, len(keys), M, 2 + k) values of a batch of bootstrap resamples
        (``metrics._bootstrap``: ``client_draws[c]`` the drawn rows of client c, (batch,
        n_c), ``model_draws[g]`` of model g); None: score each resample afresh."""
        return None


class Pooled:
    """How a metric's ``all`` comes from statistics the sites share in plain Flower.

    A site (``distrank.flower``) shares them only where its node config says
    ``share-stats``. A subclass gives ``site`` and ``finish`` (``check`` refuses nothing
    by default).

    Attributes
    ----------
    site
        method ``site(x, device=None)``: a site's statistics (name -> numpy array) of
        its rows ``x``.
    check
        method ``check(stats, n)``: refuses malformed statistics (a ValueError).
    finish
        method ``finish(sites, models, device=None)``: each model's ``all`` (model name
        -> value) from every site's (n_i, statistics).
    """

    def site(self, x, device=None) -> dict:
        raise NotImplementedError

    def check(self, stats: Mapping, n: int) -> None:
        """A ValueError unless ``stats`` are statistics this metric's :meth:`site` gives."""

    def finish(self, sites: Sequence, models: Mapping, device=None) -> dict[str, float]:
        """Model name -> ``all``, from ``sites``: (n_i, statistics) of every site."""
        raise NotImplementedError


class SecureSum:
    """How a metric enters Flower's secure mode (``distrank.flower.secure``).

    It gives the entries a site adds to the sum, their public bounds, and what the server
    makes of the sum. ``plan`` is the run's public plan (models, dim, weights,
    feature_bound F, max_rows N, kernel_bound). ``blocks`` lists (name, length, a bound on
    every entry's magnitude) from public settings only; ``site`` gives a site's entries,
    block by block, from its rows and (``needs_scores``) its client scores; ``finish``
    gives, per aggregation, (values, bounds) for every model from the summed blocks, whose
    entries are each off by at most ``errors[block]``.

    Attributes
    ----------
    needs_scores
        whether ``site`` needs the site's client scores (default False).
    moments
        whether the entries hold the site's moments, which its policy must allow
        (``share-stats``; default False).
    own_average
        whether its ``avg`` is the metric's own ``Metric.average`` of the sites' values,
        not the weighted mean that a sum of weighted values gives
        (:class:`~distrank.metrics.Metric` refuses a metric with its own average and a
        secure sum without this; default False).
    """

    needs_scores = False
    moments = False
    own_average = False

    def sensitivity(self, plan, bounds, options) -> dict[str, float | None]:
        """Block -> the L2 norm by which one site's entries can move when one of its rows
        is replaced, under a site's ``bounds`` (``flower.policy.Bounds``) and the request's
        ``options``; None where no bound holds (a site that adds noise refuses it)."""
        return {name: None for name, _, _ in self.blocks(plan)}

    def value_noise(self, plan, models, std: float, n: int, k: int):
        """The noise std of each model's value when the sum's first block carries noise of
        std ``std`` (n rows over k sites); nan where it is not Gaussian in the value."""
        import numpy as np

        return np.full(len(models), np.nan)

    def blocks(self, plan) -> list[tuple[str, int, float]]:
        raise NotImplementedError

    def site(self, plan, x, scores, centre, device=None) -> list:
        raise NotImplementedError

    def finish(self, plan, sums: Mapping, n: int, k: int, centre, models, errors, device=None):
        raise NotImplementedError


class WeightedSum(SecureSum):
    """avg = sum_i w_i D_i / sum_i w_i from each site's w_i D_i.

    w_i = n_i for size weights, 1 for uniform. The masked form of the default
    ``Metric.average`` (``clients.average``), the only one a sum of the sites' weighted
    values gives (a metric with its own average is refused one).

    Parameters
    ----------
    key
        the metric's key: the name of the one block (an entry per model) and of the
        score a site adds (``scores[model][key]``).
    bound
        ``bound(plan)``: a bound on ``abs(D)``; an entry is bounded by it times
        ``plan.max_rows`` under size weights, times 1 under uniform ones.
    unit
        ``unit(bounds, options)``: the most n_i D_i moves when one row is replaced
        (None: unbounded); w_i D_i moves by that over ``min_rows`` under uniform
        weights (default None: no bound).

    Attributes
    ----------
    needs_scores
        True: ``site`` adds the site's client scores.
    """

    needs_scores = True

    def __init__(
        self,
        key: str,
        bound: Callable[[Any], float],
        *,
        unit: Callable[[Any, Any], float | None] | None = None,
    ):
        self.key, self.bound, self.unit = key, bound, unit

    def sensitivity(self, plan, bounds, options) -> dict[str, float | None]:
        """``unit`` per model's w_i D_i, over the plan's models (L2)."""
        unit = None if self.unit is None else self.unit(bounds, options)
        if unit is None:
            return {self.key: None}
        per_model = unit if plan.weights == "size" else unit / bounds.min_rows
        return {self.key: per_model * len(plan.models) ** 0.5}

    def blocks(self, plan) -> list[tuple[str, int, float]]:
        weight = plan.max_rows if plan.weights == "size" else 1
        return [(self.key, len(plan.models), self.bound(plan) * weight)]

    def site(self, plan, x, scores, centre, device=None) -> list:
        import numpy as np

        weight = len(x) if plan.weights == "size" else 1
        return [np.array([weight * scores[m][self.key] for m in plan.models], np.float64)]

    def value_noise(self, plan, models, std: float, n: int, k: int):
        import numpy as np

        return np.full(len(models), std / (n if plan.weights == "size" else k))

    def finish(self, plan, sums: Mapping, n: int, k: int, centre, models, errors, device=None):
        import numpy as np

        weight = n if plan.weights == "size" else k
        bound = np.full(len(plan.models), errors[self.key] / weight)
        return {"avg": (sums[self.key] / weight, bound)}
