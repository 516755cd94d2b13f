"""``distrank report``: an HTML page on how consistent a score table's rankings are."""

from __future__ import annotations

import argparse
from pathlib import Path

from distrank.cli.common import EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    """An HTML page on how consistent a score table's rankings are.

    Write one self-contained HTML page for a score table: all and avg per metric, which
    metrics are safe to average and why, the model pairs whose order flips, Kendall tau,
    and the E1/E6 figures.
    """
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
    p.set_defaults(run=run)


def run(args) -> int:
    from distrank.metrics._table import read
    from distrank.report.html import write_report

    table, meta = read(args.scores)
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
