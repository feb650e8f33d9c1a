"""``txcoord demo``: the order/credits story, end to end (:mod:`coordinator.demo`)."""

from __future__ import annotations

import argparse
import functools
import sys

from coordinator.cli import output
from coordinator.cli.options import at_least
from coordinator.config import EXIT_USAGE

__all__ = ["register", "run_demo"]


def register(commands) -> None:
    """``demo``, on ``commands`` (the ``txcoord`` parser's sub-parsers)."""
    from coordinator.demo import story as demo
    from coordinator.demo.services import MIN_ORDERS

    run = commands.add_parser("demo", help="run the order/credits story against a local lakehouse (or one on S3)")
    run.add_argument("--lakehouse", default=demo.DEFAULT_LAKEHOUSE,
                     help=f"demo directory, wiped and recreated (default: ./{demo.DEFAULT_LAKEHOUSE})")
    run.add_argument("--object-store", metavar="S3_URL",
                     help="keep the tables at this s3://BUCKET/PREFIX instead (it must hold no lakehouse yet; the "
                          "AWS_* environment variables reach it), the directory keeping the config, SQLite and logs")
    run.add_argument("--orders", type=_order_count, default=demo.DEFAULT_ORDERS,
                     help=f"orders to send, at least {MIN_ORDERS} (default: {demo.DEFAULT_ORDERS})")
    run.add_argument("--threads", type=_thread_count, default=demo.DEFAULT_THREADS,
                     help=f"sending threads (default: {demo.DEFAULT_THREADS})")
    run.add_argument("--seed", type=int, default=demo.DEFAULT_SEED, help="seed of the orders' fates (default: %(default)s)")
    run.add_argument("--timeout", type=float, default=demo.DEFAULT_TIMEOUT_S,
                     help="seconds to wait for every order to settle (default: %(default)s)")
    run.add_argument("--json", action="store_true",
                     help="print the outcome as one JSON document (the running commentary goes to stderr)")
    run.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo (see :mod:`coordinator.demo`); its exit code says whether the invariant held."""
    from coordinator.demo import story as demo

    out = functools.partial(print, flush=True, file=sys.stderr if args.json else sys.stdout)
    try:
        return demo.run_demo(args.lakehouse, orders=args.orders, threads=args.threads, seed=args.seed,
                             timeout_s=args.timeout, out=out, on_outcome=output.print_json if args.json else None,
                             object_store=args.object_store)
    except demo.DemoError as error:
        print(f"txcoord demo: {error}", file=sys.stderr)
        return EXIT_USAGE


def _order_count(text: str) -> int:
    from coordinator.demo.services import MIN_ORDERS

    return at_least(MIN_ORDERS, text, "one order per fate")


def _thread_count(text: str) -> int:
    return at_least(1, text)
