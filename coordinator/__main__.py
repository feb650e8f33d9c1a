"""The command line: ``python -m coordinator`` (or ``txcoord``).

Subcommands (each reads ``--config``, default ``conf/coordinator.toml``)::

    txcoord init                      # create the lakehouse's system tables
    txcoord status                    # pending, checks, discards, rejections, the checker and its lag
    txcoord inspect TRANSACTION_ID    # one transaction's timeline, from every table
    txcoord maintain [--retention-hours H] [--log-retention-hours H] [--table NAME]   # compact, checkpoint, vacuum
    txcoord demo [--lakehouse DIR] [--orders N]   # the order/credits story, end to end

``init``, ``status``, ``inspect`` and ``maintain`` start no JVM. Output is for people; ``--json``
prints one JSON document for scripts instead.

Exit codes: 0 success; 1 the answer is bad news (``status``: no live checker;
``inspect``: no table knows the transaction) or the command failed; 2 bad
arguments or configuration, or no lakehouse where the configuration points.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from typing import Optional

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import ConfigError
from coordinator.job_runtime import EXIT_USAGE
from coordinator.lakehouse import LakehouseNotFoundError

EXIT_OK = 0
EXIT_FAILED = 1
_UNFOLDED = 10_000  # console width when not writing to a terminal


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
    _common_options(init)
    init.set_defaults(run=run_init)

    status = commands.add_parser("status", help="the lakehouse's health; exit 1 if no checker is alive")
    _common_options(status)
    status.set_defaults(run=run_status)

    inspect = commands.add_parser("inspect", help="one transaction's timeline; exit 1 if no table knows it")
    inspect.add_argument("transaction_id", metavar="TRANSACTION_ID")
    _common_options(inspect)
    inspect.set_defaults(run=run_inspect)

    maintain = commands.add_parser("maintain", help="compact, checkpoint and vacuum the lakehouse's tables (no JVM)")
    maintain.add_argument("--retention-hours", type=_retention, default=None,
                          help="keep files removed less than this long ago (default: Delta's 168)")
    maintain.add_argument("--log-retention-hours", type=_log_retention, default=None, metavar="H",
                          help="set each table's delta.logRetentionDuration to H hours (fractions allowed), so log "
                               "cleanup keeps the Delta logs bounded (default: leave each table's own, Delta's 30 days)")
    maintain.add_argument("--table", action="append", dest="tables", metavar="NAME",
                          help="only this table, e.g. system/commit_log or topics/ORDER_TOPIC (repeatable; default: all)")
    _common_options(maintain)
    maintain.set_defaults(run=run_maintain)

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
    run.add_argument("--json", action="store_true",
                     help="print the outcome as one JSON document (the running commentary goes to stderr)")
    run.set_defaults(run=run_demo)
    return parser


def run_init(args: argparse.Namespace) -> int:
    """Create the missing system tables of the configured lakehouse and say which.

    Example::

        $ txcoord init --config conf/coordinator.toml
        created system/commit_log
        ...
        lakehouse /work/lakehouse initialised: 7 table(s) created
    """
    from coordinator.lakehouse import init_lakehouse

    config = CoordinatorConfig.load(args.config)
    root = os.path.abspath(config.lakehouse)
    created = init_lakehouse(config.lakehouse)
    if args.json:
        _print_json({"lakehouse": root, "created": created})
        return EXIT_OK
    for name in created:
        print(f"created {name}")
    if created:
        print(f"lakehouse {root} initialised: {len(created)} table(s) created")
    else:
        print(f"lakehouse {root} already initialised")
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    """Print the lakehouse's health (:mod:`coordinator.status`); exit 1 when no checker is alive.

    Example::

        $ txcoord status --config demo-lakehouse/demo.toml
        $ txcoord status --json | jq .pending_transactions
    """
    from coordinator.status import read_status

    status = read_status(CoordinatorConfig.load(args.config))
    if args.json:
        _print_json(status.to_dict())
    else:
        _print_status(status)
    return EXIT_OK if status.checker_alive else EXIT_FAILED


def run_inspect(args: argparse.Namespace) -> int:
    """Print one transaction's timeline (:mod:`coordinator.audit`); exit 1 if no table knows it.

    Example::

        $ txcoord inspect 3f2a9c... --config demo-lakehouse/demo.toml
    """
    from coordinator.audit import outcome, transaction_timeline

    config = CoordinatorConfig.load(args.config)
    events = transaction_timeline(config.lakehouse, args.transaction_id)
    if args.json:
        _print_json({"transaction_id": args.transaction_id, "outcome": outcome(events) if events else None,
                     "events": [event.to_dict() for event in events]})
    else:
        _print_timeline(args.transaction_id, events)
    return EXIT_OK if events else EXIT_FAILED


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo (see :mod:`coordinator.demo`); its exit code says whether the invariant held."""
    from coordinator import demo

    out = functools.partial(print, flush=True, file=sys.stderr if args.json else sys.stdout)
    try:
        return demo.run_demo(args.lakehouse, orders=args.orders, threads=args.threads, seed=args.seed,
                             timeout_s=args.timeout, out=out, on_outcome=_print_json if args.json else None)
    except demo.DemoError as error:
        print(f"txcoord demo: {error}", file=sys.stderr)
        return EXIT_USAGE


