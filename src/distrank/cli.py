"""The ``distrank`` command line: images or features in, scores and a report out.

    distrank extract INPUT... --out FEATURES.npz
    distrank score --reference REF --model NAME=PATH [--model ...] --out scores.csv
    distrank report scores.csv --out report.html

Inputs are image folders (recursive; png, jpg, jpeg, webp, in sorted path order),
image npz batches (``arr_0`` or ``images``, uint8 NHWC), CSV manifests (columns
``path`` and optionally ``client``) or, for ``score``, feature npz files
(``features`` (n x d), a reference also ``clients``). See :mod:`distrank.data.folders`.
Images are turned into features by the package's extractors, through the feature
cache (:func:`distrank.features.cache.cached_input_features`), so a second run on
the same images reads the features back.

Every default of an option is the library's: the scorer's keyword defaults
(``distrank.metrics.score``), the metric registry (``distrank.metrics.registry``),
the extractor registry and the cache's. They are read when the command's parser
is built, which imports torch only for the command that needs it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from distrank._io import atomic_path
from distrank._progress import set_quiet
from distrank.metrics.registry import METRIC_KEYS

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
FORMATS = {".csv": "csv", ".json": "json", ".md": "markdown"}
SCORES_FORMAT = "distrank.scores/1"


class InputError(ValueError):
    """A problem with the command's input, already worded for the user."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``distrank`` command line; returns the exit status (see ``EXIT_CODES``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    previous = set_quiet(True) if args.quiet else None
    try:
        return args.run(args)
    except (ValueError, OSError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"distrank {args.command}: error: {message}", file=sys.stderr)
        return EXIT_WEIGHTS if _missing_weights(err) else EXIT_INPUT
    except KeyboardInterrupt:
        print(f"distrank {args.command}: interrupted; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if args.quiet:
            set_quiet(previous)


def _missing_weights(err: BaseException) -> bool:
    weights = sys.modules.get("distrank.features.weights")  # imported by any extractor
    return weights is not None and isinstance(err, weights.WeightsNotFoundError)


# ---------------------------------------------------------------------------
# The parser. Each command has a help line, a description and a function that
# adds its arguments; only the command being run gets its arguments (and their
# defaults, which may import torch).


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``distrank`` parser; ``command`` (None: none) gets its full arguments."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bars (also: DISTRANK_QUIET=1)"
    )
    parser = argparse.ArgumentParser(
        prog="distrank",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Consistent distributed ranking of generative models via kernel distances.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_line, description, add_arguments) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=help_line,
            description=description,
            epilog=EXIT_CODES,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name == command:
            add_arguments(p)
    return parser


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
        type=_positive,
        metavar="N",
        default=extract["batch_size"],
        help="images per forward pass (default: the extractor's, "
        f"{Extractor.default_batch_size} for most)",
    )
    g.add_argument(
        "--workers",
        type=_positive,
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


# ---------------------------------------------------------------------------
# distrank extract


def add_extract_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "inputs",
        nargs="*",
        type=Path,
        metavar="INPUT",
        help="image folder, image npz (arr_0 or images) or CSV manifest "
        "(path[,client]); rows are concatenated in the order given",
    )
    p.add_argument(
        "--client",
        action="append",
        type=_named_path,
        default=[],
        dest="clients",
        metavar="NAME=PATH",
        help="the images of one client (folder, image npz or "
        "manifest); repeatable; writes 'clients'",
    )
    p.add_argument(
        "--client-subfolders",
        action="store_true",
        help="the top-level subfolders of each INPUT folder are its clients",
    )
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="FEATURES.npz",
        help="npz with 'features' (n x d) and, when the inputs name clients, "
        "'clients'; metadata in FEATURES.npz.meta.json",
    )
    add_extractor_arguments(p)
    p.set_defaults(run=run_extract)


