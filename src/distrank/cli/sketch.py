"""Private sketches across sites: ``map`` and ``plan`` at the coordinator, ``sketch`` at
each site, ``rank`` at the coordinator (:mod:`distrank.metrics.sketch`).

    distrank map --model A=samples/A ... --dim 4096 --seed 1 --out map.json
    distrank plan --map map.json --model A=samples/A ... --sizes 200 200 5 --epsilon 1 \\
        --delta 1e-5 [--target-gap G]
    distrank sketch --reference site_images/ --map map.json --out site.sketch.npz \\
        [--epsilon E --delta D]
    distrank rank --sketch a.sketch.npz b.sketch.npz ... --model A=samples/A ... --out scores.csv

The coordinator makes the public map from public inputs (the models' samples: their
median heuristic, recorded) and sends it to the sites; each site sends its sketch file
(D numbers and metadata) once; the coordinator scores any model from the sketches, now
or later, without sending models to the sites, and writes per adjacent pair the gap, its
noise std and how surely the noise leaves its order (:mod:`distrank.metrics.sketch`).
The table holds ``kd_sketch`` (KD of the sketched rbf kernel, unbiased) per site
(``client``), averaged (``avg``) and from the pooled sketch (``all``), as ``distrank
score`` writes it; ``distrank report`` reads it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from distrank._checks import InputError
from distrank.cli.common import (
    EXIT_OK,
    UsageError,
    add_extractor_arguments,
    epsilon_value,
    even_positive,
    input_features,
    open_unit,
    positive,
    positive_float,
    print_confidence,
)
from distrank.cli.score import add_model_argument, add_output_arguments

#: what a map file holds (``distrank map``): the public feature map of every sketch
MAP_KIND = "distrank sketch map"
MAP_FIELDS = ("kernel", "input_dim", "dim", "seed", "bandwidth", "extractor", "weights")


# -- map -------------------------------------------------------------------------------


def add_map_arguments(p: argparse.ArgumentParser) -> None:
    """The public feature map, from the models' samples.

    Write the map every site sketches with (kernel rbf, bandwidth, dimension D, seed,
    extractor and its weights' sha256): the bandwidth is --bandwidth, else the median
    heuristic over the models' samples (public; recorded in the file).
    """
    add_model_argument(p)
    add_map_numbers(p, required=True)
    p.add_argument("--out", required=True, type=Path, metavar="map.json")
    add_extractor_arguments(p)
    p.set_defaults(run=run_map)


def add_map_numbers(p, *, required: bool) -> None:
    p.add_argument(
        "--dim",
        type=even_positive,
        required=required,
        metavar="D",
        help="sketch dimension (even; every site uses the same)",
    )
    p.add_argument(
        "--seed", type=int, required=required, metavar="S", help="the public seed of the map"
    )
    p.add_argument(
        "--bandwidth",
        type=positive_float,
        metavar="B",
        help="the rbf bandwidth, public (never a site's rows)"
        + ("" if required else "; with --dim and --seed instead of --map"),
    )


def run_map(args) -> int:
    models = _model_features(args, args.extractor)

    import numpy as np

    from distrank._io import atomic_write_bytes
    from distrank.metrics._kernels import median_bandwidth

    dims = {y.shape[1] for y, _ in models.values()}
    if len(dims) != 1:
        raise InputError(f"--model: feature dimensions differ: {sorted(dims)}")
    bandwidth, source = args.bandwidth, "--bandwidth"
    if bandwidth is None:
        pooled = np.concatenate([y for y, _ in models.values()])
        bandwidth = float(median_bandwidth(pooled, kernel="rbf", seed=args.seed))
        source = f"median heuristic over the models {sorted(models)} (seed {args.seed})"
    meta = next(iter(models.values()))[1]
    made = {
        "kind": MAP_KIND,
        "version": 1,
        "kernel": "rbf",
        "input_dim": dims.pop(),
        "dim": args.dim,
        "seed": args.seed,
        "bandwidth": bandwidth,
        "bandwidth_from": source,
        "extractor": meta.get("extractor"),
        "weights": meta.get("weights"),
    }
    atomic_write_bytes(args.out, (json.dumps(made, indent=2) + "\n").encode())
    print(
        f"wrote the map (D = {args.dim}, seed {args.seed}, bandwidth {bandwidth:.6g}: {source}) to {args.out}"
    )
    return EXIT_OK


def read_map(path: Path, extractor: str | None = None) -> dict:
    """The map in ``path`` (written by ``distrank map``), with its sha256; InputError
    naming the file and the field; UsageError when ``extractor`` (--extractor) is not the
    map's."""
    try:
        data = path.read_bytes()
        made = json.loads(data)
    except (OSError, ValueError) as err:
        raise InputError(f"not a readable map file ({err})", path=path) from None
    if not isinstance(made, dict) or made.get("kind") != MAP_KIND:
        raise InputError(f"not a map of 'distrank map' (kind {MAP_KIND!r})", path=path)
    missing = [k for k in MAP_FIELDS if k not in made]
    if missing:
        raise InputError(f"the map lacks {missing}", path=path)
    if extractor not in (None, made["extractor"]) and made["extractor"] is not None:
        raise UsageError(
            f"--extractor {extractor}: the map {path} was made with {made['extractor']!r}; "
            "drop --extractor (the map's is used)"
        )
    return made | {"map_sha256": hashlib.sha256(data).hexdigest()}


# -- sketch ----------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """A site's private kernel mean sketch of its reference data.

    Write the mean random-Fourier-feature sketch of one site's reference data (images or
    features) under the coordinator's public map (--map, or --dim, --seed and
    --bandwidth), optionally released through the Gaussian mechanism: one release for
    every model the coordinator will ever score from it.
    """
    p.add_argument(
        "--reference",
        required=True,
        type=Path,
        metavar="REF",
        help="this site's reference data: image folder, image npz, manifest or feature npz",
    )
    p.add_argument("--out", required=True, type=Path, metavar="SITE.sketch.npz")
    p.add_argument("--map", type=Path, metavar="map.json", help="the coordinator's map file")
    add_map_numbers(p, required=False)
    p.add_argument("--epsilon", type=epsilon_value, help="release through the Gaussian mechanism")
    p.add_argument("--delta", type=open_unit, help="delta of that release")
    add_extractor_arguments(p)
    p.set_defaults(run=run, extractor=None)


def _the_map(args) -> dict:
    """The map of ``sketch``'s arguments: its file, or --dim/--seed/--bandwidth; the
    extractor from the map unless --extractor names the same one. UsageError otherwise."""
    numbers = {"dim": args.dim, "seed": args.seed, "bandwidth": args.bandwidth}
    if args.map is not None:
        if given := [f"--{k}" for k, v in numbers.items() if v is not None]:
            raise UsageError(f"--map fixes the map: drop {', '.join(given)}")
        return read_map(args.map, args.extractor)
    if missing := [f"--{k}" for k, v in numbers.items() if v is None]:
        raise UsageError(
            f"give --map, or --dim, --seed and --bandwidth (missing {', '.join(missing)})"
        )
    return numbers | {"extractor": args.extractor, "map_sha256": None}


def run(args) -> int:
    if (args.epsilon is None) != (args.delta is None):
        raise UsageError("--epsilon and --delta go together")
    made = _the_map(args)
    if not args.reference.exists():
        raise InputError("no such file or folder", path=args.reference)

    import numpy as np

    from distrank.metrics.sketch._maps import FeatureMap, Sketch, release_sketch, save

    extractor = made["extractor"] or args.extractor or _default_extractor()
    with input_features(_with(args, extractor=extractor)) as features:
        part = features.of(args.reference)
    if "input_dim" in made and part.features.shape[1] != made["input_dim"]:
        raise InputError(
            f"features of dimension {part.features.shape[1]}; the map's is {made['input_dim']}",
            path=args.reference,
        )
    fmap = FeatureMap(part.features.shape[1], made["dim"], made["bandwidth"], made["seed"])
    result = Sketch(*_sketched(fmap, part, made.get("map_sha256")))
    if args.epsilon is not None:
        result = release_sketch(
            result, epsilon=args.epsilon, delta=args.delta, rng=np.random.default_rng()
        )
    save(args.out, result)
    noise = f", noise std {result.noise_std:.3g} (epsilon {args.epsilon:g})" if args.epsilon else ""
    print(f"wrote the sketch of {result.n} rows (D = {made['dim']}{noise}) to {args.out}")
    return EXIT_OK


def _sketched(fmap, part, map_sha256) -> tuple:
    """(mean, n, meta) of a Part's rows: the map's fields and the extractor's."""
    made = fmap.sketch(part.features)
    extractor = {"extractor": part.meta.get("extractor"), "weights": part.meta.get("weights")}
    return (
        made.mean,
        made.n,
        made.meta | extractor | ({"map_sha256": map_sha256} if map_sha256 else {}),
    )


