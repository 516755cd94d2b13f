"""Work that needs torch, done in a short-lived child process: the caller never imports torch.

A process that has not imported torch (a site's ``distrank sketch``, any onnx extraction)
exports a network to ONNX and makes a resize matrix by running
``python -m distrank.features.torch_child JOB ARGS`` and reading back the files it
writes. Importing torch costs a process about 540 MB of memory on its own (a CUDA build:
its cuBLASLt library alone about 150 MB), which the caller would keep for its whole run,
extraction included; the child holds it only for the few seconds of the job. The child
ends with :func:`os._exit` once its files are written: torch's interpreter shutdown
raises a process's peak by about 130 MB.

A job is a function named like a :class:`Recipe`
(:func:`distrank.features.onnx_backend.export_checked`,
:func:`distrank.features.preprocess.save_resize_matrix`): the same torch calls the caller
would make itself, so their files are the same bytes. This module imports nothing of
distrank's, so the modules that call it import it and not the reverse.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Recipe", "run"]


@dataclass(frozen=True)
class Recipe:
    """A torch module named by the function that builds it, ``"package.module:function"``,
    and its JSON arguments: what a child process needs to build the same module."""

    function: str
    kwargs: dict = field(default_factory=dict)

    def build(self):
        module, name = self.function.split(":")
        return getattr(importlib.import_module(module), name)(**self.kwargs)


def run(function: str, **kwargs) -> None:
    """Call ``function`` (``"package.module:function"``, which writes its own files) with
    ``kwargs`` (JSON) in a child process and wait for it; a failure raises
    :class:`RuntimeError` with the end of the child's stderr."""
    src = str(Path(__file__).resolve().parents[2])  # the folder that holds distrank
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", __name__, function, json.dumps(kwargs)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(
            f"the torch child process ({function}) exited {done.returncode}:\n{tail}"
        )


if __name__ == "__main__":
    Recipe(sys.argv[1], json.loads(sys.argv[2])).build()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's shutdown (module docstring)