def run_extract(args) -> int:
    from distrank.features.cache import input_metadata, write_features

    sources = [(path, None) for path in args.inputs] + [(path, name) for name, path in args.clients]
    if not sources:
        raise InputError("give at least one INPUT or --client NAME=PATH")
    with Features(args) as features:
        parts = [
            features.of(path, client=name, subfolders=args.client_subfolders)
            for path, name in sources
        ]
        with_clients = [p.clients is not None for p in parts]
        if any(with_clients) and not all(with_clients):
            bare = next(p.path for p in parts if p.clients is None)
            raise InputError(
                f"{bare}: has no clients, but other inputs do; give every input "
                "its clients (--client NAME=PATH, a manifest 'client' column or "
                "--client-subfolders)"
            )
        arrays = {"features": np.concatenate([p.features for p in parts])}
        if all(with_clients):
            arrays["clients"] = np.concatenate([p.clients.astype(str) for p in parts])
        inputs = [
            {"path": str(p.path), **{k: p.meta[k] for k in ("n", "input_sha256")}} for p in parts
        ]
        digest = _sha256_text("".join(i["input_sha256"] for i in inputs))
        meta = input_metadata(
            features.extractor,
            n=len(arrays["features"]),
            input_sha256=digest,
            input_shape=parts[0].meta["input_shape"] if len(parts) == 1 else None,
            extra_meta={"inputs": inputs, "clients": "clients" in arrays},
        )
    write_features(args.out, arrays, meta)
    clients = f", {len(set(arrays['clients']))} clients" if "clients" in arrays else ""
    print(
        f"wrote {arrays['features'].shape[0]} x {arrays['features'].shape[1]} "
        f"{meta['extractor']} features{clients} to {args.out}"
    )
    return EXIT_OK


# ---------------------------------------------------------------------------
# distrank score


def add_score_arguments(p: argparse.ArgumentParser) -> None:
    add_score_input_arguments(p)
    add_metric_arguments(p)
    add_private_and_interval_arguments(p)
    add_output_arguments(p)
    add_extractor_arguments(p)
    p.set_defaults(run=run_score)


def add_private_and_interval_arguments(p: argparse.ArgumentParser) -> None:
    from distrank.metrics.bootstrap import bootstrap_scores

    d = library_defaults(bootstrap_scores)
    g = p.add_argument_group("private scores and intervals (distrank.metrics.privacy, .bootstrap)")
    g.add_argument(
        "--private",
        type=float,
        metavar="EPSILON",
        help="every client releases its KD of each model through the Gaussian mechanism, "
        "EPSILON (with --delta) split over the models; the table holds the noisy client "
        "values and their average, the metadata the budget spent. Needs --metric kd and "
        "--kernel rbf or laplace with --kernel-param bandwidth=... (not from the clients)",
    )
    g.add_argument("--delta", type=float, metavar="DELTA", help="delta of each client's budget")
    g.add_argument(
        "--intervals",
        type=int,
        metavar="N",
        help="add columns low and high: percentile bootstrap intervals from N resamples "
        "(reference rows within clients, generated rows per model; KD re-weights its "
        "kernel sums, FD and PRDC rescore every resample)",
    )
    g.add_argument(
        "--confidence-level",
        type=float,
        default=d["confidence_level"],
        help="of --intervals (default: %(default)s)",
    )


def add_score_input_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("inputs (feature npz, image folder, image npz or CSV manifest)")
    ref = g.add_mutually_exclusive_group(required=True)
    ref.add_argument(
        "--reference",
        type=Path,
        metavar="REF",
        help="the clients' reference data: feature npz with 'features' and "
        "'clients', a folder with one subfolder per client, or a manifest "
        "with 'path' and 'client' columns",
    )
    ref.add_argument(
        "--client",
        action="append",
        type=_named_path,
        dest="clients",
        metavar="NAME=PATH",
        help="one client's reference data (feature npz, "
        "image folder, image npz, manifest); repeatable",
    )
    g.add_argument(
        "--model",
        required=True,
        action="append",
        type=_named_path,
        metavar="NAME=PATH",
        dest="models",
        help="a model's samples (feature npz, image folder, image npz, manifest); repeatable",
    )


