"""``distrank sketch`` at each site, ``distrank rank`` at the server: one private sketch
per site ranks every model (:mod:`distrank.metrics.sketch.maps`).

    distrank sketch --reference site_images/ --out site.sketch.npz --dim 4096 --seed S \\
        --bandwidth B [--epsilon E --delta D]
    distrank rank --sketch a.sketch.npz b.sketch.npz ... --model A=samples/A ... --out scores.csv

A site sends its sketch file (D numbers and metadata) once; the server scores any model
from the sketches, now or later, without sending models to the sites. The table holds
``kd_sketch`` (KD of the sketched rbf kernel) per site (``client``), averaged (``avg``) and from the pooled
sketch (``all``), as ``distrank score`` writes it; ``distrank report`` reads it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from distrank._checks import InputError
from distrank.cli.common import EXIT_OK, add_extractor_arguments, input_features
from distrank.cli.score import add_model_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    """A site's private kernel mean sketch of its reference data.

    Write the mean random-Fourier-feature sketch of one site's reference data (images or
    features), optionally released through the Gaussian mechanism: one release for every
    model the server will ever score from it.
    """
    p.add_argument(
        "--reference",
        required=True,
        type=Path,
        metavar="REF",
        help="this site's reference data: image folder, image npz, manifest or feature npz",
    )
    p.add_argument("--out", required=True, type=Path, metavar="SITE.sketch.npz")
    p.add_argument(
        "--dim",
        required=True,
        type=int,
        metavar="D",
        help="sketch dimension (even; every site uses the same)",
    )
    p.add_argument(
        "--seed",
        required=True,
        type=int,
        metavar="S",
        help="the public seed of the feature map (every site uses the same)",
    )
    p.add_argument(
        "--bandwidth",
        required=True,
        type=float,
        metavar="B",
        help="the rbf bandwidth, public (from the server's side, never this site's rows)",
    )
    p.add_argument("--epsilon", type=float, help="release through the Gaussian mechanism")
    p.add_argument("--delta", type=float, help="delta of that release")
    add_extractor_arguments(p)
    p.set_defaults(run=run)


def run(args) -> int:
    import numpy as np

    from distrank.metrics.privacy import release_sketch
    from distrank.metrics.sketch import maps as sketch

    if (args.epsilon is None) != (args.delta is None):
        raise InputError("--epsilon and --delta go together")
    with input_features(args) as features:
        part = features.of(args.reference)
    fmap = sketch.FeatureMap(part.features.shape[1], args.dim, args.bandwidth, args.seed)
    result = sketch.Sketch(*_sketched(fmap, part))
    if args.epsilon is not None:
        result = release_sketch(
            result, epsilon=args.epsilon, delta=args.delta, rng=np.random.default_rng()
        )
    sketch.save(args.out, result)
    noise = f", noise std {result.noise_std:.3g} (epsilon {args.epsilon:g})" if args.epsilon else ""
    print(f"wrote the sketch of {result.n} rows (D = {args.dim}{noise}) to {args.out}")
    return EXIT_OK


def _sketched(fmap, part) -> tuple:
    """(mean, n, meta) of a Part's rows: the map's fields and the extractor's."""
    made = fmap.sketch(part.features)
    extractor = {"extractor": part.meta.get("extractor"), "weights": part.meta.get("weights")}
    return made.mean, made.n, made.meta | extractor


def add_rank_arguments(p: argparse.ArgumentParser) -> None:
    """Rank models from the sites' sketches.

    Score every model by KD (the sketched rbf kernel) against each site's sketch, their
    average and the pooled sketch; writes the tidy table of distrank score.
    """
    p.add_argument(
        "--sketch",
        required=True,
        nargs="+",
        type=Path,
        metavar="SITE.sketch.npz",
        help="every site's sketch file (its name, less .sketch.npz, names the site)",
    )
    add_model_argument(p)
    p.add_argument("--out", required=True, type=Path, metavar="scores.csv")
    add_extractor_arguments(p)
    p.set_defaults(run=run_rank)


def run_rank(args) -> int:
    from distrank.metrics import table as score_table
    from distrank.metrics.scoring import score_sketches
    from distrank.metrics.sketch import maps as sketch
    from distrank.report.summary import summary

    sites = {_site_name(path): sketch.load(path) for path in args.sketch}
    if len(sites) != len(args.sketch):
        raise InputError("--sketch: two sketch files name the same site")
    try:
        sketch.check_compatible([s.meta for s in sites.values()])
    except ValueError as err:
        raise InputError(f"--sketch: {err}") from None
    first, models = next(iter(sites.values())).meta, {}
    with input_features(args) as features:
        for name, path in args.models:
            part = features.of(path, d=first["input_dim"], d_source=args.sketch[0])
            for key in ("extractor", "weights"):
                theirs = part.meta.get(key)
                if theirs is not None and first.get(key) not in (None, theirs):
                    raise InputError(f"--model {name}: field {key!r} differs from the sketches'")
            models[name] = part.features
    table = score_sketches(sites, models)
    meta = {"format": score_table.FORMAT, "options": _options(first), "sketch": _about(sites)}
    score_table.write(table, args.out, meta, "csv")
    print(summary(table))
    print(f"\nwrote {len(table)} rows to {args.out}")
    return EXIT_OK


def _site_name(path: Path) -> str:
    name = path.name
    return name[: -len(".sketch.npz")] if name.endswith(".sketch.npz") else path.stem


def _options(meta) -> dict:
    from distrank.metrics.options import ScoreOptions

    return ScoreOptions(
        metrics=("kd_sketch",),
        kernel="rbf",
        kernel_params={"bandwidth": meta["bandwidth"]},
        dtype="float64",
    ).as_dict()


def _about(sites) -> dict:
    first = next(iter(sites.values())).meta
    return {
        "map": {k: first.get(k) for k in ("kernel", "dim", "seed", "bandwidth", "input_dim")},
        "sites": {
            name: {k: s.meta.get(k) for k in ("epsilon", "delta", "noise_std")} | {"n": s.n}
            for name, s in sites.items()
        },
        "note": "KD of the sketched rbf kernel (U-statistic); a noisy sketch shifts every "
        "model's value by the same amount",
    }
