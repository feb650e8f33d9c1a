"""Ending a hanging transaction by hand: what ``txcoord resolve`` does (no JVM).

An operator's decision goes through a commit log like any other: an END record marked as the
operator's (its check id starts with ``operator-``; its properties carry who and why), in the
operators' own log (``operators/commit_log``), which only operators may write; the checker judges
it as a check answer, and refuses an operator's mark anywhere else. The checker stays the only writer of its tables, and every
rule still applies: the first decision of a transaction counts, a resolved one cannot be
resolved again, except that a discarded one can be committed once (it is then delivered from
``system/discarded``, exactly once). ``txcoord inspect`` shows who resolved it and why.

Example::

    from coordinator.ops.resolve import resolve_transaction
    resolve_transaction(config, "01a2...", LocalTransactionState.ROLLBACK_MESSAGE, "order cancelled by support")
"""

from __future__ import annotations

import getpass
import socket
import uuid
from dataclasses import dataclass
from typing import Optional

import pyarrow.compute as pc

from coordinator.commit_logs import CommitLogRef
from coordinator.config import CoordinatorConfig
from coordinator.exceptions import InvalidArgumentError
from coordinator.lakehouse import Lakehouse, require_lakehouse
from coordinator.ops.pending import read_pending
from coordinator.producer.commit_log import CommitLogWriter, end_record
from coordinator.protocol import (MAX_REASON_LENGTH, OPERATOR_CHECK_PREFIX, OPERATOR_PROPERTY, OPERATOR_REASON_PROPERTY,
                                  LocalTransactionState, Outcome)
from coordinator.tables import DISCARDED, HALF, OP

__all__ = ["DECISIONS", "Preview", "preview_resolution", "resolve_transaction"]

DECISIONS = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE)


@dataclass(frozen=True)
class Preview:
    """What a decision would do to a transaction, before it is sent: its group, whether it was
    discarded, and its messages (``topic``, ``msg_id``, ``keys``, ``tags``, ``body``, in order),
    which a commit delivers and a rollback drops."""

    transaction_id: str
    producer_group: str
    decision: LocalTransactionState
    discarded: bool
    messages: list[dict]


def preview_resolution(config: CoordinatorConfig, transaction_id: str, decision: LocalTransactionState) -> Preview:
    """What :func:`resolve_transaction` would end, and how, writing nothing.

    Raises :class:`~coordinator.exceptions.InvalidArgumentError` exactly when
    :func:`resolve_transaction` would refuse the decision.

    Example::

        preview = preview_resolution(config, txn, LocalTransactionState.COMMIT_MESSAGE)
        [m["topic"] for m in preview.messages]  # what a commit delivers
    """
    lakehouse = require_lakehouse(Lakehouse.of(config))
    _check_decision(decision)
    group, discarded = _owner_if_open(lakehouse, transaction_id, decision)
    columns = ["topic", "msg_id", "keys", "tags", "body"]
    if discarded:  # what a commit delivers: the discard's copies, in the order the halves give them
        rows = lakehouse.read(DISCARDED, ["half_offset", *columns], pc.field("transaction_id") == transaction_id)
        order = lakehouse.read(HALF, ["queue_offset", "message_index"], pc.field("transaction_id") == transaction_id)
        rows = rows.join(order, keys="half_offset", right_keys="queue_offset")
    else:
        rows = read_pending(lakehouse, ["transaction_id", "message_index", *columns])
        rows = rows.filter(pc.field("transaction_id") == transaction_id)
    messages = rows.sort_by("message_index").select(columns).to_pylist()
    return Preview(transaction_id, group, decision, discarded, messages)


def resolve_transaction(config: CoordinatorConfig, transaction_id: str, decision: LocalTransactionState, reason: str,
                        operator: Optional[str] = None) -> dict:
    """Send the operator's END for a pending transaction of ``config``'s lakehouse, or the COMMIT of a
    discarded one; return the record.

    Raises :class:`~coordinator.exceptions.InvalidArgumentError`, writing nothing, when the
    transaction cannot be ended so: it is unknown or not yet taken in by the checker, it was
    committed or rolled back, it was discarded and the decision is a rollback, or it was
    discarded and committed since. Also when the decision is not a commit or a rollback, or the
    reason is empty or longer than :data:`~coordinator.protocol.MAX_REASON_LENGTH`.

    Example::

        resolve_transaction(config, txn, LocalTransactionState.COMMIT_MESSAGE, "paid, confirmed by phone")
    """
    lakehouse = require_lakehouse(Lakehouse.of(config))
    _check_decision(decision)
    reason = (reason or "").strip()
    if not reason or len(reason) > MAX_REASON_LENGTH:
        raise InvalidArgumentError(f"give a reason of 1 to {MAX_REASON_LENGTH} characters")
    group, _ = _owner_if_open(lakehouse, transaction_id, decision)
    operator = operator or f"{getpass.getuser()}@{socket.gethostname()}"
    record = end_record(group, transaction_id, decision, check_id=f"{OPERATOR_CHECK_PREFIX}{uuid.uuid4().hex}",
                        properties={OPERATOR_PROPERTY: operator, OPERATOR_REASON_PROPERTY: reason})
    with CommitLogWriter(lakehouse, CommitLogRef.operators()) as writer:
        writer.submit([record]).result()
    return record


def _check_decision(decision: LocalTransactionState) -> None:
    if decision not in DECISIONS:
        raise InvalidArgumentError(f"a decision is COMMIT_MESSAGE or ROLLBACK_MESSAGE, got {decision}")


def _owner_if_open(lakehouse: Lakehouse, transaction_id: str, decision: LocalTransactionState) -> tuple[str, bool]:
    """The producer group of ``transaction_id`` and whether it was discarded, if ``decision`` may still
    end it: it is pending, or it was discarded, not committed since, and the decision is a commit."""
    pending = read_pending(lakehouse, ["transaction_id", "producer_group"]).filter(
        pc.field("transaction_id") == transaction_id)
    if pending.num_rows:
        return pending.column("producer_group")[0].as_py(), False
    ops = lakehouse.read(OP, ["producer_group", "outcome"], pc.field("transaction_id") == transaction_id)
    outcomes = set(ops.column("outcome").to_pylist())
    if outcomes == {Outcome.DISCARD} and decision == LocalTransactionState.COMMIT_MESSAGE:
        return ops.column("producer_group")[0].as_py(), True
    if outcomes == {Outcome.DISCARD}:
        raise InvalidArgumentError(f"transaction {transaction_id} was discarded: it was never delivered and stays so; "
                                   "only --commit can still end it (once)")
    if outcomes == {Outcome.DISCARD, Outcome.COMMIT}:
        raise InvalidArgumentError(f"transaction {transaction_id} was discarded, then committed by an operator: "
                                   "it is resolved for good")
    if outcomes:
        raise InvalidArgumentError(f"transaction {transaction_id} is already resolved: {', '.join(sorted(outcomes))}")
    raise InvalidArgumentError(f"no pending transaction {transaction_id} in {lakehouse.path('system/half')} "
                               "(unknown, or not yet taken in by the checker)")