def add_metric_arguments(p: argparse.ArgumentParser) -> None:
    from distrank._arrays import DTYPES
    from distrank.clients import WEIGHTS
    from distrank.metrics.kd import ESTIMATORS
    from distrank.metrics.kernels import KERNELS
    from distrank.metrics.scoring import score

    d = library_defaults(score)
    g = p.add_argument_group("metrics (defaults: distrank.metrics.score's)")
    g.add_argument(
        "--metric",
        nargs="+",
        choices=METRIC_KEYS,
        default=list(d["metrics"]),
        dest="metrics",
        help="metrics to compute (default: all)",
    )
    g.add_argument(
        "--kernel-param",
        action="append",
        type=_kernel_param,
        default=[],
        metavar="NAME=VALUE",
        dest="kernel_params",
        help="kernel parameter, e.g. bandwidth=2.5 or degree=3; repeatable (rbf/laplace "
        "bandwidth default: median heuristic on the pooled reference)",
    )
    # flag (its dest is score's keyword), choices or int, help
    for flag, kind, text in (
        ("--kernel", KERNELS, "KD kernel"),
        ("--kd-estimator", ESTIMATORS, "KD estimator"),
        ("--n-subsets", int, "subsets estimator: number of subsets"),
        ("--subset-size", int, "subsets estimator: rows per subset"),
        ("--seed", int, "seed of the subsets and the median heuristic"),
        ("--weights", WEIGHTS, "client weights of avg: size = n_i/n, uniform = 1/k"),
        ("--pr-k", int, "k of Precision and Recall"),
        ("--dc-k", int, "k of Density and Coverage"),
        ("--dtype", tuple(DTYPES), "float32: fast products, float64 sums; float64: exact"),
    ):
        typed = {"type": kind, "metavar": "N"} if kind is int else {"choices": kind}
        default = d[flag[2:].replace("-", "_")]
        g.add_argument(flag, default=default, help=f"{text} (default: %(default)s)", **typed)


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="scores.csv",
        help="the tidy table (model, metric, aggregation, client, value), written "
        "only on success; with csv, the run's metadata goes beside it in "
        "scores.csv.meta.json",
    )
    g.add_argument(
        "--format",
        choices=sorted(set(FORMATS.values())),
        default=None,
        help="csv, json (metadata and rows) or markdown (all/avg and Kendall tau); "
        "default: from the suffix of --out (.csv, .json, .md), else csv",
    )


@dataclass
class Scoring:
    """What ``score`` is run on: reference rows, their clients, the models, and which
    file each client and model came from (to name it in errors)."""

    reference: np.ndarray
    clients: np.ndarray
    models: dict[str, np.ndarray]
    client_paths: dict[str, Path]
    model_paths: dict[str, Path]
    reference_path: Path | None
    meta: dict = field(default_factory=dict)


def run_score(args) -> int:
    """Inputs -> features -> scores -> the output file (each step its own function, so a
    new option is one more argument group and one more step)."""
    if args.private is not None and args.intervals is not None:
        raise InputError("--private and --intervals: intervals of private scores are not offered")
    with Features(args) as features:
        scoring = score_inputs(args, features)
    if args.private is not None:
        table = compute_private_scores(scoring, args)
    else:
        table = compute_scores(scoring, args)
    if args.intervals is not None:
        table = add_intervals(table, scoring, args)
    write_scores(table, scoring.meta, args.out, args.format)
    print(summary(table))
    print(f"\nwrote {len(table)} rows to {args.out}")
    return EXIT_OK


