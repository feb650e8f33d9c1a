"""Recover, a step of a batch's *decide* phase (docs/design.md#a-batchs-steps): an operator's COMMIT of a
discarded transaction, accepted once.

RocketMQ's operators re-send a message from the discard topic by hand. Here an operator
sends a COMMIT END for the discarded transaction (``txcoord resolve --commit``); the checker
accepts the first one, appends a second op row per half (``COMMIT``, after the ``DISCARD``)
and delivers the messages from ``system/discarded``, where the discard kept them. Any later
END for the transaction is refused, so it is delivered once or never.

What was discarded and what was recovered is read from the tables as earlier batches left
them (an operator's END is rare, and the checker's memory keeps no bodies of resolved
transactions), by the batch's *gather* step (:func:`read_for_recovery`), so a replayed batch
decides as its first run did.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker.context import BatchContext
from coordinator.checker.provenance import operators_decisions
from coordinator.checker.refusals import rejection
from coordinator.exceptions import CheckerStateError
from coordinator.lakehouse import transaction_ids_in
from coordinator.protocol import LocalTransactionState, Outcome
from coordinator.tables import DISCARDED, MESSAGE_FIELDS, OP

ALREADY_RECOVERED = "discarded transaction already committed by an operator"
ALREADY_RESOLVED = "transaction already resolved"


@dataclass(frozen=True)
class RecoveryFacts:
    """What earlier batches wrote of the transactions an operator's COMMIT names: their op outcomes, and
    the rows ``system/discarded`` kept of their messages."""

    outcomes: dict[str, set[str]]
    discarded: pa.Table


@dataclass(frozen=True)
class Recovered:
    """What the operators' COMMITs of resolved transactions decided."""

    ops: list[dict]  # system/op rows (less batch_id): a COMMIT per half of each recovered transaction
    deliveries: pa.Table  # topic rows (less batch_id), each recovered message once
    transaction_ids: list[str]
    rejections: list[dict]


def operator_commit_targets(records: pa.Table) -> list[str]:
    """The transactions the operators' COMMITs among ``records`` (commit-log rows) name: what
    :func:`read_for_recovery` reads for."""
    ends = records.filter(pc.and_(pc.fill_null(pc.equal(records.column("state"), LocalTransactionState.COMMIT_MESSAGE.value), False),
                                  operators_decisions(records.column("check_id"))))
    return sorted(set(ends.column("transaction_id").drop_null().to_pylist()))


def read_for_recovery(ctx: BatchContext, transaction_ids: list[str]) -> RecoveryFacts:
    """What batches before this one wrote of ``transaction_ids`` in ``system/op`` and ``system/discarded``.

    Example::

        facts = read_for_recovery(ctx, operator_commit_targets(records.light))
    """
    if not transaction_ids:
        return RecoveryFacts({}, DISCARDED.arrow_schema().empty_table())
    outcomes: dict[str, set[str]] = {}
    ops = _earlier(ctx, OP, ["transaction_id", "outcome"], transaction_ids)
    for transaction_id, outcome in zip(ops.column(0).to_pylist(), ops.column(1).to_pylist()):
        outcomes.setdefault(transaction_id, set()).add(outcome)
    discarded = [t for t, found in outcomes.items() if Outcome.DISCARD in found]
    rows = _earlier(ctx, DISCARDED, ["transaction_id", "half_offset", *MESSAGE_FIELDS], discarded).sort_by("half_offset") \
        if discarded else DISCARDED.arrow_schema().empty_table()
    return RecoveryFacts(outcomes, rows)


def recover_discarded(ends: list[dict], facts: RecoveryFacts) -> Recovered:
    """Judge operators' COMMITs (:func:`.provenance.operators_decisions`) of transactions no longer pending:
    the first one for a transaction that was discarded, and not recovered since, is accepted;
    every other is refused. ``facts`` holds what earlier batches wrote of them (:func:`read_for_recovery`).

    Example::

        recovered = recover_discarded([end], facts)  # end: an operator's COMMIT of a discarded transaction
        recovered.deliveries.num_rows                # its messages, from system/discarded
    """
    if not ends:
        return Recovered([], _deliveries(DISCARDED.arrow_schema().empty_table(), {}), [], [])
    accepted, rejections = {}, []
    for end in sorted(ends, key=lambda r: (r["sequence"], r["record_id"])):
        found = facts.outcomes.get(end["transaction_id"], set())
        if end["transaction_id"] in accepted or found == {Outcome.DISCARD, Outcome.COMMIT}:
            rejections.append(rejection(end, ALREADY_RECOVERED))
        elif found != {Outcome.DISCARD}:
            rejections.append(rejection(end, ALREADY_RESOLVED))
        else:
            accepted[end["transaction_id"]] = end
    discarded = facts.discarded.filter(pc.is_in(facts.discarded.column("transaction_id"),
                                                value_set=pa.array(sorted(accepted), pa.string())))
    missing = set(accepted) - set(discarded.column("transaction_id").to_pylist())
    if missing:
        raise CheckerStateError(f"discarded transactions {sorted(missing)[:5]} have a DISCARD op row but no row "
                                "in system/discarded; the batch fails and is retried")
    offsets = discarded.column("half_offset").to_pylist()
    owners = discarded.column("transaction_id").to_pylist()
    committed_at = {offset: accepted[owner]["stored_us"] for offset, owner in zip(offsets, owners)}
    recovered_ops = [dict(half_offset=offset, transaction_id=owner, producer_group=accepted[owner]["producer_group"],
                          outcome=Outcome.COMMIT, resolved_at=committed_at[offset],
                          end_record_id=accepted[owner]["record_id"], check_id=accepted[owner]["check_id"])
                     for offset, owner in zip(offsets, owners)]
    return Recovered(recovered_ops, _deliveries(discarded, committed_at), sorted(accepted), rejections)


def _earlier(ctx: BatchContext, table, columns: list[str], ids: list[str]) -> pa.Table:
    """Rows of ``table`` for ``ids`` that batches before this one wrote (ids are time-ordered, so
    the range lets the files' statistics leave out the files of other times)."""
    return ctx.lakehouse.read(table, columns, transaction_ids_in(ids) & (pc.field("batch_id") < ctx.batch_id))


def _deliveries(discarded: pa.Table, committed_at: dict[int, int]) -> pa.Table:
    offsets = discarded.column("half_offset")
    times = pa.array([committed_at[offset] for offset in offsets.to_pylist()], pa.int64())
    return (discarded.select(["transaction_id", *MESSAGE_FIELDS])
            .append_column("queue_offset", offsets)
            .append_column("commit_timestamp", times.cast(discarded.schema.field("born_timestamp").type)))
