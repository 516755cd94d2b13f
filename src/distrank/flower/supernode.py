"""A site's SuperNode that runs only the Flower apps the site pinned: ``python -m
distrank.flower.supernode [flower-supernode arguments] [--pin-fab SHA256]...`` (or
``distrank-supernode``) runs Flower's own ``flower-supernode`` here, pinned.

The threat: a stock SuperNode runs whatever ClientApp the run's FAB (Flower App Bundle)
names, and a FAB may carry its own modules: whoever starts runs on the SuperLink (the
coordinator) can read ``context.node_config["features"]`` at every site and take the raw
feature rows. Flower's ``--trusted-entities`` does not help: it needs a licence check that
a self-hosted SuperLink never passes.

The pin: a FAB runs only if the sha256 of the bytes received is pinned; any other gets
Flower's own refusal (``FAB_VERIFICATION_ERROR`` to the server, no ClientApp) and a log
line naming its hash. The default pin is the FAB that ``flwr run`` builds (deterministically)
from the installed distrank's ``APP_DIR``; ``--pin-fab`` (repeatable) replaces it, and
``--print-pin`` prints it for the site to record. ``--trusted-entities`` still applies too.
What stays trusted: the site's installed Flower and distrank (distrank's FAB holds only
its pyproject.toml: its ClientApp is the installed :mod:`distrank.flower.site`).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import re
import sys
from collections.abc import Collection
from logging import ERROR, INFO

from flwr.common import log
from flwr.supernode import start_client_internal as loop

from distrank.flower import APP_DIR

#: the names replaced in ``flwr.supernode.start_client_internal``, and their parameters
TARGETS = {"_pull_and_store_message": {"get_fab", "trusted_entities"}, "_verify_fab": {"fab"}}
#: the trusted entities a SuperNode checks with when it was given none: the pins alone
PIN_ONLY = {"distrank-pin": ""}


def default_pin() -> str:
    """The sha256 of the FAB that ``flwr run APP_DIR`` uploads (Flower's own build)."""
    from flwr.cli.build import build_fab_from_disk

    return hashlib.sha256(build_fab_from_disk(APP_DIR)).hexdigest()


def pin_fabs(pins: Collection[str]) -> None:
    """Let this process's SuperNode run only the FABs whose sha256 is in ``pins``.

    Raises
    ------
    RuntimeError
        If Flower's SuperNode loop lacks a name (or a parameter) replaced here.
    """
    missing = [
        f"{name}({', '.join(sorted(params))})"
        for name, params in TARGETS.items()
        if not callable(f := getattr(loop, name, None))
        or not params <= set(inspect.signature(f).parameters)
    ]
    if missing:
        raise RuntimeError(f"cannot pin FABs: {loop.__name__} lacks {', '.join(missing)}")
    pins = frozenset(pin.lower() for pin in pins)
    pull, verify = loop._pull_and_store_message, loop._verify_fab
    signature = inspect.signature(pull)

    def pull_pinned(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        if not call.arguments["trusted_entities"]:  # no signatures asked for: the pin decides
            get_fab = call.arguments["get_fab"]
            call.arguments["get_fab"] = lambda *a, **k: _licensed(get_fab(*a, **k))
            call.arguments["trusted_entities"] = PIN_ONLY
        return pull(*call.args, **call.kwargs)

    def verify_pinned(fab, trusted_entities) -> bool:
        digest = hashlib.sha256(fab.content).hexdigest()
        if digest not in pins:
            log(ERROR, "distrank: refused FAB %s (sha256 not pinned by this site)", digest)
            return False
        log(INFO, "distrank: FAB %s is pinned", digest)
        return trusted_entities is PIN_ONLY or verify(fab, trusted_entities)

    loop._pull_and_store_message, loop._verify_fab = pull_pinned, verify_pinned


def _licensed(fab):
    # Flower refuses a FAB without a licence before it calls _verify_fab (the pin check)
    fab.verifications["valid_license"] = "checked by its sha256 pin"
    return fab


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-supernode`` with ``argv`` (its own arguments), pinned."""
    parser = argparse.ArgumentParser(add_help=False)  # --help is flower-supernode's
    parser.add_argument("--pin-fab", action="append", type=str.lower, metavar="SHA256")
    parser.add_argument("--print-pin", action="store_true")
    ours, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if ours.print_pin:
        print(default_pin())
        return
    pins = sorted(set(ours.pin_fab or [default_pin()]))
    if bad := [pin for pin in pins if not re.fullmatch("[0-9a-f]{64}", pin)]:
        parser.error(f"--pin-fab takes a sha256 hex digest, not {', '.join(bad)}")
    from flwr.supernode.cli import flower_supernode

    pin_fabs(pins)
    log(INFO, "distrank: this SuperNode runs only the FABs with sha256 in %s", pins)
    sys.argv = [sys.argv[0], *rest]
    flower_supernode()


if __name__ == "__main__":
    main()