def compute_private_scores(scoring: Scoring, args) -> pd.DataFrame:
    """``--private``: ``distrank.metrics.privacy.private_scores``, its budget in the meta."""
    from distrank.metrics.privacy import EPSILON_RANGE, private_scores

    low, high = EPSILON_RANGE
    if not low <= args.private <= high:  # NaN fails too
        raise InputError(
            f"--private: expected an epsilon in [{low:g}, {high:g}], got {args.private!r}"
        )
    if args.delta is None:
        raise InputError("--private needs --delta (the delta of each client's budget)")
    if not 0 < args.delta < 1:
        raise InputError(f"--delta: expected a number in (0, 1), got {args.delta!r}")
    if list(args.metrics) != ["kd"]:
        raise InputError("--private releases KD only: add --metric kd")
    options = {k: getattr(args, k) for k in ("kernel", "kd_estimator", "weights", "seed", "dtype")}
    options["kernel_params"] = dict(args.kernel_params) or None
    try:
        table, budget = private_scores(
            scoring.reference,
            scoring.clients,
            scoring.models,
            epsilon=args.private,
            delta=args.delta,
            device=args.device,
            **options,
        )
    except ValueError as err:
        raise InputError(_blame(str(err), scoring)) from None
    scoring.meta["options"] = {"metrics": ["kd"], **options}
    scoring.meta["privacy"] = {
        "mechanism": "Gaussian, per client and model (distrank.metrics.privacy)",
        "epsilon": budget.epsilon,
        "delta": budget.delta,
        "n_releases": budget.n_releases,
        "noise_multiplier": budget.noise_multiplier,
        "epsilon_spent": budget.epsilon_spent,
    }
    print(
        f"privacy: each client spent epsilon {budget.epsilon_spent:.6g} at delta "
        f"{budget.delta:g} on {budget.n_releases} releases (noise multiplier "
        f"{budget.noise_multiplier:.4g})\n"
    )
    return table


def add_intervals(table: pd.DataFrame, scoring: Scoring, args) -> pd.DataFrame:
    """``--intervals N``: columns low and high from ``distrank.metrics.bootstrap``."""
    from distrank.metrics.bootstrap import bootstrap_scores, flat_summary, score_intervals

    options = {
        k: v for k, v in scoring.meta["options"].items() if k not in ("n_subsets", "subset_size")
    }
    try:
        result = bootstrap_scores(
            scoring.reference,
            scoring.clients,
            scoring.models,
            summary=flat_summary,
            n_resamples=args.intervals,
            confidence_level=args.confidence_level,
            device=args.device,
            **options,
        )
    except ValueError as err:
        raise InputError(_blame(str(err), scoring)) from None
    keys = ["model", "metric", "aggregation", "client"]
    bounds = score_intervals(result)[[*keys, "low", "high"]]
    scoring.meta["intervals"] = {
        "method": "percentile bootstrap: reference rows within clients, generated rows "
        "per model (distrank.metrics.bootstrap)",
        "n_resamples": args.intervals,
        "confidence_level": args.confidence_level,
    }
    return table.merge(bounds, on=keys, how="left", validate="one_to_one")


def score_inputs(args, features: Features) -> Scoring:
    """Read or extract the reference (with clients) and every model's features."""
    if args.reference is not None:
        ref = features.of(args.reference, subfolders=True, need_clients=True)
        reference, clients = ref.features, ref.clients
        if args.reference.is_dir():
            client_paths = {str(c): args.reference / str(c) for c in np.unique(clients)}
        else:
            client_paths = {str(c): args.reference for c in np.unique(clients)}
        parts = [ref]
    else:
        names = [name for name, _ in args.clients]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise InputError(f"--client: client name {duplicate!r} given twice")
        parts = [features.of(path, client=name) for name, path in args.clients]
        reference = np.concatenate([p.features for p in parts])
        clients = np.concatenate([p.clients for p in parts])
        client_paths = {name: path for name, path in args.clients}
    models, model_paths = {}, {}
    for name, path in args.models:
        if name in models:
            raise InputError(f"--model: model name {name!r} given twice")
        part = features.of(path, d=reference.shape[1], d_source=args.reference or parts[0].path)
        models[name], model_paths[name] = part.features, path
        parts.append(part)
    extractors = {str(p.path): p.meta.get("extractor") for p in parts if p.meta.get("extractor")}
    if len(set(extractors.values())) > 1:
        raise InputError(
            "inputs come from different feature extractors: "
            + ", ".join(f"{path} ({name})" for path, name in extractors.items())
        )
    sizes = pd.Series(clients).astype(str).value_counts(sort=False)
    meta = {
        "format": SCORES_FORMAT,
        "extractor": next(iter(extractors.values()), None),
        "reference": {
            str(c): {"n": int(sizes[str(c)]), "path": str(p)} for c, p in client_paths.items()
        },
        "models": {
            name: {"n": int(len(models[name])), "path": str(model_paths[name])} for name in models
        },
    }
    return Scoring(reference, clients, models, client_paths, model_paths, args.reference, meta)


