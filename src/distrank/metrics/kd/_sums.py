"""Kernel distance (KD): the squared MMD, for the pooled reference and every client in one pass.

For reference rows X (n) and generated rows Y (m), with S_AB = sum_{a in A, b in B} k(a, b)
and tr_A = sum_{a in A} k(a, a):

    unbiased (U)  KD = (S_XX - tr_X) / (n (n-1)) + (S_YY - tr_Y) / (m (m-1)) - 2 S_XY / (n m)
    biased (V)    KD = S_XX / n^2 + S_YY / m^2 - 2 S_XY / (n m)

(Gretton et al., "A Kernel Two-Sample Test", JMLR 2012, eqs. 3 and 5; the U form is
torch-fidelity's ``mmd2(..., mmd_est="unbiased")`` and KID's.)

With clients X_1..X_k pooling to X, every term is a sum of kernel blocks: S_XY =
sum_i S_{X_i Y}, S_XX = sum_{a,b} S_{X_a X_b}. ``kernel_sums`` computes each block
once, as a (k x k) table of client-pair sums and a (models x k) table of
client-model sums, so KD_all and every client's KD come out of the same products.
With lambda_i = n_i / n this makes KD_avg - KD_all = sum_i lambda_i XX_i - XX_all
independent of the model, exactly (the paper's Theorem 1 on finite samples).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from distrank._arrays import as_features, column_mean, product_rows, resolve_device, work_dtype
from distrank._checks import TooFewRows
from distrank.metrics._kernels import Centred, Kernel, gram_blocks, make_kernel
from distrank.metrics._metric import ESTIMATORS, check_full_sample, kd_rows


@dataclass(frozen=True)
class KernelSums:
    """Kernel sums over the pooled reference split by its k clients, and over M models.

    S_AB is the sum of k(a, b) over the rows a of A and b of B; tr_A the sum of k(a, a).

    Attributes
    ----------
    client_sizes
        numpy.ndarray, shape (k,): rows n_i of each client.
    model_sizes
        numpy.ndarray, shape (M,): rows m_g of each model.
    xx
        numpy.ndarray, shape (k, k): ``xx[a, b]`` = S_{X_a X_b}.
    xx_diag
        numpy.ndarray, shape (k,): ``xx_diag[a]`` = tr_{X_a}.
    xy
        numpy.ndarray, shape (M, k): ``xy[g, i]`` = S_{X_i Y_g}.
    yy, yy_diag
        numpy.ndarray, shape (M,): ``yy[g]`` = S_{Y_g Y_g}, ``yy_diag[g]`` = tr_{Y_g};
        all float64.
    """

    client_sizes: np.ndarray  # (k,)
    model_sizes: np.ndarray  # (M,)
    xx: np.ndarray  # (k, k)
    xx_diag: np.ndarray  # (k,)
    xy: np.ndarray  # (M, k)
    yy: np.ndarray  # (M,)
    yy_diag: np.ndarray  # (M,)

    def kd(self, estimator: str = "unbiased") -> tuple[np.ndarray, np.ndarray]:
        """KD per (model, client) as an (M, k) array, and KD_all per model as (M,)."""
        check_full_sample(estimator)
        return _kd_terms(
            self.xx,
            self.xx_diag,
            self.xy,
            self.yy,
            self.yy_diag,
            self.client_sizes.astype(np.float64),
            self.model_sizes.astype(np.float64),
            estimator,
        )

    def coarsen(self, fine_to_client) -> KernelSums:
        """The sums of the partition that gives fine group g (a client of these sums)
        to client ``fine_to_client[g]``: with A the (fine groups x clients) 0/1
        assignment, S_XX -> A^T S_XX A, S_XY -> S_XY A, tr_X -> A^T tr_X.

        ``fine_to_client`` is (B,) int in 0..k-1, every client holding at least one group.
        """
        assign = np.asarray(fine_to_client)
        if assign.shape != self.client_sizes.shape:
            raise ValueError(
                f"fine_to_client: expected {self.client_sizes.shape[0]} entries (one "
                f"per fine group), got shape {assign.shape}"
            )
        k = int(assign.max()) + 1
        a = np.zeros((assign.size, k))
        a[np.arange(assign.size), assign] = 1.0
        if (a.sum(axis=0) == 0).any():
            raise ValueError("fine_to_client: some client holds no fine group")
        return KernelSums(
            client_sizes=(self.client_sizes @ a).round().astype(np.int64),
            model_sizes=self.model_sizes,
            xx=a.T @ self.xx @ a,
            xx_diag=self.xx_diag @ a,
            xy=self.xy @ a,
            yy=self.yy,
            yy_diag=self.yy_diag,
        )


def _kd_terms(xx, xx_diag, xy, yy, yy_diag, n_i, m, estimator):
    """(KD per (model, client), KD_all per model) from the sums of :class:`KernelSums`.

    The one formula of KD in the package (module docstring), for numpy arrays and
    torch tensors alike (the differentiable :class:`KDObjective` uses it too).
    """
    xx_client = _self_term(xx.diagonal(), xx_diag, n_i, estimator)
    xx_all = _self_term(xx.sum(), xx_diag.sum(), n_i.sum(), estimator)
    yy = _self_term(yy, yy_diag, m, estimator)
    kd_client = xx_client[None, :] + yy[:, None] - 2 * xy / (n_i[None, :] * m[:, None])
    kd_all = xx_all + yy - 2 * xy.sum(axis=1) / (n_i.sum() * m)
    return kd_client, kd_all


def _self_term(total, diag, size, estimator):
    """The S_XX part of KD: (S - tr) / (n (n-1)) for U, S / n^2 for V."""
    if estimator == "unbiased":
        return (total - diag) / (size * (size - 1))
    return total / size**2


def kernel_sums(
    reference: torch.Tensor,
    client_index: np.ndarray,
    models: Iterable,
    kernel: Kernel,
    *,
    dtype: str = "float32",
    device=None,
    block_size: int | None = None,
) -> KernelSums:
    """All the kernel sums of KD for the pooled reference, its clients and each model.

    Kernel blocks of ``block_size`` rows are formed and reduced in ``dtype``
    (float32: fast GEMMs), and the block sums are accumulated in float64; no
    n x n or n x m matrix is ever held. The rows are grouped by client and centred
    on the reference mean (``Centred``), as PRDC
    does, so that ``prdc(..., products=builder)`` gives these sums bit for bit from
    PRDC's own products. S_XX and S_YY are symmetric: only blocks on or above the
    diagonal are formed.

    Parameters
    ----------
    reference : torch.Tensor, shape (n, d)
        The pooled reference rows (checked by the caller).
    client_index : numpy.ndarray, shape (n,)
        Each row's client, in 0..k-1.
    models : iterable of array_like, each shape (m_g, d)
        The models' rows, read one at a time.
    kernel : Kernel
        Its parameters fixed (:func:`~distrank.metrics.make_kernel`).
    dtype : {"float32", "float64"}
        Of the kernel blocks.
    device : str or torch.device, optional
        Where the products run (None: CUDA if available, else the CPU).
    block_size : int, optional
        Rows of one product block (None: 64 MiB blocks).

    Returns
    -------
    KernelSums
        With k clients and M models.
    """
    block_size = product_rows(block_size, work_dtype(dtype).itemsize)
    builder = _pooled(reference, client_index, kernel, device, dtype, block_size)
    for y in models:
        builder.add_model(torch.as_tensor(y), block_size)
    return builder.sums()


def _pooled(reference, client_index, kernel, device, dtype, block) -> SumsBuilder:
    """A :class:`SumsBuilder` that has the reference, grouped by client and centred on
    its mean in ``dtype`` on ``device``, and every block of it with itself."""
    dev, dt = resolve_device(device), work_dtype(dtype)
    index = np.asarray(client_index)
    order = np.argsort(index, kind="stable")
    x = torch.as_tensor(reference)
    x = x[torch.from_numpy(order).to(x.device)].to(device=dev, dtype=dt)
    builder = SumsBuilder(kernel)
    builder.reference(Centred.of(x, column_mean(x).to(dt), in_place=True), index[order])
    for rows, cols, gram in gram_blocks(builder.ref.rows, None, block):
        builder.pool(rows, cols, gram)
    return builder


class SumsBuilder:
    """:class:`KernelSums` from blocks of centred products, whoever forms them.

    The calls, in order: :meth:`reference` once, :meth:`pool` for each block of the
    reference with itself on or above the diagonal, then per model
    :meth:`start_model`, :meth:`model_self` for its own blocks (on or above the
    diagonal) and :meth:`cross` for its blocks with the reference (:meth:`add_model`
    does the last three). ``kernel_sums`` makes every call itself; PRDC makes them
    from the products it forms anyway, so KD costs no GEMM of its own.
    """

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.models: list[list[torch.Tensor]] = []  # per model: S_{X_i Y} (k,), S_YY, tr_Y
        self.model_sizes: list[int] = []

    def reference(self, ref: Centred, client_index: np.ndarray) -> None:
        """The reference rows grouped by client (``client_index`` sorted, in 0..k-1),
        centred on ``ref.center``."""
        self.ref = ref
        index = torch.as_tensor(client_index, dtype=torch.int64, device=ref.rows.device)
        self.sizes = np.bincount(client_index)
        self.groups = _OneHot(index, len(self.sizes), ref.rows.dtype)
        k, dev = len(self.sizes), ref.rows.device
        self.xx = torch.zeros(k, k, dtype=torch.float64, device=dev)
        self.xx_diag = torch.zeros(k, dtype=torch.float64, device=dev)

    def pool(self, rows: slice, cols: slice, gram: torch.Tensor) -> None:
        kab = self.kernel.from_gram(gram, self.ref[rows], self.ref[cols])
        ga = self.groups[rows].to(torch.float64)
        pair = ga.T @ (kab @ self.groups[cols]).to(torch.float64)
        if rows == cols:
            self.xx += pair
            self.xx_diag += ga.T @ torch.diagonal(kab).to(torch.float64)
        else:  # the mirrored block is this one transposed
            self.xx += pair + pair.T

    def start_model(self, y: Centred) -> None:
        """Model rows centred as the reference is."""
        self.y = y
        zero = torch.zeros((), dtype=torch.float64, device=y.rows.device)
        self.models.append([zero.expand(self.groups.shape[1]), zero, zero])
        self.model_sizes.append(y.rows.shape[0])

    def model_self(self, rows: slice, cols: slice, gram: torch.Tensor) -> None:
        kab = self.kernel.from_gram(gram, self.y[rows], self.y[cols])
        sums = self.models[-1]
        total = _row_sums(kab).sum()
        if rows == cols:
            sums[1] = sums[1] + total
            sums[2] = sums[2] + torch.diagonal(kab).to(torch.float64).sum()
        else:
            sums[1] = sums[1] + 2 * total

    def cross(self, rows: slice, cols: slice, gram: torch.Tensor) -> None:
        kab = self.kernel.from_gram(gram, self.ref[rows], self.y[cols])
        sums = self.models[-1]
        sums[0] = sums[0] + self.groups[rows].to(torch.float64).T @ _row_sums(kab)

    def add_model(self, y: torch.Tensor, block: int) -> None:
        """Every block of the model rows ``y`` (not centred; any dtype and device)."""
        rows_ = self.ref.rows
        self.start_model(Centred.of(y.to(device=rows_.device, dtype=rows_.dtype), self.ref.center))
        for rows, cols, gram in gram_blocks(self.y.rows, None, block):
            self.model_self(rows, cols, gram)
        for rows, cols, gram in gram_blocks(rows_, self.y.rows, block):
            self.cross(rows, cols, gram)

    def pop_model(self) -> list[torch.Tensor]:
        """The last model's (S_{X_i Y} (k,), S_YY, tr_Y), float64, forgotten here."""
        self.model_sizes.pop()
        return self.models.pop()

    def sums(self) -> KernelSums:
        def stacked(i: int, empty: tuple) -> np.ndarray:
            return (
                torch.stack([s[i] for s in self.models]).cpu().numpy()
                if self.models
                else np.zeros(empty)
            )

        return KernelSums(
            client_sizes=self.sizes.astype(np.int64),
            model_sizes=np.asarray(self.model_sizes, dtype=np.int64),
            xx=self.xx.cpu().numpy(),
            xx_diag=self.xx_diag.cpu().numpy(),
            xy=stacked(0, (0, len(self.sizes))),
            yy=stacked(1, (0,)),
            yy_diag=stacked(2, (0,)),
        )


