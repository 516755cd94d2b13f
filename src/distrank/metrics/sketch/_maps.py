r"""Kernel mean sketches: one private release per site ranks every model, now or later.

KD is a squared distance between kernel mean embeddings, :math:`\mathrm{KD}(P, G) =
\|\mu_P - \mu_G\|^2`. With random Fourier features of the Gaussian kernel (Rahimi and
Recht, NIPS 2007),

.. math::
    \phi(x) = \sqrt{2/D}\,[\cos(W^\top x), \sin(W^\top x)], \qquad
    W_{:,j} \sim \mathcal N(0, h^{-2} I_d),\ j = 1..D/2,

:math:`\mathbb E_W[\phi(x) \cdot \phi(y)] = \exp(-\|x - y\|^2 / (2h^2))` (the ``rbf``
kernel of :func:`~distrank.metrics.make_kernel`, bandwidth h) and :math:`\|\phi(x)\| = 1`
exactly. A site publishes once its mean sketch :math:`s_i = \frac{1}{n_i}\sum_{x \in
X_i} \phi(x)` (D numbers); the pooled sketch is :math:`\sum_i \lambda_i s_i`,
:math:`\lambda_i = n_i/n`, as Theorem 1 pools the embeddings, and the server scores
any model as

.. math::
    \widehat{\mathrm{KD}} = \frac{n\|s\|^2 - 1}{n - 1} + \frac{m\|t\|^2 - 1}{m - 1}
        - 2\, s \cdot t, \qquad t = \tfrac{1}{m}\textstyle\sum_j \phi(y_j),

the U-statistic of the sketched kernel (its diagonal is exactly 1, so removing it is
exact; :func:`sketch_kd`). Only :math:`-2 s\cdot t` and the model's own term depend on
the model, so the ranking needs s alone.

**Privacy.** Replacing one of a site's rows moves :math:`s_i` by at most
:math:`2/n_i` in L2 (:math:`\|\phi\| = 1`); one Gaussian release of :math:`s_i`
(:func:`release_sketch`, the analytic calibration of ``distrank.metrics._privacy``) is
:math:`(\varepsilon, \delta)`-DP for every model ever scored from it (post-processing),
:math:`n_i` public. In a secure sum the sites add :math:`n_i s_i` (sensitivity 2) with
noise of variance :math:`\sigma^2/t` each (:func:`sketch_sum_std`).

The map is public: W comes from (seed, d, D, h) alone (:class:`FeatureMap`), and the
bandwidth must come from the server's side (a named model or public set), never from
a site's rows. A sketch file (:func:`save`, :func:`load`) is an npz with the mean
sketch and JSON metadata, read without pickle; sketches of different maps or
extractors are refused, naming the field (:func:`check_compatible`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from distrank._checks import positive_int
from distrank.metrics._privacy import noise_multiplier

#: the file format's version (metadata ``version``)
VERSION = 1
#: the metadata fields that two sketches scored together must share
MAP_FIELDS = ("version", "kernel", "input_dim", "dim", "seed", "bandwidth", "extractor", "weights")


@dataclass(frozen=True)
class FeatureMap:
    """Random Fourier features of the rbf kernel of ``bandwidth`` on ``input_dim``-d rows.

    ``dim`` (even) features, frequencies from ``seed``. The first D'/2 frequencies of a
    map are those of the same seed's map of dim D' < D (nested maps). A bad field is a
    ValueError naming it.

    Attributes
    ----------
    input_dim
        int: d, the features of each row (>= 1).
    dim
        int: D, the features of the map (even, >= 2): D/2 cosines, then D/2 sines.
    bandwidth
        float: h > 0, of the kernel ``exp(-|x - y|^2 / (2 h^2))``.
    seed
        int: of the frequencies W, (d, D/2) with N(0, h^-2) entries (default 0).
    """

    input_dim: int
    dim: int
    bandwidth: float
    seed: int = 0

    def __post_init__(self):
        positive_int(self.input_dim, "input_dim")
        if positive_int(self.dim, "dim", minimum=2) % 2:
            raise ValueError(f"dim: expected an even number of features, got {self.dim}")
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(f"bandwidth: expected a positive number, got {self.bandwidth!r}")

    @classmethod
    def of(cls, meta: Mapping) -> FeatureMap:
        """The map a sketch's (or a map file's) metadata names."""
        return cls(
            int(meta["input_dim"]), int(meta["dim"]), float(meta["bandwidth"]), int(meta["seed"])
        )

    def frequencies(self) -> np.ndarray:
        """W, (input_dim, dim / 2) float64: row j of the generator's (dim/2, d) draw."""
        rng = np.random.default_rng([self.seed, self.input_dim])
        return rng.standard_normal((self.dim // 2, self.input_dim)).T / self.bandwidth

    def features(self, x, frequencies: np.ndarray | None = None) -> np.ndarray:
        """phi(x), (n, dim) float64."""
        w = self.frequencies() if frequencies is None else frequencies
        z = np.asarray(x, np.float64) @ w
        return np.concatenate([np.cos(z), np.sin(z)], axis=1) * math.sqrt(2.0 / self.dim)

    def sketch(self, x, *, block_rows: int = 4096) -> Sketch:
        """The mean sketch of the rows of ``x`` (float64 sums over row blocks)."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.input_dim or len(x) == 0:
            raise ValueError(f"x: expected rows of {self.input_dim} features, got {x.shape}")
        w, total = self.frequencies(), np.zeros(self.dim)
        for start in range(0, len(x), block_rows):
            total += self.features(x[start : start + block_rows], w).sum(axis=0)
        return Sketch(total / len(x), len(x), self.meta())

    def meta(self) -> dict:
        return {
            "version": VERSION,
            "kernel": "rbf",
            "input_dim": self.input_dim,
            "dim": self.dim,
            "seed": self.seed,
            "bandwidth": float(self.bandwidth),
        }


@dataclass(frozen=True)
class Sketch:
    """A mean sketch of n rows, with its metadata.

    Attributes
    ----------
    mean
        numpy.ndarray, shape (D,): the mean of the rows' features, s = (1/n) sum phi(x)
        (``truncate`` keeps a batch of sketches on leading axes).
    n
        int: the rows sketched (public).
    meta
        mapping: the map's fields, the extractor and its weights' sha256, and for a
        private release epsilon, delta and noise_std (default: empty; a TensorSketch's
        also ``diagonal``).
    noise_std
        float: ``meta["noise_std"]``, 0.0 without noise.
    """

    mean: np.ndarray
    n: int
    meta: Mapping = field(default_factory=dict)

    @property
    def noise_std(self) -> float:
        return float(self.meta.get("noise_std", 0.0))


def truncate(sketch: Sketch, dim: int) -> Sketch:
    """The sketch of the same rows under the same seed's map of ``dim`` <= D features.

    Nested maps share their first ``dim / 2`` frequencies, so this is the first ``dim /
    2`` cosine and sine coordinates, rescaled by sqrt(D / dim) (the sqrt(2 / D) of
    :meth:`FeatureMap.features`); a noise std scales the same way. ``mean`` may hold a
    batch of sketches on its leading axes.
    """
    full = int(sketch.meta["dim"])
    if positive_int(dim, "dim", minimum=2) % 2 or dim > full:
        raise ValueError(f"dim: expected an even number up to the sketch's {full}, got {dim}")
    mean, half, scale = np.asarray(sketch.mean), full // 2, math.sqrt(full / dim)
    cut = np.concatenate([mean[..., : dim // 2], mean[..., half : half + dim // 2]], axis=-1)
    meta = dict(sketch.meta) | {"dim": int(dim)}
    if "noise_std" in meta:
        meta["noise_std"] = float(meta["noise_std"]) * scale
    return Sketch(cut * scale, sketch.n, meta)


def sketch_kd(reference: Sketch, model: Sketch) -> float:
    """KD (U-statistic of the sketched kernel) between the rows the two sketches hold.

    ``(n |s|^2 - 1) / (n - 1) + (m |t|^2 - 1) / (m - 1) - 2 s . t`` for mean sketches s
    of n rows and t of m rows (module doc). A noisy reference sketch biases its own term by
    ``dim`` noise_std^2 n / (n - 1): the same for every model, so rankings do not move.

    Parameters
    ----------
    reference
        the reference's :class:`~distrank.metrics.sketch.Sketch` (a site's or the
        pooled one, noisy or not), n >= 2 rows.
    model
        the model's :class:`~distrank.metrics.sketch.Sketch` under the same map (not
        checked here), m >= 2 rows.

    Returns
    -------
    float
        The estimate; a sketch of fewer than 2 rows is a ValueError.
    """
    s, t = np.asarray(reference.mean), np.asarray(model.mean)
    return float(_self_term(s, reference.n) + _self_term(t, model.n) - 2.0 * s @ t)


def bias(n: int, dim: int, noise_std: float) -> float:
    """The expected excess of a noisy sketch's KD over the noiseless one: n / (n - 1) D
    sigma^2, the same for every model (``metrics.sketch._confidence``)."""
    return n / (n - 1) * dim * noise_std**2 if noise_std else 0.0


def sketch_noise_std(n: int, *, epsilon: float, delta: float) -> float:
    """sigma of one (epsilon, delta) Gaussian release of a mean sketch of n rows:
    z_1(epsilon, delta) times the L2 sensitivity 2 / n."""
    return noise_multiplier(epsilon=epsilon, delta=delta) * 2.0 / positive_int(n, "n")


def release_sketch(sketch, *, epsilon: float, delta: float, rng: np.random.Generator):
    """A :class:`~distrank.metrics.sketch.Sketch` with N(0, sigma^2 I) added.

    sigma = ``sketch_noise_std``: z_1(epsilon, delta) times the L2 sensitivity 2 / n of
    a mean sketch of n rows (one release for every model scored from it).

    Parameters
    ----------
    sketch
        the :class:`~distrank.metrics.sketch.Sketch` of a site's n rows (n public).
    epsilon, delta
        the privacy of this one Gaussian release.
    rng
        ``numpy.random.Generator`` of the noise.

    Returns
    -------
    Sketch
        The noisy mean of the same n rows; ``meta`` gains ``epsilon``, ``delta`` and
        ``noise_std`` (sigma).
    """
    std = sketch_noise_std(sketch.n, epsilon=epsilon, delta=delta)
    noisy = np.asarray(sketch.mean) + rng.normal(0.0, std, np.shape(sketch.mean))
    meta = dict(sketch.meta) | {"epsilon": float(epsilon), "delta": float(delta), "noise_std": std}
    return Sketch(noisy, sketch.n, meta)


def sketch_sum_std(n: int, *, epsilon: float, delta: float, threshold: int, n_sites: int) -> float:
    """The noise std of the pooled sketch when sites sum n_i s_i (sensitivity 2), each
    adding N(0, sigma^2 / t): sigma sqrt(A / t) / n over A sites of n rows in all."""
    sigma = 2.0 * noise_multiplier(epsilon=epsilon, delta=delta)
    if n_sites < threshold:
        raise ValueError(f"n_sites: a sum needs {threshold} sites, got {n_sites}")
    return sigma * math.sqrt(n_sites / threshold) / n


def _self_term(mean: np.ndarray, n: int) -> float:
    if n < 2:
        raise ValueError(f"a sketch of {n} row: the U-statistic needs at least 2")
    return (n * float(mean @ mean) - 1.0) / (n - 1)


def pool(sketches: Sequence[Sketch]) -> Sketch:
    """The pooled sketch sum_i (n_i / n) s_i (noise stds combine the same way).

    Parameters
    ----------
    sketches
        non-empty sequence of the sites' :class:`~distrank.metrics.sketch.Sketch`, of
        one map and extractor (a ValueError names the first ``MAP_FIELDS`` field on
        which two differ).

    Returns
    -------
    Sketch
        Of n = sum_i n_i rows; ``meta`` holds the first sketch's ``MAP_FIELDS`` and,
        when a site is noisy, ``noise_std`` sqrt(sum_i (n_i sigma_i)^2) / n.
    """
    check_compatible([s.meta for s in sketches])
    n = sum(s.n for s in sketches)
    mean = sum(s.n * np.asarray(s.mean, np.float64) for s in sketches) / n
    std = math.sqrt(sum((s.n * s.noise_std) ** 2 for s in sketches)) / n
    meta = {k: v for k, v in sketches[0].meta.items() if k in MAP_FIELDS}
    return Sketch(mean, n, meta | ({"noise_std": std} if std else {}))


def check_compatible(metas: Sequence[Mapping]) -> None:
    """ValueError naming the first field of :data:`MAP_FIELDS` on which two sketches differ."""
    for key in MAP_FIELDS:
        values = [m.get(key) for m in metas]
        if any(v != values[0] for v in values):
            raise ValueError(
                f"sketches: field {key!r} differs ({sorted(set(map(repr, values)))}): "
                "sketches of different feature maps or extractors cannot be pooled or compared"
            )


def save(path, sketch: Sketch) -> None:
    """Write ``sketch`` to ``path`` (npz: ``mean``, ``n``, ``meta`` as JSON text)."""
    from distrank._io import atomic_open

    meta = json.dumps(dict(sketch.meta) | {"n": int(sketch.n)}, sort_keys=True)
    with atomic_open(path) as f:
        np.savez(f, mean=np.asarray(sketch.mean, np.float64), n=int(sketch.n), meta=meta)


def load(path) -> Sketch:
    """The sketch in ``path``; a ValueError names the file and what is wrong."""
    try:
        with np.load(Path(path), allow_pickle=False) as f:
            mean, n, meta = f["mean"], int(f["n"]), json.loads(str(f["meta"]))
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"{path}: not a sketch file ({err})") from None
    if meta.get("version") != VERSION or mean.shape != (meta.get("dim"),):
        raise ValueError(f"{path}: a sketch of version {meta.get('version')!r}, dim {mean.shape}")
    meta.pop("n", None)
    return Sketch(mean, n, meta)