def compute_scores(scoring: Scoring, args) -> pd.DataFrame:
    """The tidy table of ``distrank.metrics.score``; a data problem names its file."""
    from distrank.metrics import score

    options = dict(
        metrics=args.metrics,
        kernel=args.kernel,
        kernel_params=dict(args.kernel_params) or None,
        kd_estimator=args.kd_estimator,
        n_subsets=args.n_subsets,
        subset_size=args.subset_size,
        seed=args.seed,
        weights=args.weights,
        pr_k=args.pr_k,
        dc_k=args.dc_k,
        dtype=args.dtype,
    )
    try:
        table = score(
            scoring.reference, scoring.clients, scoring.models, device=args.device, **options
        )
    except ValueError as err:
        raise InputError(_blame(str(err), scoring)) from None
    scoring.meta["options"] = options
    return table


def write_scores(table: pd.DataFrame, meta: dict, out: Path, fmt: str | None) -> None:
    """The table as csv (+ ``<out>.meta.json``), json or markdown, atomically."""
    fmt = fmt or FORMATS.get(out.suffix.lower(), "csv")
    if fmt == "csv":
        sidecar = out.with_name(out.name + ".meta.json")
        with atomic_path(out) as tmp, atomic_path(sidecar) as tmp_meta:
            table.to_csv(tmp, index=False)
            tmp_meta.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return
    if fmt == "json":
        text = (
            json.dumps({"meta": meta, "scores": table.to_dict(orient="records")}, indent=2) + "\n"
        )  # rows keep the table's column order
    else:
        text = markdown_summary(table)
    with atomic_path(out) as tmp:
        tmp.write_text(text, encoding="utf-8")


def read_scores(path: Path) -> tuple[pd.DataFrame, dict]:
    """A table written by ``distrank score`` (csv with optional sidecar, or json) and its
    metadata ({} if none); other tidy tables with the same columns are read too."""
    from distrank.experiments import SCORE_COLUMNS

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    meta = {}
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or "scores" not in data:
                raise InputError(
                    f"{path}: expected the JSON that 'distrank score --format "
                    "json' writes, with 'meta' and 'scores'"
                )
            table, meta = pd.DataFrame(data["scores"]), data.get("meta") or {}
        else:
            table = pd.read_csv(path, keep_default_na=False, dtype={"client": str})
            sidecar = path.with_name(path.name + ".meta.json")
            if sidecar.is_file():
                meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # JSON and CSV parse errors
        raise InputError(f"{path}: not a readable score table ({err})") from None
    missing = [c for c in SCORE_COLUMNS if c not in table.columns]
    if missing or table.empty:
        raise InputError(
            f"{path}: expected the columns {list(SCORE_COLUMNS)} and at least one "
            f"row; {'missing ' + str(missing) if missing else 'no rows'}"
        )
    bad = sorted(set(table["aggregation"]) - {"all", "avg", "client"})
    if bad:
        raise InputError(f"{path}: 'aggregation' must be all, avg or client; found {bad}")
    values = pd.to_numeric(table["value"], errors="coerce")
    if values.isna().any():
        line = int(np.flatnonzero(values.isna().to_numpy())[0]) + 2
        raise InputError(f"{path} line {line}: 'value' is not a number")
    table = table.assign(value=values.astype(float), client=table["client"].astype(str))
    return table[list(SCORE_COLUMNS)], meta


def summary(table: pd.DataFrame) -> str:
    """The all/avg values as a model x metric table, and Kendall tau(all, avg) per metric."""
    wide, taus = _all_avg(table)
    lines = [
        wide.to_string(float_format=lambda v: f"{v:.6g}"),
        "",
        "Kendall tau between the 'all' and 'avg' rankings of the models:",
    ]
    for metric, (n, tau) in taus.items():
        text = (
            "n/a (fewer than 2 models)"
            if n < 2
            else "n/a (ties)"
            if np.isnan(tau)
            else f"{tau:+.3f}"
        )
        lines.append(f"  {metric:<10} {text}")
    return "\n".join(lines)


