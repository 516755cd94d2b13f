"""Work that needs torch, done in a short-lived child process: the caller never imports torch.

A process that has not imported torch (a site's ``distrank sketch``, any onnx extraction)
exports a network to ONNX and makes a resize matrix by running
``python -m distrank.features.torch_child JOB ARGS`` and reading back the files it
writes. Importing torch costs a process about 540 MB of memory on its own (a CUDA build:
its cuBLASLt library alone about 150 MB), which the caller would keep for its whole run,
extraction included; the child holds it only for the few seconds of the job. The child
runs on the CPU: once torch is imported it drops its clean pages of the CUDA libraries
(:func:`release_gpu_libraries`, about 140 MB of a CUDA build's 510 MB), so that the job's own
memory stays below the import's peak. It ends with :func:`os._exit` once its files are
written: torch's interpreter shutdown raises a process's peak by about 130 MB.

A job is a function named like a ``Recipe``
(:func:`distrank.features.onnx_backend.export_checked`,
:func:`distrank.features.preprocess.save_resize_matrix`): the same torch calls the caller
would make itself, so their files are the same bytes. This module imports nothing of
distrank's, so the modules that call it import it and not the reverse.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Recipe", "release_gpu_libraries", "run"]

# CUDA runtime, cuBLAS(Lt), cuDNN, NCCL, NVRTC, nvJitLink, ... and torch's own CUDA parts
_GPU_LIBRARY = re.compile(r"/lib(cu|nv|nccl|torch_cuda|c10_cuda|torch_nvshmem)[^/]*\.so[.0-9]*$")
_MADV_DONTNEED = 4


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


def release_gpu_libraries() -> int:
    """Drop this process's resident pages of the CUDA libraries that equal their files.

    ``import torch`` from a CUDA build maps and initialises the CUDA libraries even where
    no GPU is used (cuBLASLt alone adds about 150 MB); a CPU-only job reads none of their
    pages after that. Each read-only mapping of such a library whose pages are all clean
    (no private copy: ``Anonymous: 0 kB`` in ``/proc/self/smaps``) is released with
    ``madvise(MADV_DONTNEED)``: a page touched again is read back from the same file,
    so this changes memory use, never results. Linux only; elsewhere nothing happens.

    Returns
    -------
    int
        The number of mappings released.
    """
    if not sys.platform.startswith("linux"):
        return 0
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    released, mapping = 0, None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):  # a mapping's header: range perms ... path
                path = fields[5] if len(fields) > 5 else ""
                clean = "w" not in fields[1] and _GPU_LIBRARY.search(path)
                mapping = fields[0] if clean else None
            elif fields[0] == "Anonymous:" and mapping and fields[1] == "0":
                start, end = (int(x, 16) for x in mapping.split("-"))
                released += madvise(start, end - start, _MADV_DONTNEED) == 0
    return released


if __name__ == "__main__":
    import torch  # noqa: F401  (every job's; loads the CUDA libraries of a CUDA build)

    release_gpu_libraries()
    Recipe(sys.argv[1], json.loads(sys.argv[2])).build()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's shutdown (module docstring)
