"""``distrank score``: score models against client-split reference data.

Inputs -> features (:func:`distrank.features.inputs.scoring_inputs`) -> scores
(``metrics.score``, or ``metrics.kd._privacy.private_scores`` with ``--private``; with
``--intervals``, ``metrics._bootstrap.with_intervals``) -> the table's file
(``metrics._table.write``, or ``report.summary.write_markdown``) and a summary. The scoring
options' flags are made from their declarations (``metrics._options.specs``: a metric's
own option, a plugin's included, is a flag here without a line of this module).
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from distrank._checks import InputError
from distrank.cli.common import (
    EXIT_OK,
    UsageError,
    add_extractor_arguments,
    input_features,
    kernel_param,
    library_defaults,
    named_path,
    open_unit,
    print_confidence,
)
from distrank.metrics._registry import METRICS


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Score models against client-split reference data.

    Score every model by every metric, pooled (all), averaged over clients (avg) and per
    client. Inputs are feature npz files or images, which are extracted through the
    feature cache. Writes the tidy table and prints a summary.
    """
    add_input_arguments(p)
    add_metric_arguments(p)
    add_private_and_interval_arguments(p)
    add_output_arguments(p)
    add_extractor_arguments(p)
    p.set_defaults(run=run)


def add_input_arguments(p: argparse.ArgumentParser) -> None:
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
        type=named_path,
        dest="clients",
        metavar="NAME=PATH",
        help="one client's reference data (feature npz, "
        "image folder, image npz, manifest); repeatable",
    )
    add_model_argument(g)


def add_model_argument(g) -> None:
    """``--model NAME=PATH``, repeatable (``score`` and ``rank``)."""
    g.add_argument(
        "--model",
        required=True,
        action="append",
        type=named_path,
        metavar="NAME=PATH",
        dest="models",
        help="a model's samples (feature npz, image folder, image npz, manifest); repeatable",
    )


def add_metric_arguments(p: argparse.ArgumentParser) -> None:
    """One argument per scoring option (``metrics._options.specs``: the shared ones and every
    registered metric's), its default, choices and help the option's."""
    from distrank.metrics._options import specs

    options = specs()
    g = p.add_argument_group("metrics (defaults: distrank.metrics.ScoreOptions')")
    g.add_argument(
        "--metric",
        nargs="+",
        choices=tuple(METRICS),  # every registered metric
        default=list(options["metrics"].default),
        dest="metrics",
        help=options["metrics"].help,
    )
    g.add_argument(
        "--kernel-param",
        action="append",
        type=kernel_param,
        default=[],
        metavar="NAME=VALUE",
        dest="kernel_params",
        help="kernel parameter, e.g. bandwidth=2.5 or degree=3; repeatable (rbf/laplace "
        "bandwidth default: median heuristic on the pooled reference)",
    )
    for option in options.values():  # --kd-estimator: its dest is the option's name
        if option.name not in ("metrics", "kernel_params"):
            g.add_argument(
                f"--{option.key}",
                default=option.default,
                help=f"{option.help} (default: %(default)s)",
                **_typed(option),
            )


def _typed(option) -> dict:
    """The argparse keywords of an option's values: its choices, else its type."""
    if option.choices:
        return {"choices": option.choices}
    if option.type is bool:
        return {"action": argparse.BooleanOptionalAction}
    return {"type": option.type, "metavar": {int: "N", float: "X"}.get(option.type, "VALUE")}


def add_private_and_interval_arguments(p: argparse.ArgumentParser) -> None:
    from distrank.metrics._bootstrap import bootstrap_scores

    d = library_defaults(bootstrap_scores)
    g = p.add_argument_group(
        "private scores (distrank.metrics.kd.private_scores) and intervals "
        "(distrank.metrics.bootstrap_scores)"
    )
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
        "--level",
        type=open_unit,
        metavar="LEVEL",
        help="with --private: a pair of models is resolved when the noise leaves its order "
        "at least this sure; per adjacent pair, the gap, its noise std, that probability "
        "and whether it is resolved go beside --out in NAME.confidence.csv (default: 0.95)",
    )
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


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    from distrank.metrics._table import FORMATS

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


def score_options(args):
    """The ``ScoreOptions`` of the metric arguments."""
    from distrank.metrics._options import ScoreOptions

    return ScoreOptions(
        **{name: getattr(args, name) for name in ScoreOptions.names() if name != "kernel_params"},
        kernel_params=dict(args.kernel_params) or None,
    )


