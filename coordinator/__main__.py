"""The command line: ``python -m coordinator`` (or ``txcoord``).

Subcommands::

    txcoord init [--config conf/coordinator.toml]    # create the lakehouse's system tables (no JVM)
    txcoord demo [--lakehouse DIR] [--orders N]      # the order/credits story, end to end

Exit codes: 0 success, 1 the command ran and failed, 2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Optional

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import ConfigError
from coordinator.job_runtime import EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand.

    Example::

        build_parser().parse_args(["demo", "--orders", "12"]).orders  # 12
    """
    from coordinator import demo
    from coordinator.demo_services import MIN_ORDERS

    parser = argparse.ArgumentParser(prog="txcoord", description="Transactional messages on Delta Lake.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = commands.add_parser("init", help="create the lakehouse's system tables (idempotent)")
    init.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    init.set_defaults(run=run_init)

    run = commands.add_parser("demo", help="run the order/credits story against a local lakehouse")
    run.add_argument("--lakehouse", default=demo.DEFAULT_LAKEHOUSE,
                     help=f"demo directory, wiped and recreated (default: ./{demo.DEFAULT_LAKEHOUSE})")
    run.add_argument("--orders", type=_order_count, default=demo.DEFAULT_ORDERS,
                     help=f"orders to send, at least {MIN_ORDERS} (default: {demo.DEFAULT_ORDERS})")
    run.add_argument("--threads", type=_thread_count, default=demo.DEFAULT_THREADS,
                     help=f"sending threads (default: {demo.DEFAULT_THREADS})")
    run.add_argument("--seed", type=int, default=demo.DEFAULT_SEED, help="seed of the orders' fates (default: %(default)s)")
    run.add_argument("--timeout", type=float, default=demo.DEFAULT_TIMEOUT_S,
                     help="seconds to wait for every order to settle (default: %(default)s)")
    run.set_defaults(run=run_demo)
    return parser


def run_init(args: argparse.Namespace) -> int:
    """Create the missing system tables of the configured lakehouse and say which.

    Example::

        $ txcoord init --config conf/coordinator.toml
        created system/commit_log
        ...
        lakehouse /work/lakehouse initialised: 6 table(s) created
    """
    from coordinator.lakehouse import init_lakehouse

    config = CoordinatorConfig.load(args.config)
    root = os.path.abspath(config.lakehouse)
    created = init_lakehouse(config.lakehouse)
    for name in created:
        print(f"created {name}")
    if created:
        print(f"lakehouse {root} initialised: {len(created)} table(s) created")
    else:
        print(f"lakehouse {root} already initialised")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo (see :mod:`coordinator.demo`); its exit code says whether the invariant held."""
    from coordinator import demo

    try:
        return demo.run_demo(args.lakehouse, orders=args.orders, threads=args.threads, seed=args.seed,
                             timeout_s=args.timeout, out=functools.partial(print, flush=True))
    except demo.DemoError as error:
        print(f"txcoord demo: {error}", file=sys.stderr)
        return EXIT_USAGE


def main(argv: Optional[list[str]] = None) -> int:
    """Parse ``argv`` and run the subcommand; return the exit code.

    Example::

        main(["init", "--config", "conf/coordinator.toml"])  # 0
    """
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as error:
        print(f"txcoord {args.command}: configuration error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"txcoord {args.command}: interrupted", file=sys.stderr)
        return 130


def _order_count(text: str) -> int:
    from coordinator.demo_services import MIN_ORDERS

    return _at_least(MIN_ORDERS, text, "one order per fate")


def _thread_count(text: str) -> int:
    return _at_least(1, text)


def _at_least(minimum: int, text: str, why: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}" + (f" ({why})" if why else "") + f", got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
