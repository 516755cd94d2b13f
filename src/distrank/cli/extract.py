"""``distrank extract``: features of image folders, image npz files or manifests."""

from __future__ import annotations

import argparse
from pathlib import Path

from distrank.cli.common import EXIT_OK, add_extractor_arguments, input_features, named_path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Features of image folders, image npz files or manifests.

    Extract features of images (folders, npz batches, CSV manifests) through the feature
    cache, and write one feature npz with metadata.
    """
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
        type=named_path,
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
    p.set_defaults(run=run)


def run(args) -> int:
    from distrank.features.cache import write_features
    from distrank.features.inputs import extract_inputs

    sources = [(path, None) for path in args.inputs] + [(path, name) for name, path in args.clients]
    with input_features(args) as features:
        arrays, meta = extract_inputs(features, sources, subfolders=args.client_subfolders)
    write_features(args.out, arrays, meta)
    clients = f", {len(set(arrays['clients']))} clients" if "clients" in arrays else ""
    print(
        f"wrote {arrays['features'].shape[0]} x {arrays['features'].shape[1]} "
        f"{meta['extractor']} features{clients} to {args.out}"
    )
    return EXIT_OK
