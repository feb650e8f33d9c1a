"""Step 2 — resolve and promote: validate END records, decide op rows, deliver commits to topics."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

from coordinator.checker.context import BatchRecords
from coordinator.checker.recover import ALREADY_RESOLVED, is_operator_commit
from coordinator.checker.refusals import first_failure, rejection
from coordinator.checker.state import CheckerState, Known
from coordinator.protocol import OPERATOR_CHECK_PREFIX, LocalTransactionState, Outcome, RecordKind, outcome_of
from coordinator.tables import MESSAGE_FIELDS

_STATES = {state.value for state in LocalTransactionState}
WAIT_FOR_CHECK = "arrived after the immunity time: wait for check"


@dataclass(frozen=True)
class Resolved:
    """What the END records of a batch decided: op rows, and each resolved transaction's outcome."""

    ops: list[dict]  # system/op rows (less batch_id), one per half message
    outcomes: dict[str, str]  # transaction id -> COMMIT or ROLLBACK
    rejections: list[dict]
    to_recover: list[dict]  # operators' COMMITs of transactions no longer pending: see :mod:`.recover`
    check_answers: Counter  # valid answers to check-backs, by state (UNKNOW included)
    half_to_end_s: list[float]  # per transaction resolved: from its half's storing to its deciding END's


def resolve_ends(records: BatchRecords, state: CheckerState, known: Mapping[str, Known]) -> Resolved:
    """Validate this batch's END records (docs/design.md#validating-an-end) and turn the first valid one per
    transaction into op rows, one per half message.

    ``state.pending`` holds every unresolved transaction, this batch's new ones included;
    ``known`` what earlier batches ingested of the batch's other transaction ids.

    ``UNKNOW`` ends are valid and change nothing. An operator's COMMIT of a transaction no
    longer pending is set aside for :func:`~coordinator.checker.recover.recover_discarded`. A producer's own COMMIT or ROLLBACK
    that entered the commit log after the half's immunity time is refused ("wait for
    check"): judged by commit-log time, so checker downtime never refuses anything.

    Example::

        resolved = resolve_ends(records, state, known)
        resolved.outcomes  # {'019a...': 'COMMIT'}
    """
    ends = [r for r in records.rows if r["kind"] == RecordKind.END]
    rejections, decisions, to_recover, check_answers = [], [], [], Counter()
    for end in ends:
        pending = state.pending.get(end["transaction_id"])
        earlier = known.get(end["transaction_id"])
        end["owner"] = pending.producer_group if pending else earlier.producer_group if earlier else None
        end["pending"] = pending
        reason = first_failure(end, _END_RULES)
        if reason == ALREADY_RESOLVED and is_operator_commit(end):
            to_recover.append(end)
        elif reason is not None:
            rejections.append(rejection(end, reason))
        else:
            if end["check_id"] is not None and not end["check_id"].startswith(OPERATOR_CHECK_PREFIX):
                check_answers[end["state"]] += 1
            if outcome_of(end["state"]) is not None:
                decisions.append(end)
    outcomes, ops, half_to_end_s = {}, [], []
    for end in sorted(decisions, key=lambda r: (r["sequence"], r["record_id"])):
        pending = end["pending"]
        if pending.transaction_id in outcomes:
            rejections.append(rejection(end, ALREADY_RESOLVED))
            continue
        outcome = outcomes[pending.transaction_id] = outcome_of(end["state"])
        half_to_end_s.append(max(0, end["stored_us"] - pending.stored_us) / 1_000_000)
        ops.extend(dict(half_offset=offset, transaction_id=pending.transaction_id, producer_group=pending.producer_group,
                        outcome=outcome, resolved_at=end["stored_us"], end_record_id=end["record_id"],
                        check_id=end["check_id"])
                   for offset in pending.offsets)
    return Resolved(ops, outcomes, rejections, to_recover, check_answers, half_to_end_s)


_END_RULES = [
    (lambda r: r["record_id"] is None, "missing record_id"),
    (lambda r: r["transaction_id"] is None, "missing transaction_id"),
    (lambda r: r["state"] not in _STATES, lambda r: f"unknown state '{r['state'] if r['state'] is not None else 'null'}'"),
    (lambda r: r["owner"] is None, "unknown transaction"),
    (lambda r: r["producer_group"] != r["owner"], "producer group does not own the transaction"),
    (lambda r: r["pending"] is not None and r["sequence"] <= r["pending"].half_sequence, "end precedes its half"),
    (lambda r: r["pending"] is None, ALREADY_RESOLVED),
    (lambda r: outcome_of(r["state"]) is not None and r["check_id"] is None and r["stored_us"] > r["pending"].own_end_until_us,
     WAIT_FOR_CHECK),
]


def promote(resolved: Resolved, state: CheckerState) -> pa.Table:
    """The topic rows (less ``batch_id``) of this batch's committed transactions, each message once.

    Example::

        deliveries = promote(resolved, state)
        deliveries.column("topic")
    """
    committed = {op["half_offset"]: op["resolved_at"] for op in resolved.ops if op["outcome"] == Outcome.COMMIT}
    halves = state.rows.take(committed)
    commit_times = pa.array([committed[offset] for offset in halves.column("queue_offset").to_pylist()], pa.int64())
    return halves.select(["transaction_id", *MESSAGE_FIELDS, "queue_offset"]).append_column(
        "commit_timestamp", commit_times.cast(halves.schema.field("born_timestamp").type))
