"""Watching transactions and ending one by hand: ``txcoord status``, ``pending``, ``resolve`` and ``inspect``."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from coordinator.cli import output
from coordinator.cli.options import EXIT_FAILED, EXIT_OK, common_options
from coordinator.config import EXIT_USAGE, CoordinatorConfig
from coordinator.exceptions import InvalidArgumentError
from coordinator.lakehouse import Lakehouse

__all__ = ["register", "run_inspect", "run_pending", "run_resolve", "run_status"]


def register(commands) -> None:
    """``status``, ``pending``, ``resolve`` and ``inspect``, on ``commands`` (the ``txcoord`` parser's sub-parsers)."""
    _add_status(commands)
    _add_pending(commands)
    _add_resolve(commands)
    _add_inspect(commands)


def _add_status(commands) -> None:
    status = commands.add_parser("status", help="the lakehouse's health; exit 1 if no checker is alive")
    common_options(status)
    status.set_defaults(run=run_status)


def run_status(args: argparse.Namespace) -> int:
    """Print the lakehouse's health (:mod:`coordinator.ops.status`); exit 1 when no checker is alive.

    Example::

        $ txcoord status --config demo-lakehouse/demo.toml
        $ txcoord status --json | jq .pending_transactions
    """
    from coordinator.ops.status import read_status

    status = read_status(CoordinatorConfig.load(args.config))
    if args.json:
        output.print_json(status.to_dict())
    else:
        output.print_status(status)
    return EXIT_OK if status.checker_alive else EXIT_FAILED


def _add_pending(commands) -> None:
    pending = commands.add_parser("pending", help="hanging transactions: age, checks so far, next check, addressee")
    pending.add_argument("--older-than", type=_duration, default=0.0, metavar="DURATION",
                         help="only transactions at least this old: 90s, 10m, 2h, 1d (default: all)")
    pending.add_argument("--group", default=None, metavar="G", help="only this producer group")
    common_options(pending)
    pending.set_defaults(run=run_pending)


def run_pending(args: argparse.Namespace) -> int:
    """Print the pending transactions (:mod:`coordinator.ops.pending`), oldest first.

    Example::

        $ txcoord pending --older-than 10m --group order_group --config conf/coordinator.toml
    """
    from coordinator.ops.pending import pending_transactions

    now = datetime.now(timezone.utc)
    transactions = pending_transactions(CoordinatorConfig.load(args.config), older_than_s=args.older_than,
                                        group=args.group, now=now)
    if args.json:
        output.print_json({"generated_at": now.isoformat(), "pending": [t.to_dict() for t in transactions]})
    else:
        output.print_pending(transactions, now)
    return EXIT_OK


def _duration(text: str) -> float:
    from coordinator.durations import parse_duration

    try:
        return parse_duration(text)
    except InvalidArgumentError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_resolve(commands) -> None:
    resolve = commands.add_parser("resolve", help="end a pending transaction, or commit a discarded one, by hand, through the commit log")
    resolve.add_argument("transaction_id", metavar="TRANSACTION_ID")
    decision = resolve.add_mutually_exclusive_group(required=True)
    decision.add_argument("--commit", dest="decision", action="store_const", const="COMMIT_MESSAGE",
                          help="deliver its messages")
    decision.add_argument("--rollback", dest="decision", action="store_const", const="ROLLBACK_MESSAGE",
                          help="drop its messages")
    resolve.add_argument("--reason", required=True, help="why, for the audit trail (`txcoord inspect` shows it)")
    common_options(resolve)
    resolve.set_defaults(run=run_resolve)


def run_resolve(args: argparse.Namespace) -> int:
    """End a pending transaction, or commit a discarded one, by hand (:mod:`coordinator.ops.resolve`);
    exit 2, writing nothing, if it cannot be ended so or the reason is missing.

    Example::

        $ txcoord resolve 01a2... --rollback --reason "order cancelled by support" --config conf/coordinator.toml
    """
    from coordinator.ops.resolve import resolve_transaction
    from coordinator.protocol import LocalTransactionState

    try:
        record = resolve_transaction(CoordinatorConfig.load(args.config), args.transaction_id,
                                     LocalTransactionState(args.decision), args.reason)
    except InvalidArgumentError as error:
        print(f"txcoord resolve: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        output.print_json({key: record[key] for key in ("transaction_id", "producer_group", "state", "check_id",
                                                        "properties", "born_timestamp")})
    else:
        print(f"{record['state']} of transaction {record['transaction_id']} (group {record['producer_group']}) "
              f"sent as {record['check_id']}; the checker applies it at its next batch (`txcoord inspect` to follow)")
    return EXIT_OK


def _add_inspect(commands) -> None:
    inspect = commands.add_parser("inspect", help="one transaction's timeline; exit 1 if no table knows it")
    inspect.add_argument("transaction_id", metavar="TRANSACTION_ID")
    common_options(inspect)
    inspect.set_defaults(run=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    """Print one transaction's timeline (:mod:`coordinator.ops.audit`); exit 1 if no table knows it.

    Example::

        $ txcoord inspect 3f2a9c... --config demo-lakehouse/demo.toml
    """
    from coordinator.ops.audit import outcome, transaction_timeline

    config = CoordinatorConfig.load(args.config)
    events = transaction_timeline(Lakehouse.of(config), args.transaction_id)
    if args.json:
        output.print_json({"transaction_id": args.transaction_id, "outcome": outcome(events) if events else None,
                     "events": [event.to_dict() for event in events]})
    else:
        output.print_timeline(args.transaction_id, events)
    return EXIT_OK if events else EXIT_FAILED