def markdown_summary(table: pd.DataFrame) -> str:
    """``--format markdown``: all and avg per model, and Kendall tau per metric."""
    from distrank.metrics.registry import display
    from distrank.tables import to_markdown

    wide, taus = _all_avg(table)
    wide.columns = [f"{display(m)}_{a}" for m, a in wide.columns]
    parts = [to_markdown(wide.reset_index(), caption="all and avg per model", float_format=".6g")]
    if taus:
        rows = [
            {"metric": display(m), "n_models": n, "kendall_tau": tau}
            for m, (n, tau) in taus.items()
        ]
        parts.append(
            to_markdown(
                pd.DataFrame(rows),
                float_format="+.3f",
                caption="Kendall tau between the all and avg rankings",
            )
        )
    return "\n".join(parts)


def _all_avg(table: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, tuple[int, float]]]:
    """(model x (metric, aggregation) values, metric -> (models with both, Kendall tau))."""
    from scipy.stats import kendalltau

    pooled = table[table.aggregation.isin(["all", "avg"])]
    wide = pooled.pivot_table(
        index="model", columns=["metric", "aggregation"], values="value", sort=False
    )
    taus = {}
    for metric in dict.fromkeys(pooled.metric):
        if (metric, "avg") in wide.columns and (metric, "all") in wide.columns:
            both = wide[metric][["all", "avg"]].dropna()
            tau = kendalltau(both["all"], both["avg"]).statistic if len(both) >= 2 else np.nan
            taus[metric] = (len(both), float(tau))
    return wide, taus


# ---------------------------------------------------------------------------
# distrank report


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "scores",
        type=Path,
        metavar="SCORES",
        help="a table from 'distrank score' (csv, with its .meta.json if present, "
        "or json), or any tidy table with the same columns, e.g. client rows "
        "only",
    )
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="report.html",
        help="the page: self-contained HTML (figures embedded, no network)",
    )
    p.add_argument(
        "--extractor",
        default=None,
        help="feature network named on the figures' axes (default: from the "
        "scores' metadata, else 'unknown')",
    )
    p.add_argument("--title", default=None, help="page title (default: from SCORES' name)")
    p.set_defaults(run=run_report)


def run_report(args) -> int:
    from distrank.report.html import write_report

    table, meta = read_scores(args.scores)
    write_report(
        table,
        args.out,
        meta=meta,
        source=args.scores,
        extractor=args.extractor or meta.get("extractor"),
        title=args.title,
    )
    print(f"wrote {args.out}")
    return EXIT_OK


COMMANDS: dict[str, tuple[str, str, Callable]] = {
    "extract": (
        "features of image folders, image npz files or manifests",
        "Extract features of images (folders, npz batches, CSV manifests) through "
        "the feature cache, and write one feature npz with metadata.",
        add_extract_arguments,
    ),
    "score": (
        "score models against client-split reference data",
        "Score every model by every metric, pooled (all), averaged over clients (avg) "
        "and per client. Inputs are feature npz files or images, which are extracted "
        "through the feature cache. Writes the tidy table and prints a summary.",
        add_score_arguments,
    ),
    "report": (
        "an HTML page on how consistent a score table's rankings are",
        "Write one self-contained HTML page for a score table: all and avg per "
        "metric, which metrics are safe to average and why, the model pairs whose "
        "order flips, Kendall tau, and the E1/E6 figures.",
        add_report_arguments,
    ),
}


# ---------------------------------------------------------------------------
# Inputs to features


@dataclass
class Part:
    """The features of one input path, its clients (or None) and their metadata."""

    path: Path
    features: np.ndarray
    clients: np.ndarray | None
    meta: dict


