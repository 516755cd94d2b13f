"""Positive-definite kernels for the kernel distance (KD), evaluated one block at a time.

::

    poly     k(x, y) = (gamma <x, y> + coef0)^degree     default degree 3, gamma 1/d, coef0 1
    rbf      k(x, y) = exp(-|x - y|_2^2 / (2 bandwidth^2))
    laplace  k(x, y) = exp(-|x - y|_1 / bandwidth)
    linear   k(x, y) = <x, y>

The polynomial defaults are those of KID (Binkowski et al., "Demystifying MMD GANs",
ICLR 2018). A bandwidth is one fixed number for every client and model: Theorem 1
of the paper needs one kernel, so a median heuristic is computed once on the pooled
reference (``median_bandwidth``), never per client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from distrank._arrays import as_features
from distrank._checks import positive_int
from distrank.metrics._metric import BANDWIDTH_KERNELS, KERNELS

_PARAMETERS = {
    "poly": ("degree", "gamma", "coef0"),
    "rbf": ("bandwidth",),
    "laplace": ("bandwidth",),
    "linear": (),
}


def poly_kernel(
    x: torch.Tensor, y: torch.Tensor, *, degree: int, gamma: float, coef0: float
) -> torch.Tensor:
    """k(x, y) = (gamma <x, y> + coef0)^degree for all row pairs (one GEMM)."""
    return torch.mm(x, y.T).mul_(gamma).add_(coef0).pow_(degree)


def sq_norms(x: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """``|x|^2`` of every row, ``block`` rows at a time (no (n, d) temporary)."""
    return torch.cat([(part * part).sum(dim=1) for part in x.split(block)])


def sq_euclidean(
    x: torch.Tensor,
    y: torch.Tensor,
    x_sq: torch.Tensor | None = None,
    y_sq: torch.Tensor | None = None,
) -> torch.Tensor:
    """``|x - y|^2 = |x|^2 + |y|^2 - 2 <x, y>`` for all row pairs, clamped at 0.

    ``x_sq`` and ``y_sq`` are the rows' squared norms (:func:`sq_norms`), computed
    here unless given (PRDC reuses them across blocks).
    """
    x_sq = sq_norms(x) if x_sq is None else x_sq
    y_sq = sq_norms(y) if y_sq is None else y_sq
    return sq_from_gram(torch.mm(x, y.T), x_sq, y_sq)


def sq_from_gram(gram: torch.Tensor, x_sq: torch.Tensor, y_sq: torch.Tensor) -> torch.Tensor:
    """``|x|^2 + |y|^2 - 2 <x, y>`` (clamped at 0) from the products ``gram``, which are
    left as they are: KD and PRDC share one product per block."""
    return torch.add(y_sq.unsqueeze(0), gram, alpha=-2.0).add_(x_sq.unsqueeze(1)).clamp_(min=0.0)


@dataclass(frozen=True)
class Centred:
    """Rows x - c for a fixed centre c (the reference mean), with what a kernel needs
    to undo the centring: ``<x, y> = <x - c, y - c> + shift_x + shift_y`` with
    ``shift = <x - c, c> + |c|^2 / 2``, and ``sq = |x - c|^2``.

    Products of centred rows have less cancellation in the distances of PRDC and the
    rbf kernel, and one product per block serves KD and PRDC (:func:`gram_blocks`).
    """

    rows: torch.Tensor  # (n, d)
    shift: torch.Tensor  # (n,)
    sq: torch.Tensor  # (n,)
    center: torch.Tensor  # (d,)

    @classmethod
    def of(cls, x: torch.Tensor, center: torch.Tensor, *, in_place: bool = False) -> Centred:
        """``x - center`` (into ``x`` itself if ``in_place``) and its shifts and squared norms."""
        rows = x.sub_(center) if in_place else x - center
        half = 0.5 * float(center.double() @ center.double())
        return cls(rows, torch.mv(rows, center).add_(half), sq_norms(rows), center)

    def __getitem__(self, part: slice) -> Centred:
        return Centred(self.rows[part], self.shift[part], self.sq[part], self.center)


def gram_blocks(x: torch.Tensor, y: torch.Tensor | None, block: int):
    """Yield ``(rows, cols, x[rows] @ y[cols].T)`` over blocks of ``block`` rows, rows
    outer; ``y=None``: x with itself, only the blocks on and above the diagonal (on the
    CPU, a block on the diagonal from its own sub-blocks on and above it, mirrored)."""
    n = x.shape[0]
    for r0 in range(0, n, block):
        rows = slice(r0, min(n, r0 + block))
        other, c_first = (x, r0) if y is None else (y, 0)
        for c0 in range(c_first, other.shape[0], block):
            cols = slice(c0, min(other.shape[0], c0 + block))
            if y is None and c0 == r0 and x.device.type == "cpu" and not x.requires_grad:
                yield rows, cols, _self_gram(x[rows])
            else:
                yield rows, cols, torch.mm(x[rows], other[cols].T)


_PARTS = 4  # sub-blocks a side of a diagonal block: 10 of the 16 are formed


def _self_gram(a: torch.Tensor) -> torch.Tensor:
    """a a^T from the products of the sub-blocks on and above its diagonal, the others
    their transposes: 5/8 of one product's flops (on MKL, the same bits in float32;
    float64's last bits differ)."""
    n = a.shape[0]
    step = -(-n // _PARTS)
    out = torch.empty(n, n, dtype=a.dtype)
    for i in range(0, n, step):
        for j in range(i, n, step):
            torch.mm(a[i : i + step], a[j : j + step].T, out=out[i : i + step, j : j + step])
            if j > i:
                out[j : j + step, i : i + step] = out[i : i + step, j : j + step].T
    return out


def rbf_kernel(x: torch.Tensor, y: torch.Tensor, *, bandwidth: float) -> torch.Tensor:
    """``k(x, y) = exp(-|x - y|^2 / (2 bandwidth^2))`` for all row pairs."""
    return sq_euclidean(x, y).mul_(-0.5 / bandwidth**2).exp_()


def laplace_kernel(x: torch.Tensor, y: torch.Tensor, *, bandwidth: float) -> torch.Tensor:
    """``k(x, y) = exp(-|x - y|_1 / bandwidth)`` for all row pairs."""
    # out-of-place mul: cdist's backward reads its output (KDObjective differentiates this)
    return torch.cdist(x, y, p=1.0).mul(-1.0 / bandwidth).exp_()


def linear_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """k(x, y) = <x, y> for all row pairs."""
    return torch.mm(x, y.T)


_FUNCTIONS = {
    "poly": poly_kernel,
    "rbf": rbf_kernel,
    "laplace": laplace_kernel,
    "linear": linear_kernel,
}


@dataclass(frozen=True)
class Kernel:
    """A kernel with every parameter fixed; ``kernel(x, y)`` is the (rows x, rows y) matrix.

    Attributes
    ----------
    name
        One of "poly", "rbf", "laplace", "linear".
    params
        Mapping of every parameter of ``name``, checked (:func:`make_kernel`).
    """

    name: str
    params: Mapping[str, float] = field(default_factory=dict)

    @property
    def translation_invariant(self) -> bool:
        """Whether k(x + c, y + c) = k(x, y), so features may be centred first (less
        cancellation)."""
        return self.name in BANDWIDTH_KERNELS

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _FUNCTIONS[self.name](x, y, **self.params)

    def range(self, radius: float) -> tuple[float, float]:
        """(lo, hi) with lo <= k(x, y) <= hi for all x, y of L2 norm <= ``radius``.

        rbf and laplace: [0, 1]; linear: [-r^2, r^2]; poly: the range of b^degree over
        b in [coef0 - gamma r^2, coef0 + gamma r^2] (<x, y> in [-r^2, r^2]).
        """
        if self.name in BANDWIDTH_KERNELS:
            return 0.0, 1.0
        r2 = float(radius) ** 2
        if self.name == "linear":
            return -r2, r2
        p = self.params
        low, high = p["coef0"] - p["gamma"] * r2, p["coef0"] + p["gamma"] * r2
        ends = (low ** p["degree"], high ** p["degree"])
        even_through_zero = p["degree"] % 2 == 0 and low < 0 < high
        return (0.0 if even_through_zero else min(ends)), max(ends)

    def bound(self, radius: float) -> float:
        """``max abs(k(x, y))`` over x, y of L2 norm <= ``radius`` (:meth:`range`)."""
        return max(abs(v) for v in self.range(radius))

    def from_gram(self, gram: torch.Tensor, a: Centred, b: Centred) -> torch.Tensor:
        """k(a, b) for all row pairs from the centred products ``gram = a.rows @ b.rows.T``,
        which poly and linear overwrite."""
        if self.name == "laplace":
            return laplace_kernel(a.rows, b.rows, **self.params)
        if self.name == "rbf":
            return sq_from_gram(gram, a.sq, b.sq).mul_(-0.5 / self.params["bandwidth"] ** 2).exp_()
        gram = gram.add_(a.shift.unsqueeze(1)).add_(b.shift.unsqueeze(0))
        if self.name == "linear":
            return gram
        p = self.params
        return gram.mul_(p["gamma"]).add_(p["coef0"]).pow_(p["degree"])


def check_kernel_name(name: str) -> str:
    if name not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {name!r}")
    return name


def needs_bandwidth(name: str, params: Mapping | None) -> bool:
    """True for rbf/laplace without an explicit bandwidth in ``params``."""
    return check_kernel_name(name) in BANDWIDTH_KERNELS and "bandwidth" not in (params or {})


def make_kernel(name: str, params: Mapping | None, dim: int) -> Kernel:
    """The kernel ``name`` with ``params`` checked and defaults filled in for dimension ``dim``.

    Parameters
    ----------
    name : {"poly", "rbf", "laplace", "linear"}
    params : mapping or None
        poly: degree (positive int, 3), gamma (positive, 1/dim), coef0 (finite, 1);
        rbf and laplace: bandwidth (positive, required); linear: none.
    dim : int
        The features' dimension d.

    Returns
    -------
    Kernel

    Raises
    ------
    ValueError
        Naming the kernel or the parameter.
    """
    check_kernel_name(name)
    params = dict(params or {})
    unknown = sorted(set(params) - set(_PARAMETERS[name]))
    if unknown:
        raise ValueError(
            f"kernel_params: unknown parameter(s) {unknown} for kernel {name!r} "
            f"(allowed: {list(_PARAMETERS[name])})"
        )
    if name == "poly":
        degree = positive_int(params.get("degree", 3), "kernel_params: degree")
        gamma = params.get("gamma")
        gamma = 1.0 / dim if gamma is None else _positive(gamma, "gamma")
        coef0 = _finite(params.get("coef0", 1.0), "coef0")
        return Kernel(name, {"degree": degree, "gamma": gamma, "coef0": coef0})
    if name in BANDWIDTH_KERNELS:
        if "bandwidth" not in params:
            raise ValueError(
                f"kernel_params: kernel {name!r} needs a 'bandwidth' (see median_bandwidth)"
            )
        return Kernel(name, {"bandwidth": _positive(params["bandwidth"], "bandwidth")})
    return Kernel(name, {})


def median_bandwidth(
    reference, *, kernel: str = "rbf", max_rows: int = 1000, seed: int = 0
) -> float:
    """Median heuristic: the median distance between distinct reference rows.

    Compute it once, on the pooled reference, and pass it to every client (Gretton et
    al., "A Kernel Two-Sample Test", JMLR 2012).

    Parameters
    ----------
    reference : array_like, shape (n, d)
    kernel : {"rbf", "laplace"}
        Euclidean distance for rbf, L1 for laplace.
    max_rows : int
        At most this many rows, drawn without replacement.
    seed : int
        Of ``numpy.random.default_rng``, which draws them.

    Returns
    -------
    float
        The bandwidth h.
    """
    if kernel not in BANDWIDTH_KERNELS:
        raise ValueError(f"kernel: the median heuristic is for 'rbf' or 'laplace', got {kernel!r}")
    positive_int(max_rows, "max_rows", minimum=2)
    x = as_features(reference, "reference")
    if x.shape[0] < 2:
        raise ValueError("reference: the median heuristic needs at least 2 rows")
    if x.shape[0] > max_rows:
        rows = np.random.default_rng(seed).choice(x.shape[0], size=max_rows, replace=False)
        x = x[torch.from_numpy(np.sort(rows)).to(x.device)]
    x = x.to(torch.float64)
    x = x - x.mean(dim=0)
    dist = torch.cdist(x, x, p=2.0 if kernel == "rbf" else 1.0)
    upper = torch.triu_indices(x.shape[0], x.shape[0], offset=1, device=x.device)
    median = float(np.median(dist[upper[0], upper[1]].cpu().numpy()))
    if not median > 0:
        raise ValueError("reference: median distance is 0 (duplicated rows); pass a bandwidth")
    return median


def _positive(value, name: str) -> float:
    value = _finite(value, name)
    if value <= 0:
        raise ValueError(f"kernel_params: {name} must be positive, got {value!r}")
    return value


def _finite(value, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"kernel_params: {name} must be a number, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"kernel_params: {name} must be finite, got {value!r}")
    return value
