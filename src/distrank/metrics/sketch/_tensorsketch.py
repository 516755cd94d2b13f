r"""TensorSketch of KID's cubic kernel: a mean sketch per site for the poly kernel.

KID's kernel (:func:`~distrank.metrics.make_kernel`, ``poly``) is a pure cubic of an
augmented inner product: with :math:`x' = [\sqrt\gamma\, x, \sqrt{c}]` (one constant
coordinate; :math:`c \ge 0`),

.. math::
    k(x, y) = (\gamma \langle x, y\rangle + c)^3 = \langle x', y'\rangle^3
            = \langle x'^{\otimes 3}, y'^{\otimes 3}\rangle .

TensorSketch (Pham and Pagh, "Fast and scalable polynomial kernels via explicit
feature maps", KDD 2013) count-sketches :math:`x'^{\otimes 3}` without forming it:
three count sketches :math:`C_j x' = \sum_i s_j(i) x'_i e_{h_j(i)}` (hashes
:math:`h_j` into D buckets, signs :math:`s_j = \pm 1`, all drawn from a public seed)
are combined by circular convolution,

.. math::
    \psi(x) = \mathcal F^{-1}\big(\mathcal F(C_1 x') \odot \mathcal F(C_2 x')
        \odot \mathcal F(C_3 x')\big),

which is exactly the count sketch of :math:`x'^{\otimes 3}` under the hash
:math:`H(a, b, c) = h_1(a) + h_2(b) + h_3(c) \bmod D` and sign
:math:`s_1(a) s_2(b) s_3(c)`; so :math:`\mathbb E[\psi(x)\cdot\psi(y)] = k(x, y)`.

The map is linear on the tensor space, so the difference of two mean sketches is
the sketch of the difference of the mean embeddings: the KD estimate's error scales
with KD itself (roughly :math:`\sqrt{c_3/D}` relative, :math:`c_3` a constant of
the degree), not with the :math:`k(x, x) \sim |x'|^6` scale of each term, as long as
both sides use the same map (``bench/bench_sketch.py --tensorsketch`` measures it).

**U-statistic.** :math:`\|\psi(x)\|^2` is random (its mean is :math:`k(x, x)`), so the
sketch keeps the mean of each row's sketched squared norm (``meta["diagonal"]``) and
:func:`tensorsketch_kd` removes exactly that: the estimate is the U-statistic of the
sketched kernel, unbiased for the exact U-statistic (KID's).

**Privacy.** Rows are clipped to :math:`\|x\| \le C` (``clip_norm``), so
:math:`\|x'\|^2 \le R^2 = \gamma C^2 + c` and :math:`\mathbb E\|\psi(x)\|^2 =
\|x'\|^6 \le R^6`: a bound in expectation only. The deterministic bound for the
public hashes (:meth:`TensorSketchMap.norm_bound`) is
:math:`\|\psi(x)\| \le \|C_1 x'\|_1 \|C_2 x'\|_1 \|C_3 x'\|_2 \le (d+1)\sqrt{L_3}\,R^3`
(:math:`L_3` the largest bucket of :math:`h_3`): about :math:`10^4 R^3` at d = 2048,
so noise calibrated to it would drown the sketch. A private release therefore also
clips the sketched rows, :math:`\psi(x) \leftarrow \psi(x)\min(1, B/\|\psi(x)\|)`
(``feature_norm`` B), which makes the sensitivity of the mean sketch 2B/n
deterministically, at the price of a bias from the rows it clips.
"""

from __future__ import annotations

import math

import numpy as np

from distrank._checks import positive_int
from distrank.metrics.sketch._maps import VERSION, Sketch

DEGREE = 3
#: the metadata fields two TensorSketches scored together must share
MAP_FIELDS = ("version", "kernel", "input_dim", "dim", "seed", "gamma", "coef0", "clip_norm")
#: metadata ``kernel`` of a TensorSketch
KERNEL = "poly3-tensorsketch"