class Features:
    """Features of input paths: feature npz files are read, images extracted through the
    cache with one extractor, built on first need. A context manager (``--no-cache``
    extracts into a temporary folder removed on exit)."""

    def __init__(self, args):
        self.args = args
        self._extractor = None
        self._tmp = None

    def __enter__(self) -> Features:
        return self

    def __exit__(self, *exc) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    @property
    def extractor(self):
        if self._extractor is None:
            from distrank.features import get_extractor
            from distrank.features.base import backends, resolve_device

            a = self.args
            backend = a.backend
            if backend == "auto":
                on_cpu = resolve_device(a.device).type == "cpu"
                backend = "onnx" if on_cpu and "onnx" in backends(a.extractor) else "torch"
            device = None if backend == "onnx" else a.device
            self._extractor = get_extractor(
                a.extractor, backend=backend, device=device, cache_dir=a.weights_dir
            )
        return self._extractor

    def of(
        self,
        path: Path,
        *,
        client: str | None = None,
        subfolders: bool = False,
        need_clients: bool = False,
        d: int | None = None,
        d_source=None,
    ) -> Part:
        """Features of ``path``; ``client`` names every row's client, ``subfolders``
        takes clients from a folder's subfolders, ``need_clients`` requires clients."""
        from distrank.data.folders import input_kind, open_images

        kind = input_kind(path)
        if kind == "features":
            part = self._feature_file(path, need_clients and client is None, d, d_source)
        else:
            if kind == "images" and need_clients and client is None:
                raise InputError(
                    f"{path}: an image npz has no clients; give each client as "
                    "--client NAME=PATH, or a folder with one subfolder per "
                    "client, or a manifest with a 'client' column"
                )
            image_input, clients = open_images(
                path, clients_from_subfolders=subfolders and kind == "folder" and client is None
            )
            if need_clients and client is None and clients is None:
                raise InputError(f"{path}: the manifest has no 'client' column")
            features, meta = self._extract(image_input)
            if d is not None and features.shape[1] != d:
                raise InputError(
                    f"{path}: {self.extractor.name} features have dimension "
                    f"{features.shape[1]}, but the reference {d_source} has {d}"
                )
            part = Part(path, features, clients, meta)
        if client is not None:
            part.clients = np.full(len(part.features), client)
        return part

    def _extract(self, image_input) -> tuple[np.ndarray, dict]:
        from distrank.features.cache import cached_input_features

        cache_dir = self.args.cache_dir
        if self.args.no_cache:
            self._tmp = self._tmp or tempfile.TemporaryDirectory(prefix="distrank-features-")
            cache_dir = self._tmp.name
        return cached_input_features(
            image_input,
            self.extractor,
            cache_dir=cache_dir,
            batch_size=self.args.batch_size,
            workers=self.args.workers,
        )

    @staticmethod
    def _feature_file(path: Path, need_clients: bool, d, d_source) -> Part:
        from distrank.features.cache import meta_path

        features = _load_features(path, "features", d=d, d_source=d_source)
        clients = None
        if need_clients:
            clients = _load_array(path, "clients")
            if clients.ndim != 1 or len(clients) != len(features):
                raise InputError(
                    f"{path}: 'clients' has shape {clients.shape}; expected "
                    f"({len(features)},), one label per row of 'features'"
                )
            if clients.dtype.kind not in "iuU":
                raise InputError(
                    f"{path}: 'clients' must hold int or str labels, got {clients.dtype}"
                )
        sidecar = meta_path(path)
        meta = {}
        if sidecar.is_file():
            try:
                meta = json.loads(sidecar.read_text(encoding="utf-8"))
            except ValueError as err:
                raise InputError(f"{sidecar}: not valid JSON ({err})") from None
        return Part(path, features, clients, meta)


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
        raise InputError(
            f"{path}: {key!r} has dimension {x.shape[1]}, but the reference {d_source} has {d}"
        )
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


def _blame(message: str, scoring: Scoring) -> str:
    """Prefix a metrics error with the file it is about."""
    if message.startswith(("reference", "clients")):
        match = re.search(r"client '([^']*)'", message)
        if match and match[1] in scoring.client_paths:
            return f"{scoring.client_paths[match[1]]}: {message}"
        if scoring.reference_path is not None:
            return f"{scoring.reference_path}: {message}"
    for name, path in scoring.model_paths.items():
        if message.startswith(f"models[{name!r}]"):
            return f"{path}: {message}"
    return message


# ---------------------------------------------------------------------------
# Argument types


def _named_path(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()