def run(args) -> int:
    from distrank.features.inputs import scoring_inputs
    from distrank.metrics._table import FORMAT, FORMATS, write
    from distrank.report.summary import summary, write_markdown

    if args.private is not None and args.intervals is not None:
        raise InputError("--private and --intervals: intervals of private scores are not offered")
    if args.level is not None and args.private is None:
        raise UsageError("--level: the confidence of a ranking is given for --private only")
    with input_features(args) as features:
        inputs = scoring_inputs(
            features, reference=args.reference, clients=args.clients or (), models=args.models
        )
    meta = {"format": FORMAT, **inputs.meta}
    options = score_options(args)
    try:
        if args.private is not None:
            table = private(inputs, options, meta, args)
        else:
            table = scored(inputs, options, meta, args)
        if args.intervals is not None:
            table = intervals(table, inputs, options, meta, args)
    except InputError as err:
        raise inputs.blame(err) from None
    fmt = args.format or FORMATS.get(args.out.suffix.lower(), "csv")
    if fmt == "markdown":
        write_markdown(table, args.out)
    else:
        write(table, args.out, meta, fmt)
    print(summary(table))
    if "confidence" in meta:
        from distrank.metrics.sketch._confidence import confidence_path, write_confidence

        write_confidence(meta, args.out)
        print_confidence(meta["confidence"])
        print(f"\nwrote {len(table)} rows to {args.out} (pairs: {confidence_path(args.out)})")
    else:
        print(f"\nwrote {len(table)} rows to {args.out}")
    return EXIT_OK


def _on_inputs(fn, inputs, options, args, **kwargs):
    """``fn(reference, clients, models, options, device=args.device, **kwargs)`` of the
    scoring ``inputs``: the signature of the library's scoring calls."""
    return fn(
        inputs.reference, inputs.clients, inputs.models, options, device=args.device, **kwargs
    )


def scored(inputs, options, meta: dict, args):
    """``distrank.metrics.score``; the options go into ``meta``."""
    from distrank.metrics import score

    table = _on_inputs(score, inputs, options, args)
    meta["options"] = options.as_dict()
    used = table.attrs.get("kernel_params", {})
    if "bandwidth" in used and "bandwidth" not in (options.kernel_params or {}):
        meta["bandwidth"] = {  # reusable, e.g. in a sketch map: `distrank map --bandwidth`
            "value": used["bandwidth"],
            "from": f"median heuristic on the pooled reference (seed {options.seed})",
        }
    return table


def private(inputs, options, meta: dict, args):
    """``--private``: ``distrank.metrics.kd._privacy.private_scores``, its budget and noise in
    ``meta``, and the confidence of its ranking
    (``distrank.metrics.sketch._confidence.private_confidence``)."""
    from distrank._checks import EPSILON_RANGE
    from distrank.metrics.kd._privacy import private_scores
    from distrank.metrics.sketch._confidence import LEVEL, private_confidence

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
    table, budget = _on_inputs(
        private_scores, inputs, options, args, epsilon=args.private, delta=args.delta
    )
    meta["options"] = options.as_dict()
    meta["privacy"] = {
        "mechanism": "Gaussian, per client and model (distrank.metrics.kd.private_scores)",
        "epsilon": budget.epsilon,
        "delta": budget.delta,
        "n_releases": budget.n_releases,
        "noise_multiplier": budget.noise_multiplier,
        "epsilon_spent": budget.epsilon_spent,
        "client_noise_std": table.attrs["client_noise_std"],
        "avg_noise_std": table.attrs["avg_noise_std"],
    }
    conf = private_confidence(table, table.attrs["avg_noise_std"], args.level or LEVEL)
    meta["confidence"] = conf | {"pairs": conf["pairs"].to_dict(orient="records")}
    print(
        f"privacy: each client spent epsilon {budget.epsilon_spent:.6g} at delta "
        f"{budget.delta:g} on {budget.n_releases} releases (noise multiplier "
        f"{budget.noise_multiplier:.4g})\n"
    )
    return table


def intervals(table, inputs, options, meta: dict, args):
    """``--intervals N``: columns low and high (``distrank.metrics._bootstrap``)."""
    from distrank.metrics._bootstrap import with_intervals

    table = _on_inputs(
        partial(with_intervals, table),
        inputs,
        options,
        args,
        n_resamples=args.intervals,
        confidence_level=args.confidence_level,
    )
    meta["intervals"] = {
        "method": "percentile bootstrap: reference rows within clients, generated rows "
        "per model (distrank.metrics.bootstrap_scores)",
        "n_resamples": args.intervals,
        "confidence_level": args.confidence_level,
    }
    return table
