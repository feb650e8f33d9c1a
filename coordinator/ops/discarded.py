"""Discarded transactions: those the checker gave up on (no answer after ``transaction_check_max``
checks, or past ``file_reserved_time_hours``) and that no operator has committed since (no JVM).

A discarded transaction was never delivered; its messages wait in ``system/discarded``, and an
operator may still commit it once (:func:`coordinator.ops.resolve.resolve_transaction`).

Example::

    from coordinator.ops.discarded import discarded_transactions
    for txn in discarded_transactions(config, group="order_group"):
        print(txn.transaction_id, txn.discarded_at, txn.reason)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterable, Optional

import pyarrow.compute as pc

from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse, require_lakehouse, transaction_ids_in
from coordinator.protocol import Outcome
from coordinator.tables import DISCARDED, OP

__all__ = ["DiscardedTransaction", "committed_since", "discarded_transactions"]


@dataclass(frozen=True)
class DiscardedTransaction:
    """One discarded transaction no operator has committed. Times are UTC."""

    transaction_id: str
    producer_group: str
    topics: tuple[str, ...]
    messages: int
    stored_at: dt.datetime  # when its half entered the commit log
    discarded_at: dt.datetime
    checks: int  # check requests it had been sent
    reason: str


def discarded_transactions(config: CoordinatorConfig, group: Optional[str] = None) -> list[DiscardedTransaction]:
    """The discarded transactions of ``config``'s lakehouse (of ``group`` only, if given) that no
    operator has committed since, the most recently discarded first.

    Example::

        [t.transaction_id for t in discarded_transactions(config)]
    """
    lakehouse = require_lakehouse(Lakehouse.of(config))
    wanted = None if group is None else pc.field("producer_group") == group
    rows = lakehouse.read(DISCARDED, ["transaction_id", "producer_group", "topic", "stored_timestamp", "check_times",
                                      "reason", "discarded_at"], wanted).to_pylist()
    recovered = committed_since(lakehouse, {row["transaction_id"] for row in rows})
    by_transaction: dict[str, list[dict]] = {}
    for row in rows:
        if row["transaction_id"] not in recovered:
            by_transaction.setdefault(row["transaction_id"], []).append(row)
    found = [DiscardedTransaction(
        transaction_id=transaction_id, producer_group=halves[0]["producer_group"],
        topics=tuple(sorted({half["topic"] for half in halves})), messages=len(halves),
        stored_at=min(half["stored_timestamp"] for half in halves),
        discarded_at=max(half["discarded_at"] for half in halves),
        checks=max(half["check_times"] for half in halves), reason=halves[0]["reason"])
        for transaction_id, halves in by_transaction.items()]
    return sorted(found, key=lambda t: (t.discarded_at, t.transaction_id), reverse=True)


def committed_since(lakehouse: Lakehouse, discarded: Iterable[str]) -> set[str]:
    """Those of the ``discarded`` transactions that have a COMMIT op row too (an operator's, after the discard).

    Example::

        committed_since(Lakehouse("lakehouse"), ["3f2a…"])  # {'3f2a…'} once an operator committed it
    """
    discarded = sorted(set(discarded))
    if not discarded:
        return set()
    commits = lakehouse.read(OP, ["transaction_id"], transaction_ids_in(discarded) & (pc.field("outcome") == Outcome.COMMIT))
    return set(commits.column(0).to_pylist())