class TensorSketchMap:
    """TensorSketch psi of (gamma <x, y> + coef0)^3 on ``input_dim``-d rows.

    ``dim`` features, hashes and signs from ``seed``. Hashes of a map of dim D' dividing
    D are those of D mod D'. A bad argument is a ValueError naming it.

    Parameters
    ----------
    input_dim
        d, the features of each row (>= 1).
    dim
        D, the features of the sketch (>= 2).
    gamma
        > 0, the scale of the inner product (None, the default: 1 / input_dim).
    coef0
        c >= 0, the constant (default 1.0).
    seed
        of the hashes and signs (default 0).
    clip_norm
        C: scales rows with ``|x| > C`` down to norm C before the map (default None:
        no clipping).
    feature_norm
        B: scales sketched rows with ``|psi(x)| > B`` down to norm B (default None: no
        clipping), which makes the mean sketch's sensitivity 2B/n (module doc).

    Attributes
    ----------
    hashes
        numpy.ndarray, shape (3, d + 1): each count sketch's bucket (in 0..D-1) for each
        coordinate of x'.
    signs
        numpy.ndarray, shape (3, d + 1): the matching signs (+-1). The arguments are
        kept under their names.
    """

    def __init__(
        self,
        input_dim: int,
        dim: int,
        *,
        gamma: float | None = None,
        coef0: float = 1.0,
        seed: int = 0,
        clip_norm: float | None = None,
        feature_norm: float | None = None,
    ):
        self.input_dim = positive_int(input_dim, "input_dim")
        self.dim = positive_int(dim, "dim", minimum=2)
        self.gamma = 1.0 / self.input_dim if gamma is None else _positive(gamma, "gamma")
        if not (math.isfinite(coef0) and coef0 >= 0):
            raise ValueError(
                f"coef0: expected a number >= 0 (a real constant feature), got {coef0!r}"
            )
        self.coef0, self.seed = float(coef0), int(seed)
        self.clip_norm = None if clip_norm is None else _positive(clip_norm, "clip_norm")
        self.feature_norm = (
            None if feature_norm is None else _positive(feature_norm, "feature_norm")
        )
        self.hashes, self.signs = self._hashes()

    def _hashes(self) -> tuple[np.ndarray, np.ndarray]:
        """(3, d + 1) bucket indices and signs; drawn at 2^32 buckets and reduced mod D,
        so maps of nested power-of-two dims share their hashes."""
        rng = np.random.default_rng([self.seed, self.input_dim, DEGREE])
        wide = rng.integers(0, 2**32, size=(DEGREE, self.input_dim + 1), dtype=np.int64)
        signs = rng.integers(0, 2, size=(DEGREE, self.input_dim + 1)) * 2.0 - 1.0
        return wide % self.dim, signs

    def augment(self, x) -> np.ndarray:
        """x' = [sqrt(gamma) x, sqrt(coef0)] of the rows clipped to ``clip_norm``, float64."""
        x = np.asarray(x, np.float64)
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise ValueError(f"x: expected rows of {self.input_dim} features, got {x.shape}")
        if self.clip_norm is not None:
            norms = np.linalg.norm(x, axis=1, keepdims=True)
            x = x * np.minimum(1.0, self.clip_norm / np.maximum(norms, 1e-300))
        const = np.full((len(x), 1), math.sqrt(self.coef0))
        return np.concatenate([x * math.sqrt(self.gamma), const], axis=1)

    def count_sketch(self, augmented: np.ndarray, j: int) -> np.ndarray:
        """C_j x' (n, dim): the signed sum of the coordinates of each row per bucket."""
        order = np.argsort(self.hashes[j], kind="stable")
        buckets, starts = np.unique(self.hashes[j][order], return_index=True)
        out = np.zeros((len(augmented), self.dim))
        out[:, buckets] = np.add.reduceat(
            augmented[:, order] * self.signs[j][order], starts, axis=1
        )
        return out

    def features(self, x) -> np.ndarray:
        """psi(x), (n, dim) float64 (sketched rows clipped to ``feature_norm``)."""
        augmented = self.augment(x)
        spectrum = np.fft.rfft(self.count_sketch(augmented, 0), axis=1)
        for j in range(1, DEGREE):
            spectrum *= np.fft.rfft(self.count_sketch(augmented, j), axis=1)
        psi = np.fft.irfft(spectrum, n=self.dim, axis=1)
        if self.feature_norm is not None:
            norms = np.linalg.norm(psi, axis=1, keepdims=True)
            psi *= np.minimum(1.0, self.feature_norm / np.maximum(norms, 1e-300))
        return psi

    def sketch(self, x, *, block_rows: int | None = None) -> Sketch:
        """The mean sketch of the rows of ``x``, with the mean sketched squared norm
        (``meta["diagonal"]``) that :func:`tensorsketch_kd` removes. Rows go through
        the map ``block_rows`` at a time (default: 2^20 / dim, at least 16:
        8 MiB per array, which stays in cache and runs twice as fast as 8x larger blocks)."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.input_dim or len(x) == 0:
            raise ValueError(f"x: expected rows of {self.input_dim} features, got {x.shape}")
        total, diagonal = np.zeros(self.dim), 0.0
        block = max(16, 2**20 // self.dim) if block_rows is None else block_rows
        for start in range(0, len(x), positive_int(block, "block_rows")):
            psi = self.features(x[start : start + block])
            total += psi.sum(axis=0)
            diagonal += float(np.einsum("ij,ij->", psi, psi))
        return Sketch(total / len(x), len(x), self.meta() | {"diagonal": diagonal / len(x)})

    def norm_bound(self) -> float:
        """A bound on ``|psi(x)|`` over all rows ``|x| <= clip_norm`` that holds for these
        hashes deterministically: ``|C_1 x'|_1 |C_2 x'|_1 |C_3 x'|_2 <= (d + 1) sqrt(L_3) R^3``
        (module docstring); ``feature_norm`` if that is smaller. inf without a clip."""
        bound = math.inf
        if self.clip_norm is not None:
            largest = int(np.bincount(self.hashes[2], minlength=self.dim).max())
            radius = math.sqrt(self.gamma * self.clip_norm**2 + self.coef0)
            bound = (self.input_dim + 1) * math.sqrt(largest) * radius**DEGREE
        return min(bound, math.inf if self.feature_norm is None else self.feature_norm)

    def meta(self) -> dict:
        return {
            "version": VERSION,
            "kernel": KERNEL,
            "input_dim": self.input_dim,
            "dim": self.dim,
            "seed": self.seed,
            "gamma": self.gamma,
            "coef0": self.coef0,
            "clip_norm": self.clip_norm,
            "feature_norm": self.feature_norm,
        }


def tensorsketch_kd(reference: Sketch, model: Sketch) -> float:
    r"""KD (U-statistic of the sketched kernel) between the rows two TensorSketches hold.

    .. math::
        \widehat{\mathrm{KD}} = \frac{n\|s\|^2 - \bar q_s}{n - 1}
            + \frac{m\|t\|^2 - \bar q_t}{m - 1} - 2\, s \cdot t,

    :math:`\bar q` a sketch's mean sketched squared norm (``meta["diagonal"]``):
    unbiased for KID's U-statistic (Binkowski et al., ICLR 2018) over the hashes.

    Parameters
    ----------
    reference
        the reference's :class:`~distrank.metrics.sketch.Sketch` (s, n >= 2 rows), from
        :meth:`~distrank.metrics.sketch.TensorSketchMap.sketch`.
    model
        the model's :class:`~distrank.metrics.sketch.Sketch` (t, m >= 2 rows), of a map
        with the same fields (``MAP_FIELDS``).

    Returns
    -------
    float
        The estimate; a ValueError names a field on which the maps differ, or a sketch
        of fewer than 2 rows.
    """
    for key in MAP_FIELDS:
        if reference.meta.get(key) != model.meta.get(key):
            raise ValueError(
                f"sketches: field {key!r} differs ({reference.meta.get(key)!r} vs "
                f"{model.meta.get(key)!r}): sketches of different maps cannot be compared"
            )
    s, t = np.asarray(reference.mean), np.asarray(model.mean)
    return float(_self_term(s, reference) + _self_term(t, model) - 2.0 * s @ t)


def _self_term(mean: np.ndarray, sketch: Sketch) -> float:
    if sketch.n < 2:
        raise ValueError(f"a sketch of {sketch.n} row: the U-statistic needs at least 2")
    return (sketch.n * float(mean @ mean) - float(sketch.meta["diagonal"])) / (sketch.n - 1)


def _positive(value, name: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    return value