def _default_extractor() -> str:
    from distrank.cli.common import library_defaults
    from distrank.features.base import get_extractor

    return library_defaults(get_extractor)["name"]


def _with(args, **changes) -> argparse.Namespace:
    return argparse.Namespace(**(vars(args) | changes))


def _model_features(args, extractor) -> dict:
    """name -> (features, meta) of every --model, through the extractor named."""
    for name, path in args.models:
        if not path.exists():
            raise InputError(f"--model {name}: no such file or folder", path=path)
    out = {}
    with input_features(_with(args, extractor=extractor or _default_extractor())) as features:
        for name, path in args.models:
            part = features.of(path)
            out[name] = (part.features, part.meta)
    return out


# -- rank ------------------------------------------------------------------------------


def add_rank_arguments(p: argparse.ArgumentParser) -> None:
    """Rank models from the sites' sketches, with the confidence their noise leaves.

    Score every model by KD (the sketched rbf kernel, unbiased) against each site's
    sketch, their average and the pooled sketch; writes the tidy table of distrank score,
    and beside it, per adjacent pair, the gap, its noise std, the probability that the
    noiseless sketches order it alike and whether it is resolved at --level.
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
    p.add_argument(
        "--level",
        type=open_unit,
        default=0.95,
        help="a pair is resolved when the noise leaves its order at least this sure "
        "(default: %(default)s)",
    )
    add_output_arguments(p)
    add_extractor_arguments(p)
    p.set_defaults(run=run_rank, extractor=None)


def load_sketches(paths: list[Path]) -> dict:
    """site -> Sketch of the files, checked (names, maps and extractors agree)."""
    from distrank.metrics.sketch._maps import check_compatible, load

    sites, files = {}, {}
    for path in paths:
        name = _site_name(path)
        if name in files:
            raise UsageError(f"--sketch: {files[name]} and {path} both name the site {name!r}")
        files[name] = path
        try:
            sites[name] = load(path)
        except ValueError as err:
            raise InputError(str(err)) from None
    try:
        check_compatible([s.meta for s in sites.values()])
    except ValueError as err:
        raise InputError(f"--sketch: {err}") from None
    return sites


def run_rank(args) -> int:
    sites = load_sketches(args.sketch)  # every check before torch is imported
    first = next(iter(sites.values())).meta
    theirs = first.get("extractor")
    if args.extractor is not None and theirs is not None and args.extractor != theirs:
        raise UsageError(
            f"--extractor {args.extractor}: the sketches were made with {theirs!r} "
            "(drop --extractor: rank uses the sketches' extractor)"
        )
    fmt = _format(args)
    models = {}
    for name, (features, meta) in _model_features(args, theirs or args.extractor).items():
        if features.shape[1] != first["input_dim"]:
            raise InputError(
                f"--model {name}: features of dimension {features.shape[1]}; the sketches' "
                f"is {first['input_dim']}"
            )
        if meta.get("weights") not in (None, first.get("weights")) and first.get("weights"):
            raise InputError(f"--model {name}: field 'weights' differs from the sketches'")
        models[name] = features
    from distrank.metrics._table import FORMAT, write
    from distrank.metrics.sketch._confidence import rank_sketches, write_confidence

    table, meta = rank_sketches(sites, models, args.level)
    meta = {"format": FORMAT} | meta
    if fmt == "markdown":
        from distrank.report.summary import write_markdown

        write_markdown(table, args.out)
    else:
        write(table, args.out, meta, fmt)
    write_confidence(meta, args.out)
    _print(table, meta["confidence"], args.out)
    return EXIT_OK


def _format(args) -> str:
    from distrank.metrics._table import FORMATS

    return args.format or FORMATS.get(args.out.suffix.lower(), "csv")


def _print(table, confidence, out) -> None:
    from distrank.metrics.sketch._confidence import confidence_path
    from distrank.report.summary import summary

    print(summary(table))
    print_confidence(confidence)
    print(f"\nwrote {len(table)} rows to {out} (pairs: {confidence_path(out)})")


def _site_name(path: Path) -> str:
    name = path.name
    return name[: -len(".sketch.npz")] if name.endswith(".sketch.npz") else path.stem


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """Plan a private sketch ranking before any site spends its budget.

    From what the coordinator holds in public -- the map, the models' samples, the sites'
    row counts, epsilon and delta -- print, for every pair of models, the noise std of its
    KD gap and the smallest gap resolved at --level; with --target-gap, the epsilon and
    the rows per site that would resolve that gap.
    """
    p.add_argument("--map", required=True, type=Path, metavar="map.json")
    add_model_argument(p)
    p.add_argument(
        "--sizes", required=True, nargs="+", type=positive, metavar="N", help="each site's rows"
    )
    p.add_argument("--epsilon", required=True, type=epsilon_value)
    p.add_argument("--delta", required=True, type=open_unit)
    p.add_argument("--level", type=open_unit, default=0.95, help="(default: %(default)s)")
    p.add_argument("--target-gap", type=positive_float, metavar="G", help="a KD gap to resolve")
    p.add_argument(
        "--secure-threshold",
        type=positive,
        metavar="T",
        help="a secure sum unmasked by T sites (the sites' noise summed) instead of plain sketches",
    )
    p.add_argument("--out", type=Path, metavar="plan.csv", help="also write the table")
    add_extractor_arguments(p)
    p.set_defaults(run=run_plan, extractor=None)


def run_plan(args) -> int:
    from distrank.metrics.sketch._confidence import plan, released_std
    from distrank.metrics.sketch._maps import FeatureMap

    if args.secure_threshold is not None and args.secure_threshold > len(args.sizes):
        raise UsageError(
            f"--secure-threshold {args.secure_threshold}: only {len(args.sizes)} sites"
        )
    made = read_map(args.map, args.extractor)
    fmap = FeatureMap.of(made)
    t = {}
    for name, (features, _) in _model_features(args, made["extractor"]).items():
        if features.shape[1] != made["input_dim"]:
            raise InputError(
                f"--model {name}: dimension {features.shape[1]}, the map's {made['input_dim']}"
            )
        t[name] = fmap.sketch(features).mean
    secure = {"secure": args.secure_threshold is not None, "threshold": args.secure_threshold or 0}
    table = plan(
        t, args.sizes, epsilon=args.epsilon, delta=args.delta, level=args.level,
        target_gap=args.target_gap, **secure,
    )  # fmt: skip
    sigma = released_std(args.sizes, epsilon=args.epsilon, delta=args.delta, **secure)
    print(
        f"{len(args.sizes)} sites, {sum(args.sizes)} rows, epsilon {args.epsilon:g}, delta "
        f"{args.delta:g}: the pooled sketch's noise std per entry is {sigma:.4g} (D = {made['dim']})\n"
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out is not None:
        from distrank._io import atomic_path

        with atomic_path(args.out) as tmp:
            table.to_csv(tmp, index=False)
    return EXIT_OK
