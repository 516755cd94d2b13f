"""The ``distrank`` command line: one subcommand per task.

    distrank score --reference REF.npz --model NAME=PATH.npz [--model ...] --out scores.csv

scores every model against the client-split reference in both aggregations and
writes the tidy table (model, metric, aggregation, client, value). Feature files are
npz archives read without pickle: the reference holds ``features`` (n x d) and
``clients`` (n labels, int or str); a model file holds ``features`` (m x d).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from distrank._io import atomic_path

METRIC_NAMES = ("kd", "fd", "precision", "recall", "density", "coverage")


class InputError(ValueError):
    """A problem with the command's input, already worded for the user."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``distrank`` command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except (InputError, ValueError, OSError) as err:
        print(f"distrank {args.command}: error: {err}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distrank",
        description="Consistent distributed ranking of generative models via kernel distances.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_score_command(sub)
    return parser


def add_score_command(sub) -> None:
    p = sub.add_parser(
        "score", help="score models against client-split reference features",
        description="Score every model by every metric, pooled (all), averaged over clients "
                    "(avg) and per client; write a tidy CSV and print a summary.")
    p.add_argument("--reference", required=True, type=Path, metavar="REF.npz",
                   help="npz with 'features' (n x d) and 'clients' (n labels)")
    p.add_argument("--model", required=True, action="append", type=_model_spec,
                   metavar="NAME=PATH.npz", dest="models",
                   help="a model's generated features (npz with 'features'); repeatable")
    p.add_argument("--metric", nargs="+", choices=METRIC_NAMES, default=list(METRIC_NAMES),
                   dest="metrics", help="metrics to compute (default: all)")
    p.add_argument("--kernel", choices=("poly", "rbf", "laplace", "linear"), default="poly",
                   help="KD kernel (default: poly, KID's)")
    p.add_argument("--kernel-param", action="append", type=_kernel_param, default=[],
                   metavar="NAME=VALUE", dest="kernel_params",
                   help="kernel parameter, e.g. bandwidth=2.5 or degree=3; repeatable "
                        "(rbf/laplace bandwidth default: median heuristic on the pooled reference)")
    p.add_argument("--kd-estimator", choices=("unbiased", "biased", "subsets"),
                   default="unbiased", help="KD estimator (default: unbiased)")
    p.add_argument("--n-subsets", type=int, default=100, help="KD subsets mode: subsets")
    p.add_argument("--subset-size", type=int, default=1000, help="KD subsets mode: subset rows")
    p.add_argument("--seed", type=int, default=0, help="seed of subsets and median heuristic")
    p.add_argument("--weights", choices=("size", "uniform"), default="size",
                   help="client weights of avg: n_i/n (size) or 1/k (uniform)")
    p.add_argument("--pr-k", type=int, default=3, help="k of Precision and Recall")
    p.add_argument("--dc-k", type=int, default=5, help="k of Density and Coverage")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="float32: fast products, float64 sums; float64: exact")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    p.add_argument("--out", required=True, type=Path, metavar="scores.csv",
                   help="output CSV (written only on success)")
    p.set_defaults(run=run_score)


def run_score(args) -> int:
    from distrank.metrics import score  # torch is imported only when scoring

    reference, clients = _load_reference(args.reference)
    models = {}
    for name, path in args.models:
        if name in models:
            raise InputError(f"--model: model name {name!r} given twice")
        models[name] = _load_features(path, "features", d=reference.shape[1],
                                      d_source=args.reference)
    try:
        table = score(reference, clients, models, metrics=args.metrics, kernel=args.kernel,
                      kernel_params=dict(args.kernel_params) or None,
                      kd_estimator=args.kd_estimator, n_subsets=args.n_subsets,
                      subset_size=args.subset_size, seed=args.seed, weights=args.weights,
                      pr_k=args.pr_k, dc_k=args.dc_k, dtype=args.dtype, device=args.device)
    except ValueError as err:
        raise InputError(_blame(str(err), args.reference, dict(args.models))) from None
    with atomic_path(args.out) as tmp:
        table.to_csv(tmp, index=False)
    print(summary(table))
    print(f"\nwrote {len(table)} rows to {args.out}")
    return 0


def summary(table: pd.DataFrame) -> str:
    """The all/avg values as a model x metric table, and Kendall tau(all, avg) per metric."""
    from scipy.stats import kendalltau

    pooled = table[table.aggregation.isin(["all", "avg"])]
    wide = pooled.pivot_table(index="model", columns=["metric", "aggregation"], values="value",
                              sort=False)
    lines = [wide.to_string(float_format=lambda v: f"{v:.6g}"), "",
             "Kendall tau between the 'all' and 'avg' rankings of the models:"]
    for metric in dict.fromkeys(pooled.metric):
        if (metric, "avg") not in wide.columns:
            continue
        both = wide[metric][["all", "avg"]].dropna()
        if len(both) < 2:
            tau = "n/a (fewer than 2 models)"
        else:
            value = kendalltau(both["all"], both["avg"]).statistic
            tau = "n/a (ties)" if np.isnan(value) else f"{value:+.3f}"
        lines.append(f"  {metric:<10} {tau}")
    return "\n".join(lines)


def _model_spec(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH.npz, got {text!r}")
    return name, Path(path)


def _kernel_param(text: str) -> tuple[str, float | int]:
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: expected a number, got {value!r}") from None
    return name, int(number) if name == "degree" and number.is_integer() else number


def _load_reference(path: Path) -> tuple[np.ndarray, np.ndarray]:
    features = _load_features(path, "features")
    clients = _load_array(path, "clients")
    if clients.ndim != 1 or len(clients) != len(features):
        raise InputError(f"{path}: 'clients' has shape {clients.shape}; expected "
                         f"({len(features)},), one label per row of 'features'")
    if clients.dtype.kind not in "iuU":
        raise InputError(f"{path}: 'clients' must hold int or str labels, got {clients.dtype}")
    return features, clients


def _load_features(path: Path, key: str, d: int | None = None, d_source=None) -> np.ndarray:
    x = _load_array(path, key)
    if x.ndim != 2 or 0 in x.shape:
        raise InputError(f"{path}: {key!r} has shape {x.shape}; expected non-empty (rows, d)")
    if x.dtype.kind not in "iuf":
        raise InputError(f"{path}: {key!r} must be numeric, got {x.dtype}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).any(axis=1).sum())
        raise InputError(f"{path}: {key!r} has NaN or infinite values in {bad} rows")
    if d is not None and x.shape[1] != d:
        raise InputError(f"{path}: {key!r} has dimension {x.shape[1]}, but the reference "
                         f"{d_source} has {d}")
    return x


def _load_array(path: Path, key: str) -> np.ndarray:
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (ValueError, OSError, EOFError) as err:
        raise InputError(f"{path}: not a readable npz archive ({err})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise InputError(f"{path}: expected an npz archive, got a single array")
    with archive:
        if key not in archive.files:
            raise InputError(f"{path}: no {key!r} array (has {sorted(archive.files)})")
        try:
            return archive[key]
        except ValueError as err:  # e.g. an object array, which would need pickle
            raise InputError(f"{path}: cannot read {key!r} without pickle ({err})") from None


def _blame(message: str, reference: Path, models: dict[str, Path]) -> str:
    """Prefix a metrics error with the file it is about."""
    if message.startswith(("reference", "clients")):
        return f"{reference}: {message}"
    for name, path in models.items():
        if message.startswith(f"models[{name!r}]"):
            return f"{path}: {message}"
    return message
