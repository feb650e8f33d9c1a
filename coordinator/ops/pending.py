"""Hanging transactions: every transaction with no outcome yet, with what the checker will do next
(no JVM: delta-rs reads of the half queue, the op queue and the check requests).

What ``txcoord pending`` prints. A transaction is pending from the moment its half is in
``system/half`` until it has an op row. Its next step, and when, is :mod:`coordinator.schedule`'s,
as the checker decides it.

Example::

    from coordinator.ops.pending import pending_transactions
    for txn in pending_transactions(CoordinatorConfig.load("conf/coordinator.toml"), older_than_s=600):
        print(txn.transaction_id, txn.age_s, txn.checks, txn.next_step, txn.next_step_at)
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Optional, Union

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.config import CoordinatorConfig
from coordinator.checker.rebuild import check_history
from coordinator.checker.unresolved import unresolved_halves
from coordinator.control.progress import CheckerProgress
from coordinator.lakehouse import Lakehouse, require_lakehouse
from coordinator.schedule import DELIVER, Step, clock_time, clock_us, next_step
from coordinator.tables import UNDELIVERED

__all__ = ["PendingTransaction", "pending_transactions", "read_pending"]

UTC = dt.timezone.utc


@dataclass(frozen=True)
class PendingTransaction:
    """One transaction with no outcome yet. Times are UTC; ``age_s`` is counted from when its half
    entered the commit log."""

    transaction_id: str
    producer_group: str
    topics: tuple[str, ...]
    messages: int
    stored_at: dt.datetime
    age_s: float
    checks: int  # check requests issued so far
    last_check_at: Optional[dt.datetime]  # when the last check request became visible (its file was written)
    addressed_to: Optional[str]  # the producer instance the last check went to; None: any, or no check yet
    next_step: str  # coordinator.schedule.CHECK or DISCARD, or DELIVER for a committed one its topic has not taken
    next_step_at: dt.datetime  # when the checker takes it (at its first batch from then on)
    withheld: Optional[str] = None  # why its delivery is withheld (committed; its topic cannot be written yet)

    def to_dict(self) -> dict:
        """JSON-ready (times in ISO 8601)."""
        return asdict(self) | {"topics": list(self.topics), "stored_at": self.stored_at.isoformat(),
                               "last_check_at": self.last_check_at and self.last_check_at.isoformat(),
                               "next_step_at": self.next_step_at.isoformat()}


def pending_transactions(config: CoordinatorConfig, older_than_s: float = 0.0, group: Optional[str] = None,
                         now: Optional[dt.datetime] = None) -> list[PendingTransaction]:
    """The pending transactions of ``config``'s lakehouse at least ``older_than_s`` old (of ``group``
    only, if given), oldest first.

    Raises :class:`~coordinator.exceptions.LakehouseNotFoundError` if there is no lakehouse.

    Example::

        [t.transaction_id for t in pending_transactions(config, group="order_group")]
    """
    lakehouse = require_lakehouse(Lakehouse.of(config))
    now = now or dt.datetime.now(UTC)
    halves = read_pending(lakehouse, ["transaction_id", "producer_group", "topic", "message_index", "message_count",
                                      "stored_timestamp", "immunity_ms", "queue_offset"])
    if group is not None:
        halves = halves.filter(pc.field("producer_group") == group)
    topics: dict[str, set[str]] = defaultdict(set)
    firsts = {}
    for half in halves.to_pylist():
        topics[half["transaction_id"]].add(half["topic"])
        first = firsts.get(half["transaction_id"])
        if first is None or half["message_index"] < first["message_index"]:  # message 0, unless delivered already
            firsts[half["transaction_id"]] = half
    history = check_history(lakehouse, pc.field("transaction_id").isin(pa.array(list(firsts), pa.string())))
    withheld = _withheld(lakehouse, halves)
    found = []
    for transaction_id, first in firsts.items():
        # Not below 0: a store's whole-second time is rounded up, so a half just stored reads up to 1 s ahead.
        age_s = max(0.0, (now - first["stored_timestamp"]).total_seconds())
        if age_s < older_than_s:
            continue
        checks, last_check_us, addressed_to = history.get(transaction_id, (0, None, None))
        step = next_step(config, clock_us(first["stored_timestamp"]), first["immunity_ms"], checks, last_check_us, clock_us(now))
        reason = withheld.get(transaction_id)
        if reason is not None:
            step = Step(DELIVER, clock_us(now), reason)
        found.append(PendingTransaction(
            transaction_id=transaction_id, producer_group=first["producer_group"],
            topics=tuple(sorted(topics[transaction_id])), messages=first["message_count"],
            stored_at=first["stored_timestamp"], age_s=age_s, checks=checks,
            last_check_at=None if last_check_us is None else clock_time(last_check_us),
            addressed_to=addressed_to, next_step=step.action, next_step_at=clock_time(step.at_us), withheld=reason))
    return sorted(found, key=lambda t: (t.stored_at, t.transaction_id))


def _withheld(lakehouse: Lakehouse, halves: pa.Table) -> dict[str, str]:
    """Per pending transaction whose delivery is withheld, why (``system/undelivered``)."""
    if not halves.num_rows or not lakehouse.exists(UNDELIVERED):
        return {}
    rows = lakehouse.read(UNDELIVERED, ["transaction_id", "reason"],
                          pc.field("half_offset").isin(halves.column("queue_offset")))
    return dict(zip(rows.column("transaction_id").to_pylist(), rows.column("reason").to_pylist()))


def read_pending(lakehouse: Union[str, Lakehouse], columns: Optional[list[str]] = None) -> pa.Table:
    """The halves of ``lakehouse`` that have no op row yet (unresolved), with ``columns`` of ``system/half``.

    Reads the queues from the lowest offset the checker's last batch left unresolved (its progress
    record's ``pending_from``): the files' statistics leave out everything resolved before, so the cost
    follows the pending set, not the history.

    Example::

        read_pending("lakehouse", ["transaction_id", "stored_timestamp"]).num_rows
    """
    lakehouse = Lakehouse.at(lakehouse)
    progress = CheckerProgress(lakehouse).load()
    return unresolved_halves(lakehouse, 0 if progress is None else progress.pending_from, columns=columns)

