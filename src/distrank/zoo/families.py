"""What the learned families (cGAN, VAE, diffusion) share: images as tensors and back,
label checks, shuffled training batches, the loss log, loading a trained network and
sampling it in batches. torch is imported on first use."""

from __future__ import annotations

import logging

import numpy as np

_log = logging.getLogger(__name__)

__all__ = [
    "to_float",
    "to_uint8",
    "check_labels",
    "training_labels",
    "shuffled_batches",
    "LossLog",
    "quarter_side",
    "sample_labels",
    "load_network",
    "in_batches",
]


def to_float(images):
    """uint8 images (N, H, W) -> float32 tensor (N, 1, H, W) in [-1, 1]."""
    import torch

    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(
            f"argument 'images' must be uint8 (N,H,W), got {images.dtype} {images.shape}"
        )
    return torch.from_numpy(images.astype(np.float32)).div_(127.5).sub_(1.0).unsqueeze(1)


def to_uint8(x) -> np.ndarray:
    """float tensor (N, 1, H, W) in [-1, 1] -> uint8 images (N, H, W)."""
    import torch

    return x.squeeze(1).add(1.0).mul(127.5).round().clamp(0, 255).to(torch.uint8).numpy()


def check_labels(labels, n, n_classes=None) -> np.ndarray:
    """Validate int labels of length ``n`` (in ``0..n_classes-1`` when given)."""
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"argument 'labels' must be {n} ints, got {labels.dtype} {labels.shape}")
    if n_classes is not None and n and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"argument 'labels' must lie in 0..{n_classes - 1}")
    return labels.astype(np.int64)


def training_labels(x_all, labels, n_classes: int | None, batch_size: int):
    """The checked int64 label tensor of training images ``x_all`` and the class count
    (``max + 1`` unless given); a batch must fit in the images."""
    import torch

    y_all = torch.from_numpy(check_labels(labels, len(x_all)))
    n_classes = int(y_all.max()) + 1 if n_classes is None else n_classes
    check_labels(labels, len(x_all), n_classes)
    if len(x_all) < batch_size:
        raise ValueError(f"argument 'batch_size' ({batch_size}) exceeds the {len(x_all)} images")
    return y_all, n_classes


def shuffled_batches(n: int, batch_size: int, rng):
    """Endless index batches of ``n`` rows: consecutive slices of a permutation drawn
    from ``rng``, a fresh one whenever fewer than ``batch_size`` rows are left."""
    import torch

    while True:
        order = torch.randperm(n, generator=rng)
        for pos in range(0, n - batch_size + 1, batch_size):
            yield order[pos : pos + batch_size]


class LossLog:
    """Mean losses over each ``log_every`` steps (and up to the last step): ``history``
    (``step`` and one list per loss name) and a log line per interval."""

    def __init__(self, family: str, steps: int, log_every: int, names: tuple[str, ...]):
        self.family, self.steps, self.every = family, steps, log_every
        self.history = {"step": [], **{name: [] for name in names}}
        self._sums = dict.fromkeys(names, 0.0)

    def add(self, step: int, **losses: float) -> None:
        for name, value in losses.items():
            self._sums[name] += value
        if step % self.every == 0 or step == self.steps:
            k = (step - 1) % self.every + 1
            self.history["step"].append(step)
            for name, total in self._sums.items():
                self.history[name].append(total / k)
                self._sums[name] = 0.0
            means = " ".join(f"{name} {self.history[name][-1]:.4f}" for name in self._sums)
            _log.info("%s step %d/%d: %s", self.family, step, self.steps, means)


def quarter_side(side: int) -> int:
    """The side of the 4x-downsampled feature map of the zoo's networks (two stride-2
    layers), for images ``side`` pixels wide."""
    if side % 4:
        raise ValueError(f"image side must be a multiple of 4, got {side}")
    return side // 4


def sample_labels(labels, n: int, n_classes: int) -> np.ndarray:
    """``labels`` checked (int64), or balanced classes ``arange(n) % n_classes``."""
    if labels is None:
        return np.arange(n, dtype=np.int64) % n_classes
    return check_labels(labels, n, n_classes)


def load_network(network_cls, state: dict):
    """The state's network, ``network_cls(z_dim, n_classes, width, side)``, in eval mode."""
    cfg = state["config"]
    net = network_cls(cfg["z_dim"], cfg["n_classes"], cfg["width"], cfg["side"])
    net.load_state_dict(state["generator"])
    return net.eval()


def in_batches(fn, n: int, batch_size: int, side: int) -> np.ndarray:
    """``fn(start, stop)`` -> uint8 images, over ``n`` rows in batches, concatenated."""
    if not n:
        return np.empty((0, side, side), np.uint8)
    return np.concatenate([fn(i, min(n, i + batch_size)) for i in range(0, n, batch_size)])