def run_maintain(args: argparse.Namespace) -> int:
    """Maintain every table (:mod:`coordinator.maintenance`), with a progress bar; print what each step did.

    Example::

        $ txcoord maintain --config conf/coordinator.toml --retention-hours 24 --log-retention-hours 2
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from coordinator.lakehouse import require_lakehouse
    from coordinator.maintenance import DEFAULT_RETENTION_HOURS, maintain, maintained_tables

    lakehouse = require_lakehouse(CoordinatorConfig.load(args.config).lakehouse)
    tables = args.tables or maintained_tables(lakehouse)
    retention = DEFAULT_RETENTION_HOURS if args.retention_hours is None else args.retention_hours
    columns = (TextColumn("maintaining"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    # On stderr, so that stdout holds only the result (and --json output stays one JSON document).
    with Progress(*columns, console=_console(stderr=True), transient=True) as progress:
        task = progress.add_task(tables[0], total=len(tables))
        position = iter(tables[1:])
        results = maintain(lakehouse, tables=tables, retention_hours=retention, log_retention_hours=args.log_retention_hours,
                           on_table=lambda done: progress.update(task, advance=1, description=next(position, "")))
    if args.json:
        _print_json({"lakehouse": os.path.abspath(lakehouse), "retention_hours": retention,
                     "log_retention_hours": args.log_retention_hours,
                     "tables": [dataclasses.asdict(result) for result in results]})
    else:
        _print_maintenance(results, retention, args.log_retention_hours)
    return EXIT_OK


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
    except LakehouseNotFoundError as error:
        print(f"txcoord {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"txcoord {args.command}: interrupted", file=sys.stderr)
        return 130


def _common_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    command.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def _print_json(document: object) -> None:
    print(json.dumps(document, indent=2, default=str))


def _console(stderr: bool = False):
    from rich.console import Console

    console = Console(highlight=False, stderr=stderr)
    # Into a file or a pipe, no line is folded: scripts and logs read each record on one line.
    return console if console.is_terminal else Console(highlight=False, stderr=stderr, width=_UNFOLDED)


def _seconds(value: float) -> str:
    """A duration for people: '850 ms', '12.3 s', '4 min 05 s', '3 h 20 min'."""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{value // 60:.0f} min {value % 60:02.0f} s"
    return f"{value // 3600:.0f} h {value % 3600 // 60:02.0f} min"


def _print_status(status) -> None:
    if status.checker_alive:
        checker = f"[green]alive[/green]: {status.checker_holder}, lease renewed {_seconds(status.lease_renewed_age_s)} ago"
    elif status.checker_process_gone:
        checker = (f"[red]not running[/red]: {status.checker_holder} is gone (lease renewed "
                   f"{_seconds(status.lease_renewed_age_s)} ago)")
    elif status.checker_holder:
        checker = (f"[red]not running[/red]: the lease of {status.checker_holder} expired "
                   f"{_seconds(status.lease_renewed_age_s)} ago")
    else:
        checker = "[red]not running[/red] (no lease)"
    if status.last_batch_id is None:
        last_batch = "none recorded"
    else:
        last_batch = (f"#{status.last_batch_id}, finished {_seconds(status.last_batch_age_s)} ago, "
                      f"took {_seconds(status.last_batch_duration_ms / 1000)}")
    if status.lag_versions is None:
        lag = f"unknown (commit log at version {status.commit_log_version})"
    elif status.lag_versions == 0:
        lag = f"none: read up to commit-log version {status.commit_log_version}"
    else:
        lag = (f"{status.lag_versions} commit-log version(s) unread, the oldest written "
               f"{_seconds(status.lag_s)} ago (head {status.commit_log_version})")
    pending = f"{status.pending_transactions} transaction(s)"
    if status.oldest_pending_age_s is not None:
        pending += f", oldest {_seconds(status.oldest_pending_age_s)}"
    console = _console()
    for key, value in [
        ("lakehouse", status.lakehouse),
        ("checker", checker),
        ("last batch", last_batch),
        ("lag", lag),
        ("pending", pending),
        ("checks due", str(status.checks_due)),
        ("checks issued", str(status.checks_issued)),
        ("discarded", f"{status.discarded} transaction(s)"),
        ("rejected", f"{status.rejected} record(s)"),
    ] + [(f"  {reason}", str(count)) for reason, count in status.rejected_by_reason.items()]:
        console.print(f"{key:<15}{value}")


def _print_timeline(transaction_id: str, events) -> None:
    from rich.table import Table

    from coordinator.audit import outcome

    console = _console()
    if not events:
        console.print(f"no table mentions transaction {transaction_id}")
        return
    console.print(f"transaction {transaction_id}: [bold]{outcome(events)}[/bold], {len(events)} events "
                  f"from {events[0].at:%Y-%m-%d %H:%M:%S} to {events[-1].at:%H:%M:%S} UTC")
    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False)
    for column in ("time", "step", "table"):
        table.add_column(column, no_wrap=True)
    table.add_column("detail", overflow="fold")
    for event in events:
        table.add_row(event.at.strftime("%H:%M:%S.%f")[:-3], event.step, event.table, event.detail)
    console.print(table)


def _print_maintenance(results, retention_hours: int, log_retention_hours: Optional[float]) -> None:
    from rich.table import Table

    table = Table(box=None, padding=(0, 2, 0, 0), pad_edge=False)
    for column in ("table", "files", "compacted", "vacuumed", "version"):
        table.add_column(column, no_wrap=True, justify="left" if column == "table" else "right")
    table.add_column("skipped", overflow="fold")
    for result in results:
        table.add_row(result.table, f"{result.files_before} → {result.files_after}", str(result.files_compacted),
                      str(result.files_vacuumed), str(result.version), "; ".join(result.skipped))
    console = _console()
    console.print(table)
    console.print(f"{len(results)} table(s) maintained; files removed more than {retention_hours} h ago were vacuumed"
                  + ("" if log_retention_hours is None else f"; logs keep commits for {log_retention_hours:g} h"))


def _retention(text: str) -> int:
    from coordinator.maintenance import MIN_RETENTION_HOURS

    return _at_least(MIN_RETENTION_HOURS, text, "a shorter vacuum deletes files that writers commit while it runs")


def _log_retention(text: str) -> float:
    from coordinator.maintenance import log_retention_interval

    try:
        hours = float(text)
        log_retention_interval(hours)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a positive number of hours: {text!r}") from None
    return hours


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