def _row_sums(block: torch.Tensor) -> torch.Tensor:
    """Row sums of a kernel block in its dtype (vectorised: a float64 reduction of a
    float32 block costs a sixth of its GEMM), as float64 for accumulation."""
    return block.sum(dim=1).to(torch.float64)


class _OneHot:
    """The (n, k) one-hot client matrix, formed one row block at a time when sliced:
    memory O(block x k), never n x k (k can be thousands of fine groups)."""

    def __init__(self, index: torch.Tensor, k: int, dtype: torch.dtype):
        self.index, self.dtype = index, dtype
        self.shape = (index.shape[0], k)

    def __getitem__(self, rows: slice) -> torch.Tensor:
        return torch.nn.functional.one_hot(self.index[rows], self.shape[1]).to(self.dtype)


class KDObjective:
    r"""KD of generated rows Y to a fixed, client-split reference, differentiable in Y.

    ``objective(y)`` returns ``(kd_client, kd_all)`` as float64 torch tensors of
    shapes (k,) and (), the values :meth:`KernelSums.kd` gives for the same rows,
    from the same block sums (:class:`SumsBuilder`) and the same formula
    (:func:`_kd_terms`), with autograd through them: the squared-MMD loss of MMD
    training (Li et al., "Generative Moment Matching Networks", ICML 2015; Dziugaite
    et al., UAI 2015). The reference's S_XX blocks do not depend on Y and are
    computed once, here. With :math:`\lambda_i = n_i / n` and the same Y for every
    client,

    .. math::
        \sum_i \lambda_i \nabla_Y \mathrm{KD}(X_i, Y) = \nabla_Y \mathrm{KD}(X, Y),

    because :math:`\mathrm{KD}_\mathrm{avg} - \mathrm{KD}_\mathrm{all}` does not
    depend on Y (Theorem 1 of Wang et al., arXiv 2310.11714).

    ``reference`` (n, d) and ``client_index`` (n,) as for :func:`kernel_sums`; one
    fixed ``kernel`` (a bandwidth chosen once, never per client); ``estimator``
    ``"unbiased"`` or ``"biased"``; kernel blocks in ``dtype``.
    """

    def __init__(
        self,
        reference,
        client_index,
        kernel: Kernel,
        *,
        estimator: str = "unbiased",
        dtype: str = "float32",
        device=None,
        block_size: int | None = None,
    ):
        x = as_features(reference, "reference")
        index = np.asarray(client_index)
        if (
            index.shape != (x.shape[0],)
            or not np.issubdtype(index.dtype, np.integer)
            or index.min() < 0
        ):
            raise ValueError(
                f"client_index: expected {x.shape[0]} non-negative ints, got "
                f"{index.dtype} {index.shape}"
            )
        check_full_sample(estimator, "estimator")
        sizes = np.bincount(index)
        check_sizes({f"reference: client {c}": int(n) for c, n in enumerate(sizes)}, estimator)
        self.kernel, self.estimator = kernel, estimator
        self.block_size = product_rows(block_size, work_dtype(dtype).itemsize)
        self._sums = _pooled(x, index, kernel, device, dtype, self.block_size)
        self.client_sizes = torch.as_tensor(sizes, dtype=torch.float64, device=self._sums.xx.device)

    @property
    def dim(self) -> int:
        return self._sums.ref.rows.shape[1]

    def __call__(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(KD(X_i, Y) for each client i, KD(X, Y) of the pooled reference X)."""
        if not isinstance(y, torch.Tensor) or y.ndim != 2 or y.shape[1] != self.dim:
            raise ValueError(
                f"y: expected a torch tensor (m, {self.dim}), got "
                f"{getattr(y, 'shape', type(y).__name__)}"
            )
        check_sizes({"y": y.shape[0]}, self.estimator)
        self._sums.add_model(y, self.block_size)
        xy, yy, yy_diag = self._sums.pop_model()
        m = torch.full((1,), float(y.shape[0]), dtype=torch.float64, device=xy.device)
        kd_client, kd_all = _kd_terms(
            self._sums.xx,
            self._sums.xx_diag,
            xy[None, :],
            yy[None],
            yy_diag[None],
            self.client_sizes,
            m,
            self.estimator,
        )
        return kd_client[0], kd_all[0]


def kernel_distance(
    x,
    y,
    *,
    kernel: str = "poly",
    kernel_params=None,
    estimator: str = "unbiased",
    dtype: str = "float32",
    device=None,
    block_size: int | None = None,
) -> float:
    """KD(X, Y), the squared MMD, of one pair on the full samples.

    The U-statistic (``"unbiased"``) or the V-statistic (``"biased"``) of Gretton et
    al., "A Kernel Two-Sample Test", JMLR 2012 (the module doc).

    Parameters
    ----------
    x, y : array_like, shapes (n, d) and (m, d)
        Features (numpy or torch), finite.
    kernel : {"poly", "rbf", "laplace", "linear"}
    kernel_params : mapping, optional
        Of :func:`~distrank.metrics.make_kernel`; rbf and laplace need
        ``{"bandwidth": h}``.
    estimator : {"unbiased", "biased"}
        The U-statistic needs n, m >= 2.
    dtype, device, block_size
        Those of :func:`kernel_sums`.

    Returns
    -------
    float
        KD(X, Y); a ValueError names a bad argument (dimensions, rows, kernel).
    """
    x, y = as_features(x, "x"), as_features(y, "y")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"y: dimension {y.shape[1]} does not match x's {x.shape[1]}")
    check_sizes({"x": x.shape[0], "y": y.shape[0]}, estimator)
    k = make_kernel(kernel, kernel_params, x.shape[1])
    sums = kernel_sums(
        x,
        np.zeros(x.shape[0], dtype=np.int64),
        [y],
        k,
        dtype=dtype,
        device=device,
        block_size=block_size,
    )
    return float(sums.kd(estimator)[1][0])


def check_sizes(sizes: dict[str, int], estimator: str, subset_size: int | None = None) -> None:
    """Raise ``TooFewRows`` when a sample is too small for
    ``estimator`` (``metric.kd_rows``: the one rule).

    ``sizes`` maps a description of each sample (e.g. "clients: client '3'") to its rows.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"kd_estimator: expected one of {ESTIMATORS}, got {estimator!r}")
    rows = kd_rows(estimator, subset_size)
    for name, size in sizes.items():
        if size < rows.client:
            raise TooFewRows(f"{name} has {size} rows; {rows.why} needs at least {rows.client}")
