"""``txcoord conformance``: the conformance kit, run against a client under test (:mod:`coordinator.conformance`)."""

from __future__ import annotations

import argparse
import functools
import sys

from coordinator.cli.options import at_least
from coordinator.config import EXIT_USAGE

__all__ = ["register", "run_conformance"]


def register(commands) -> None:
    """``conformance``, on ``commands`` (the ``txcoord`` parser's sub-parsers)."""
    run = commands.add_parser("conformance", help="run a real checker against a client under test, its cases side by side "
                                                  "(docs/protocol.md#the-conformance-kit)")
    run.add_argument("--producer", metavar="COMMAND",
                     help="the client under test, run with `sh -c` once per producer instance; it speaks the line "
                          "protocol on its stdin and stdout")
    run.add_argument("--case", action="append", default=[], metavar="NAME",
                     help="run this case only (repeatable; default: every case); --list names them")
    run.add_argument("--case-timeout", type=functools.partial(at_least, 1), default=60, metavar="SECONDS",
                     help="the longest a case may take, the checker's start aside (default: %(default)s)")
    run.add_argument("--parallel", type=functools.partial(at_least, 1), default=None, metavar="N",
                     help="run at most N cases at once, each with its own client processes and producer group "
                          "(default: every case of the kit at once; 1 runs them one after another)")
    run.add_argument("--workdir", metavar="DIR",
                     help="keep the lakehouse, the TOML and the logs here, wiped first (default: a new temporary "
                          "directory)")
    run.add_argument("--object-store", action="store_true",
                     help="the lakehouse on txcoord's S3 server with an account per group, which adds the grant "
                          "case (it needs the server built once, `python -m coordinator.conformance.versitygw "
                          "build`, with Go, and txcoord's conformance extra)")
    run.add_argument("--list", action="store_true", help="print the case names and exit")
    run.set_defaults(run=run_conformance)


def run_conformance(args: argparse.Namespace) -> int:
    """Run the kit (see :mod:`coordinator.conformance.kit`); 0 only if every case passed."""
    from coordinator.conformance.cases import CASES, OBJECT_STORE_CASES
    from coordinator.conformance.kit import DEFAULT_PARALLEL, KitOptions, run_kit
    from coordinator.exceptions import ConformanceKitError

    if args.list:
        print("\n".join([*CASES, *(f"{name} (--object-store)" for name in OBJECT_STORE_CASES)]))
        return 0
    if not args.producer:
        print("txcoord conformance: --producer COMMAND is required", file=sys.stderr)
        return EXIT_USAGE
    options = KitOptions(command=args.producer, cases=tuple(args.case), case_timeout_s=float(args.case_timeout),
                         workdir=args.workdir, object_store=args.object_store,
                         parallel=DEFAULT_PARALLEL if args.parallel is None else args.parallel)
    try:
        return run_kit(options, out=functools.partial(print, flush=True))
    except ConformanceKitError as error:
        print(f"txcoord conformance: {error}", file=sys.stderr)
        return EXIT_USAGE
