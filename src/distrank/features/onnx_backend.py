"""The ONNX backend shared by the extractors: a network exported once, run by onnxruntime.

:class:`OnnxNetwork` exports a torch module (N, 3, H, W) -> (N, d) with
``torch.onnx.export`` into ``<weights dir>/onnx/<stem>-torch<version>-opset<k>.onnx``
(so a new torch or opset exports again), refuses an export whose features differ
from torch's on a seeded random batch, and reuses the file after; a cached file that
onnxruntime cannot read is exported again. Features agree with torch to ~1e-5 and are
bitwise reproducible across batch sizes and thread counts, which eager torch is not.
The graph holds only the network: preprocessing stays numpy code, the same for both
backends.

torch is imported only to export: a process that finds the file runs it with onnxruntime
alone (the export's name reads torch's version from ``torch/version.py``, unimported). The
module to export may be given as a :class:`~distrank.features.torch_child.Recipe` that
builds it: a process that has not imported torch then exports in a short-lived child
process (:mod:`distrank.features.torch_child`) and checks the file against the child's
torch features itself, so it never imports torch, even on the first run.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .torch_child import Recipe, run

if TYPE_CHECKING:
    from torch import nn

__all__ = ["ONNX_OPSET", "OnnxNetwork", "export_onnx", "ort_session", "torch_version"]

log = logging.getLogger(__name__)

ONNX_OPSET = 17


@functools.cache
def torch_version() -> str:
    """``torch.__version__`` (e.g. ``2.14.1+cu130``, with the local tag the distribution's
    metadata lacks), read from the installed ``torch/version.py`` without importing torch."""
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("torch is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if [getattr(t, "id", None) for t in targets] == ["__version__"]:
            return str(ast.literal_eval(node.value))
    raise RuntimeError(f"{path} defines no __version__")


def _is_module(obj) -> bool:
    torch = sys.modules.get("torch")  # a torch module exists only once torch is imported
    return torch is not None and isinstance(obj, torch.nn.Module)


class OnnxNetwork:
    """``model`` exported once under ``directory/onnx/`` and run by onnxruntime on the CPU.

    ``model`` is the torch module or a :class:`~distrank.features.torch_child.Recipe` that
    builds it, used only when the file must be exported (in a child process where this
    one has not imported torch); ``stem`` names what determines the graph besides torch and the
    opset (network, resolution, weights digest); ``size`` is the input's (height, width).
    """

    def __init__(
        self,
        model: nn.Module | Recipe,
        directory: str | os.PathLike,
        stem: str,
        size: tuple[int, int],
        num_threads: int | None = None,
    ):
        self._model, self.size = model, tuple(size)
        tag = torch_version().replace("+", "_")
        self.path = Path(directory) / "onnx" / f"{stem}-torch{tag}-opset{ONNX_OPSET}.onnx"
        self._export()
        try:
            self.session = ort_session(self.path, num_threads)
        except Exception as err:  # onnxruntime raises its own types for unreadable graphs
            log.warning(
                "cached ONNX export %s is unusable (%s); exporting it again", self.path, err
            )
            self.path.unlink(missing_ok=True)
            self._export()
            self.session = ort_session(self.path, num_threads)
        self.input_name = self.session.get_inputs()[0].name

    @property
    def model(self) -> nn.Module:
        if not _is_module(self._model):
            self._model = self._model.build()
        return self._model

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """float32 (N, 3, H, W) -> float32 (N, d)."""
        return self.session.run(None, {self.input_name: x})[0].astype(np.float32, copy=False)

    def _export(self) -> None:
        """Export unless the file exists; concurrent exporters write the same graph, the
        last rename wins."""
        if self.path.is_file():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.stem}.", suffix=".onnx.tmp"
        )
        os.close(fd)
        check = f"{tmp}.check.npz"
        try:
            if isinstance(self._model, Recipe) and "torch" not in sys.modules:
                recipe = dataclasses.asdict(self._model)
                job = f"{__name__}:export_checked"
                run(job, recipe=recipe, path=tmp, size=self.size, check=check)
                with np.load(check) as npz:
                    reference = dict(npz)
            else:
                reference = export_reference(self.model, tmp, self.size)
            _check_matches(tmp, reference["x"], reference["want"])
            os.replace(tmp, self.path)
        finally:
            Path(tmp).unlink(missing_ok=True)
            Path(check).unlink(missing_ok=True)
        log.info("exported %s", self.path)


def export_reference(model, path, size: tuple[int, int]) -> dict[str, np.ndarray]:
    """Export ``model`` to ``path`` (:func:`export_onnx`) and return torch's features of a
    seeded random batch, ``{"x": ..., "want": ...}``, which the export's check compares
    onnxruntime's with."""
    import torch

    export_onnx(model, path, size)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = model(x).numpy()
    return {"x": x.numpy(), "want": want}


def export_checked(recipe: dict, path: str, size: list[int], check: str) -> None:
    """The child process's export (:mod:`distrank.features.torch_child`): build the
    ``Recipe``'s module, export it to ``path`` and save its check to ``check``."""
    import torch

    model = Recipe(**recipe).build()
    # oneDNN's convolution caches add 16 MB to the child's peak; the exported graph does not
    # depend on how torch runs the trace (the same file bytes), the check's reference only
    # to float32 rounding
    with torch.backends.mkldnn.flags(enabled=False):
        np.savez(check, **export_reference(model, path, tuple(size)))


def export_onnx(model: nn.Module, path: str | os.PathLike, size: tuple[int, int]) -> None:
    """Export ``model``, ``(N, 3, *size) -> (N, d)``, to ONNX with a dynamic batch dimension."""
    import torch

    model = model.to("cpu", memory_format=torch.contiguous_format).eval()
    dummy = torch.zeros(2, 3, *size)
    with warnings.catch_warnings():
        # The TorchScript-based exporter is deprecated in favour of the torch.export one,
        # which needs the extra onnxscript package; the graphs here are plain convolutions.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (dummy,),
            str(path),
            input_names=["images"],
            output_names=["features"],
            dynamic_axes={"images": {0: "batch"}, "features": {0: "batch"}},
            opset_version=ONNX_OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def ort_session(path: str | os.PathLike, num_threads: int | None):
    """An onnxruntime CPU session with ``num_threads`` intra-op threads (default: torch's
    where torch is imported, else ``$OMP_NUM_THREADS``, else this process's CPUs; the
    features do not depend on it)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(num_threads or _default_threads())
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Extraction shares the cores with preprocessing and with other pipeline jobs; idle
    # onnxruntime threads that spin-wait steal them (measured: slower medians on 2 busy cores).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _default_threads() -> int:
    if "torch" in sys.modules:
        return sys.modules["torch"].get_num_threads()
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _check_matches(path, x: np.ndarray, want: np.ndarray, atol: float = 1e-4) -> None:
    """Refuse an export whose features of ``x`` differ from torch's, ``want``
    (:func:`export_reference`: a seeded random batch)."""
    got = ort_session(Path(path), 1).run(None, {"images": x})[0]
    err = float(np.abs(got - want).max())
    if not err <= atol:
        raise RuntimeError(f"ONNX export {path} differs from torch by {err:.2e} (> {atol:.0e})")
