"""Work that needs torch, done in a short-lived child process: the caller never imports torch.

A process that has not imported torch (a site's ``distrank sketch``, any onnx extraction)
exports a network to ONNX and makes a resize matrix by running
``python -m distrank.features.torch_child JOB ARGS`` and reading back the files it
writes. Importing torch costs a process about 540 MB of memory on its own (a CUDA build:
its cuBLASLt library alone about 150 MB), which the caller would keep for its whole run,
extraction included; the child holds it only for the few seconds of the job. The child
ends with :func:`os._exit` once its files are written: torch's interpreter shutdown
raises a process's peak by about 130 MB.

The jobs are the same torch calls the caller would make itself (:func:`export_reference`,
:func:`distrank.features.preprocess.resize_matrix`), so their files are the same bytes.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Recipe", "export_reference", "run"]


@dataclass(frozen=True)
class Recipe:
    """A torch module named by the function that builds it, ``"package.module:function"``,
    and its JSON arguments: what a child process needs to build the same module."""

    function: str
    kwargs: dict = field(default_factory=dict)

    def build(self):
        module, name = self.function.split(":")
        return getattr(importlib.import_module(module), name)(**self.kwargs)


def export_reference(model, path, size: tuple[int, int]) -> dict[str, np.ndarray]:
    """Export ``model`` to ``path`` (:func:`~distrank.features.onnx_backend.export_onnx`)
    and return torch's features of a seeded random batch, ``{"x": ..., "want": ...}``, which
    the export's check compares onnxruntime's with."""
    import torch

    from .onnx_backend import export_onnx

    export_onnx(model, path, size)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = model(x).numpy()
    return {"x": x.numpy(), "want": want}


def run(job: str, **kwargs) -> None:
    """Run ``job`` ("export" or "resize", with its JSON arguments) in a child process and
    wait for it; a failure raises :class:`RuntimeError` with the end of the child's stderr."""
    src = str(Path(__file__).resolve().parents[2])  # the folder that holds distrank
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", __name__, job, json.dumps(kwargs)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"the torch child process ({job}) exited {done.returncode}:\n{tail}")


def _main(job: str, kwargs: dict) -> None:
    if job == "export":
        import torch

        model = Recipe(**kwargs["recipe"]).build()
        # oneDNN's convolution caches add 16 MB to the child's peak; the exported graph does
        # not depend on how torch runs the trace (the same file bytes), the check's
        # reference only to float32 rounding
        with torch.backends.mkldnn.flags(enabled=False):
            check = export_reference(model, kwargs["path"], tuple(kwargs["size"]))
        np.savez(kwargs["check"], **check)
    elif job == "resize":
        from .preprocess import resize_matrix

        out = kwargs.pop("out")
        np.save(out, resize_matrix(**kwargs))
    else:
        raise ValueError(f"unknown job {job!r}")


if __name__ == "__main__":
    _main(sys.argv[1], json.loads(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's shutdown (module docstring)
