"""What the commands share: exit codes, argument types, the feature-extraction
arguments and the library defaults they show."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_CODES = """\
exit status:
  0    success
  1    unexpected error (a bug: the traceback is printed; please report it)
  2    usage error: unknown option, malformed or missing value (nothing was read)
  3    bad input: a file is missing, unreadable or unsuitable for the metrics; the
       message names the file, and nothing was written
  4    feature weights missing and not downloadable (e.g. DISTRANK_OFFLINE=1); the
       message names the file and the folder to put it in
  130  interrupted (Ctrl-C); nothing was written
"""
EXIT_OK, EXIT_USAGE, EXIT_INPUT, EXIT_WEIGHTS, EXIT_INTERRUPTED = 0, 2, 3, 4, 130


class UsageError(ValueError):
    """Arguments that do not go together (exit status 2); raised before any input is read."""


def missing_weights(err: BaseException) -> bool:
    weights = sys.modules.get("distrank.features.weights")  # imported by any extractor
    return weights is not None and isinstance(err, weights.WeightsNotFoundError)


def library_defaults(function: Callable) -> dict[str, object]:
    """The keyword defaults of a library function (the CLI never restates them)."""
    return {
        name: p.default
        for name, p in inspect.signature(function).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def add_extractor_arguments(p: argparse.ArgumentParser) -> None:
    """How images become features: shared by ``extract`` and ``score``."""
    from distrank.features.base import BACKENDS, Extractor, available_extractors, get_extractor
    from distrank.features.cache import cached_input_features, default_cache_dir
    from distrank.features.weights import weights_dir

    extract = library_defaults(cached_input_features)
    g = p.add_argument_group("feature extraction (for image inputs)")
    g.add_argument(
        "--extractor",
        choices=available_extractors(),
        default=library_defaults(get_extractor)["name"],
        help="feature network (default: %(default)s)",
    )
    g.add_argument(
        "--backend",
        choices=("auto", *BACKENDS),
        default="auto",
        help="auto (default): onnx on the CPU where the extractor has it, else torch",
    )
    g.add_argument(
        "--device",
        default=None,
        help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)",
    )
    g.add_argument(
        "--batch-size",
        type=positive,
        metavar="N",
        default=extract["batch_size"],
        help="images per forward pass (default: the extractor's, "
        f"{Extractor.default_batch_size} for most)",
    )
    g.add_argument(
        "--workers",
        type=positive,
        default=extract["workers"],
        metavar="N",
        help="processes decoding image files; 1: a thread of this process (default: %(default)s)",
    )
    g.add_argument(
        "--weights-dir",
        type=Path,
        default=None,
        help=f"folder of network weights (default: {weights_dir()}; "
        "DISTRANK_WEIGHTS_DIR; DISTRANK_OFFLINE=1 never downloads)",
    )
    g.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"feature cache (default: {default_cache_dir()}; DISTRANK_CACHE_DIR)",
    )
    g.add_argument(
        "--no-cache",
        action="store_true",
        help="extract into a temporary folder, removed afterwards",
    )


def input_features(args):
    """The :class:`~distrank.features.inputs.InputFeatures` of the extraction arguments."""
    from distrank.features.inputs import InputFeatures

    names = ("backend", "device", "weights_dir", "cache_dir", "no_cache", "batch_size", "workers")
    return InputFeatures(args.extractor, **{name: getattr(args, name) for name in names})


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """At most ``n`` CPU threads for torch and every loaded BLAS/OpenMP library, restored
    on exit (``None``: unchanged). BLAS threads on a core another process holds slow
    every product, so a job should use the cores it holds (FD runs ``n`` one-thread
    eigenproblems at once: ``metrics.fd._frechet.one_thread_each``)."""
    if n is None:
        yield
        return
    import torch
    from threadpoolctl import threadpool_limits

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        torch.set_num_threads(previous)


# ---------------------------------------------------------------------------
# Argument types


def named_path(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, Path(path)


def kernel_param(text: str) -> tuple[str, float | int]:
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: expected a number, got {value!r}") from None
    return name, int(number) if name == "degree" and number.is_integer() else number


def even_positive(text: str) -> int:
    value = positive(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"expected an even positive integer, got {text!r}")
    return value


def _number(text: str, ok, expected: str) -> float:
    """``float(text)`` if ``ok`` of it (NaN fails), else argparse's error."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def epsilon_value(text: str) -> float:
    """An epsilon of a Gaussian release, within ``metrics._privacy.EPSILON_RANGE``."""
    from distrank._checks import EPSILON_RANGE

    low, high = EPSILON_RANGE
    return _number(text, lambda v: low <= v <= high, f"a number in [{low:g}, {high:g}]")


def open_unit(text: str) -> float:
    """A number in (0, 1): a delta, a level."""
    return _number(text, lambda v: 0 < v < 1, "a number in (0, 1)")


def positive_float(text: str) -> float:
    return _number(text, lambda v: math.isfinite(v) and v > 0, "a positive number")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def print_confidence(confidence) -> None:
    """Print, per ranking of a confidence record (``metrics.sketch._confidence``), how
    sure the whole order is and every adjacent pair the noise leaves unresolved."""
    for agg, whole in confidence["order"].items():
        open_ = [p for p in confidence["pairs"] if p["aggregation"] == agg and not p["resolved"]]
        print(
            f"\n{agg}: the whole order holds with probability {whole:.3f}; {len(open_)} "
            f"adjacent pair(s) unresolved at level {confidence['level']:g}"
            + "".join(
                f"\n  {p['model']} vs {p['next']}: gap {p['gap']:.4g}, noise std "
                f"{p['noise_std']:.3g}, P(order) {p['p_order']:.3f}"
                for p in open_
            )
        )
