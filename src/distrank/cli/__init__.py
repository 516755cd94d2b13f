"""The ``distrank`` command line: images or features in, scores and a report out.

    distrank extract INPUT... --out FEATURES.npz
    distrank score --reference REF --model NAME=PATH [--model ...] --out scores.csv
    distrank report scores.csv --out report.html
    distrank map --model NAME=PATH [--model ...] --dim D --seed S --out map.json
    distrank plan --map map.json --model NAME=PATH ... --sizes N ... --epsilon E --delta D
    distrank sketch --reference SITE --map map.json --out SITE.sketch.npz [--epsilon E --delta D]
    distrank rank --sketch SITE.sketch.npz... --model NAME=PATH [--model ...] --out scores.csv

Inputs are image folders (recursive; png, jpg, jpeg, webp, in sorted path order),
image npz batches (``arr_0`` or ``images``, uint8 NHWC), CSV manifests (columns
``path`` and optionally ``client``) or, for ``score``, feature npz files
(``features`` (n x d), a reference also ``clients``). See :mod:`distrank.data.folders`
and :mod:`distrank.features.inputs`, which turns them into features through the
feature cache, so a second run on the same images reads the features back.

Each command is a module here (:mod:`.extract`, :mod:`.score`, :mod:`.report`) that
adds its arguments, calls the library and prints; :mod:`.common` holds what they
share. Every default of an option is the library's (``ScoreOptions``, the metric
and extractor registries, the cache's), read when the command's parser is built,
which imports torch only for the command that needs it.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable

from distrank._checks import InputError
from distrank._progress import set_quiet
from distrank.cli import extract, report, score, sketch
from distrank.cli.common import (
    EXIT_CODES,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WEIGHTS,
    UsageError,
    cpu_threads,
    missing_weights,
    positive,
)

__all__ = [
    "EXIT_CODES",
    "EXIT_INPUT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_WEIGHTS",
    "COMMANDS",
    "InputError",
    "build_parser",
    "main",
]

#: command -> the function that adds its arguments; its docstring's first line is the
#: command's help line, the rest its description.
COMMANDS: dict[str, Callable] = {
    "extract": extract.add_arguments,
    "score": score.add_arguments,
    "report": report.add_arguments,
    "map": sketch.add_map_arguments,
    "plan": sketch.add_plan_arguments,
    "sketch": sketch.add_arguments,
    "rank": sketch.add_rank_arguments,
}


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
        with cpu_threads(args.threads):
            return args.run(args)
    except UsageError as err:
        print(f"distrank {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"distrank {args.command}: error: {message}", file=sys.stderr)
        return EXIT_WEIGHTS if missing_weights(err) else EXIT_INPUT
    except KeyboardInterrupt:
        print(f"distrank {args.command}: interrupted; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if args.quiet:
            set_quiet(previous)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``distrank`` parser; ``command`` (None: none) gets its full arguments (and
    their defaults, which may import torch)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bars (also: DISTRANK_QUIET=1)"
    )
    common.add_argument(
        "--threads",
        type=positive,
        metavar="N",
        help="CPU threads of torch and the BLAS libraries (default: every core, or "
        "OMP_NUM_THREADS); on a shared machine or in a cluster job, the cores you hold",
    )
    parser = argparse.ArgumentParser(
        prog="distrank",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Consistent distributed ranking of generative models via kernel distances.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add_arguments in COMMANDS.items():
        help_line, _, description = (inspect.getdoc(add_arguments) or "").partition("\n\n")
        p = sub.add_parser(
            name,
            help=help_line.rstrip("."),
            description=description,
            epilog=EXIT_CODES,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name == command:
            add_arguments(p)
    return parser
