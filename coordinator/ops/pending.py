"""Hanging transactions: every transaction with no outcome yet, with what the checker will do next
(no JVM: delta-rs reads of the half queue, the op queue and the check requests).

What ``txcoord pending`` prints. A transaction is pending from the moment its half is in
``system/half`` until it has an op row. Its next step is a check, first once its immunity has
passed, then every ``transaction_check_interval_ms``; after ``transaction_check_max`` checks,
or once older than ``file_reserved_time_hours``, a discard.

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
from coordinator.control.progress import CheckerProgress
from coordinator.lakehouse import Lakehouse, require_lakehouse
from coordinator.tables import CHECK_REQUESTS, HALF, OP

__all__ = ["CHECK", "DISCARD", "PendingTransaction", "next_step_of", "pending_transactions",
           "read_pending"]

UTC = dt.timezone.utc
CHECK = "check"
DISCARD = "discard"


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
    last_check_at: Optional[dt.datetime]
    addressed_to: Optional[str]  # the producer instance the last check went to; None: any, or no check yet
    next_step: str  # CHECK or DISCARD
    next_step_at: dt.datetime  # when the checker takes it (at its first batch from then on)

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
                                      "stored_timestamp", "immunity_ms"])
    if group is not None:
        halves = halves.filter(pc.field("producer_group") == group)
    topics: dict[str, set[str]] = defaultdict(set)
    firsts = {}
    for half in halves.to_pylist():
        topics[half["transaction_id"]].add(half["topic"])
        if half["message_index"] == 0:
            firsts[half["transaction_id"]] = half
    checks = _checks_by_transaction(lakehouse, set(firsts))
    found = []
    for transaction_id, first in firsts.items():
        age_s = (now - first["stored_timestamp"]).total_seconds()
        if age_s < older_than_s:
            continue
        issued = checks.get(transaction_id, [])
        last = max(issued, key=lambda r: r["check_times"], default=None)
        next_step, next_step_at = next_step_of(config, first["stored_timestamp"], first["immunity_ms"],
                                               len(issued), last and last["requested_at"])
        found.append(PendingTransaction(
            transaction_id=transaction_id, producer_group=first["producer_group"],
            topics=tuple(sorted(topics[transaction_id])), messages=first["message_count"],
            stored_at=first["stored_timestamp"], age_s=age_s, checks=len(issued),
            last_check_at=last and last["requested_at"], addressed_to=last and last["producer_instance"],
            next_step=next_step, next_step_at=next_step_at))
    return sorted(found, key=lambda t: (t.stored_at, t.transaction_id))


def next_step_of(config: CoordinatorConfig, stored_at: dt.datetime, immunity_ms: int, checks: int,
                 last_check_at: Optional[dt.datetime]) -> tuple[str, dt.datetime]:
    """What the checker does next with a pending transaction, and from when: the checker's rule
    (``coordinator/checker/check.py``), timed by the requests' batch clocks rather than their files'.

    Example::

        next_step_of(config, stored, 6000, 0, None)  # ('check', stored + 6 s)
    """
    expires_at = stored_at + dt.timedelta(hours=config.file_reserved_time_hours)
    if checks == 0:
        due = stored_at + dt.timedelta(milliseconds=immunity_ms)
    else:
        due = last_check_at + dt.timedelta(milliseconds=config.transaction_check_interval_ms)
    if checks >= config.transaction_check_max:
        return DISCARD, due
    if expires_at <= due:
        return DISCARD, expires_at
    return CHECK, due


def read_pending(lakehouse: Union[str, Lakehouse], columns: Optional[list[str]] = None) -> pa.Table:
    """The halves of ``lakehouse`` that have no op row yet (unresolved), with ``columns`` of ``system/half``.

    Reads the queues from the lowest offset the checker's last batch left unresolved (its progress
    record's ``pending_from``): the files' statistics leave out everything resolved before, so the cost
    follows the pending set, not the history.

    Example::

        read_pending("lakehouse", ["transaction_id", "stored_timestamp"]).num_rows
    """
    lakehouse = Lakehouse.at(lakehouse)
    columns = columns or HALF.column_names
    progress = CheckerProgress(lakehouse).load()
    start = 0 if progress is None else progress.pending_from
    halves = lakehouse.read(HALF, list(dict.fromkeys(columns + ["queue_offset"])), pc.field("queue_offset") >= start,
                            files=f"queue_offset >= {start}")
    resolved = lakehouse.read(OP, ["half_offset"], pc.field("half_offset") >= start,
                              files=f"half_offset >= {start}").column("half_offset")
    return halves.filter(pc.invert(pc.is_in(halves.column("queue_offset"), value_set=resolved))).select(columns)


def _checks_by_transaction(lakehouse: Lakehouse, transaction_ids: set[str]) -> dict[str, list[dict]]:
    requests = lakehouse.read(CHECK_REQUESTS, ["transaction_id", "check_times", "requested_at", "producer_instance"])
    by_transaction: dict[str, list[dict]] = defaultdict(list)
    for request in requests.to_pylist():
        if request["transaction_id"] in transaction_ids:
            by_transaction[request["transaction_id"]].append(request)
    return by_transaction
