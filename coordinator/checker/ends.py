"""Resolve and promote, a step of a batch's *decide* phase (docs/design.md#a-batchs-steps): validate END
records, decide op rows, deliver commits to topics.

Computed over the batch's columns. Each END is joined to what it ends (its *target*): a transaction
whose halves came in this same batch (the common case when a backlog is worked off), one pending from
an earlier batch (looked up in the checker's memory, one by one: only those ENDs), or one resolved
earlier. The END rules are masks over that join; the first valid deciding END per transaction wins;
op rows and topic rows are taken from the halves' rows. A transaction resolved within its own batch
never enters the checker's pending set.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker.context import BatchRecords, grouped
from coordinator.checker.provenance import operators_decisions
from coordinator.checker.recover import ALREADY_RESOLVED
from coordinator.checker.refusals import rejection
from coordinator.checker.memory import CheckerMemory, Known, transaction_bounds
from coordinator.protocol import LocalTransactionState, Outcome, RecordKind
from coordinator.tables import MESSAGE_FIELDS
from coordinator.validation import first_reasons

__all__ = ["Resolved", "WAIT_FOR_CHECK", "promote", "resolve_ends"]

_STATES = pa.array([state.value for state in LocalTransactionState])
_DECIDING = pa.array([LocalTransactionState.COMMIT_MESSAGE.value, LocalTransactionState.ROLLBACK_MESSAGE.value])
WAIT_FOR_CHECK = "arrived after the immunity time: wait for check"
#: What judging an END, refusing it (:func:`~.refusals.rejection`) and recovering with it read.
_END_COLUMNS = ["row", "record_id", "kind", "transaction_id", "producer_group", "msg_id", "topic", "state", "check_id",
                "commit_version", "commit_log", "stored_us", "sequence"]
_TARGET_SCHEMA = pa.schema([("transaction_id", pa.string()), ("owner", pa.string()), ("pending", pa.bool_()),
                            ("in_batch", pa.bool_()), ("half_sequence", pa.int64()), ("half_stored_us", pa.int64()),
                            ("own_end_until_us", pa.int64())])
_DECIDED_SCHEMA = pa.schema([("transaction_id", pa.string()), ("producer_group", pa.string()), ("outcome", pa.string()),
                             ("in_batch", pa.bool_())])
_OPS_SCHEMA = pa.schema([("half_offset", pa.int64()), ("transaction_id", pa.string()), ("producer_group", pa.string()),
                         ("outcome", pa.string()), ("resolved_at", pa.int64()), ("end_record_id", pa.string()),
                         ("check_id", pa.string()), ("topic", pa.string()), ("order", pa.int64())])


@dataclass(frozen=True)
class Resolved:
    """What the END records of a batch decided."""

    ops: pa.Table  # system/op rows (less batch_id) plus each half's topic, one per half message
    decided: pa.Table  # per transaction resolved, in deciding order: transaction_id, producer_group, outcome, in_batch
    rejections: list[dict]
    to_recover: list[dict]  # operators' COMMITs of transactions no longer pending: see :mod:`.recover`
    check_answers: Counter  # valid answers to check-backs, by state (UNKNOW included)
    half_to_end_s: pa.ChunkedArray  # per transaction resolved: seconds from its half's storing to its deciding END's

    def ids(self, in_batch: bool) -> list[str]:
        """The transactions resolved whose halves came in this batch (``in_batch``), or in an earlier one."""
        return self._decided("transaction_id", in_batch)

    def groups(self, in_batch: bool) -> list[str]:
        """The producer groups of :meth:`ids`, in the same order."""
        return self._decided("producer_group", in_batch)

    def _decided(self, column: str, in_batch: bool) -> list:
        return self.decided.column(column).filter(pc.equal(self.decided.column("in_batch"), in_batch)).to_pylist()

    def count(self, outcome: str) -> int:
        return pc.sum(pc.equal(self.decided.column("outcome"), outcome)).as_py() or 0


def resolve_ends(records: BatchRecords, new_halves: pa.Table, memory: CheckerMemory,
                 known: Mapping[str, Known]) -> Resolved:
    """Validate this batch's END records (docs/design.md#validating-an-end) and turn the first valid one per
    transaction into op rows, one per half message.

    ``new_halves`` are the half rows this batch accepted (``system/half``'s columns); ``memory.pending``
    holds the transactions unresolved by earlier batches; ``known`` what earlier batches ingested of the
    batch's other transaction ids.

    ``UNKNOW`` ends are valid and change nothing. An operator's COMMIT of a transaction no
    longer pending is set aside for :func:`~coordinator.checker.recover.recover_discarded`. A producer's own COMMIT or ROLLBACK
    that entered the commit log after the half's immunity time is refused ("wait for
    check"): judged by commit-log time, so checker downtime never refuses anything.

    Example::

        resolved = resolve_ends(records, ingested.halves, memory, known)
        resolved.decided.column("outcome")  # ['COMMIT', ...]
    """
    light = records.light
    ends = light.filter(pc.equal(light.column("kind"), RecordKind.END.value)).select(_END_COLUMNS)
    if not ends.num_rows:  # the rules' groupings and joins cost milliseconds even over no rows
        return Resolved(_OPS_SCHEMA.empty_table(), _DECIDED_SCHEMA.empty_table(), [], [], Counter(),
                        pa.chunked_array([], pa.float64()))
    targets = _targets(ends, new_halves, memory, known)
    target = targets.drop_columns(["transaction_id"]).take(
        pc.index_in(ends.column("transaction_id"), value_set=targets.column("transaction_id")))
    ends = pa.Table.from_arrays([*ends.columns, *target.columns], names=[*ends.column_names, *target.column_names])
    reasons = first_reasons(_end_rules(ends), ends.num_rows)
    operator_commit = pc.and_(pc.fill_null(pc.equal(ends.column("state"), LocalTransactionState.COMMIT_MESSAGE.value), False),
                              operators_decisions(ends.column("check_id")))
    recover = pc.and_(pc.fill_null(pc.equal(reasons, ALREADY_RESOLVED), False), operator_commit)
    refused = pc.and_(pc.is_valid(reasons), pc.invert(recover))
    valid = ends.filter(pc.is_null(reasons))
    answers = valid.filter(pc.and_(pc.is_valid(valid.column("check_id")), pc.invert(operators_decisions(valid.column("check_id")))))
    check_answers = Counter({count["values"]: count["counts"]
                             for count in pc.value_counts(answers.column("state")).to_pylist()})
    rejections = [rejection(row, row["reason"])
                  for row in ends.append_column("reason", reasons).filter(refused).to_pylist()]

    decisions = valid.filter(pc.is_in(valid.column("state"), value_set=_DECIDING))
    decisions = decisions.sort_by([("sequence", "ascending"), ("record_id", "ascending")])
    decisions = decisions.append_column("order", pa.array(range(decisions.num_rows), pa.int64()))
    firsts = grouped(decisions, "transaction_id").aggregate([("order", "min")])
    first = pc.is_in(decisions.column("order"), value_set=firsts.column("order_min"))
    rejections += [rejection(row, ALREADY_RESOLVED) for row in decisions.filter(pc.invert(first)).to_pylist()]
    winners = decisions.filter(first)
    outcome = pc.if_else(pc.equal(winners.column("state"), LocalTransactionState.COMMIT_MESSAGE.value),
                         Outcome.COMMIT.value, Outcome.ROLLBACK.value)
    winners = winners.append_column("outcome", outcome)
    waited = pc.max_element_wise(pc.subtract(winners.column("stored_us"), winners.column("half_stored_us")), 0)
    decided = pa.table({"transaction_id": winners.column("transaction_id"), "producer_group": winners.column("owner"),
                        "outcome": outcome, "in_batch": winners.column("in_batch")}, schema=_DECIDED_SCHEMA)
    return Resolved(_ops(winners, new_halves, memory), decided, rejections, ends.filter(recover).to_pylist(),
                    check_answers, pc.divide(pc.cast(waited, pa.float64()), 1e6))


def _targets(ends: pa.Table, new_halves: pa.Table, memory: CheckerMemory, known: Mapping[str, Known]) -> pa.Table:
    """Per transaction an END names: who owns it, whether it is pending, whether its halves came in this
    batch, and what judging the END needs (its halves' sequence, when they were stored, until when its
    producer's own END is accepted)."""
    new = transaction_bounds(new_halves)
    in_batch = pa.table({
        "transaction_id": new.column("transaction_id"), "owner": new.column("producer_group"),
        "pending": pa.repeat(True, new.num_rows), "in_batch": pa.repeat(True, new.num_rows),
        "half_sequence": new.column("half_sequence"), "half_stored_us": new.column("stored_us"),
        "own_end_until_us": new.column("own_end_until_us"),
    }, schema=_TARGET_SCHEMA)
    named = pc.unique(ends.column("transaction_id")).drop_null()
    earlier = []
    for transaction_id in named.filter(pc.invert(pc.is_in(named, value_set=in_batch.column("transaction_id")))).to_pylist():
        pending = memory.pending.get(transaction_id)
        if pending is not None and pending.withheld is None:  # withheld: committed already
            earlier.append((transaction_id, pending.producer_group, True, False, pending.half_sequence,
                            pending.stored_us, pending.own_end_until_us))
        elif transaction_id in known:
            earlier.append((transaction_id, known[transaction_id].producer_group, False, False, None, None, None))
    columns = [list(values) for values in zip(*earlier)] or [[] for _ in _TARGET_SCHEMA]
    return pa.concat_tables([in_batch, pa.table(dict(zip(_TARGET_SCHEMA.names, columns)), schema=_TARGET_SCHEMA)])


def _end_rules(ends: pa.Table) -> list[tuple[pa.Array, object]]:
    """The END rules, in order, each a mask over ``ends`` (joined to their targets) with its reason."""
    state, pending = ends.column("state"), ends.column("pending")
    unknown_state = pc.binary_join_element_wise("unknown state '", pc.fill_null(state, "null"), "'", "")
    deciding = pc.fill_null(pc.is_in(state, value_set=_DECIDING), False)
    return [
        (pc.is_null(ends.column("record_id")), "missing record_id"),
        (pc.is_null(ends.column("transaction_id")), "missing transaction_id"),
        (pc.invert(pc.fill_null(pc.is_in(state, value_set=_STATES), False)), unknown_state),
        (pc.is_null(ends.column("owner")), "unknown transaction"),
        (pc.fill_null(pc.not_equal(ends.column("producer_group"), ends.column("owner")), True),
         "producer group does not own the transaction"),
        (pc.and_(pending, pc.less_equal(ends.column("sequence"), ends.column("half_sequence"))), "end precedes its half"),
        (pc.invert(pending), ALREADY_RESOLVED),
        (pc.and_(pc.and_(deciding, pc.is_null(ends.column("check_id"))),
                 pc.greater(ends.column("stored_us"), ends.column("own_end_until_us"))), WAIT_FOR_CHECK),
    ]


def _ops(winners: pa.Table, new_halves: pa.Table, memory: CheckerMemory) -> pa.Table:
    """One op row per half of each winning END's transaction (with the half's topic), in deciding order."""
    here = winners.filter(winners.column("in_batch")).select(
        ["transaction_id", "owner", "outcome", "stored_us", "record_id", "check_id", "order"])
    decision = pc.index_in(new_halves.column("transaction_id"), value_set=here.column("transaction_id"))
    halves = new_halves.select(["queue_offset", "transaction_id", "topic"]).filter(pc.is_valid(decision))
    decided = here.take(decision.filter(pc.is_valid(decision)))
    in_batch = pa.table({"half_offset": halves.column("queue_offset"), "transaction_id": halves.column("transaction_id"),
                         "producer_group": decided.column("owner"), "outcome": decided.column("outcome"),
                         "resolved_at": decided.column("stored_us"), "end_record_id": decided.column("record_id"),
                         "check_id": decided.column("check_id"), "topic": halves.column("topic"),
                         "order": decided.column("order")}, schema=_OPS_SCHEMA)
    earlier = []
    for row in winners.filter(pc.invert(winners.column("in_batch"))).to_pylist():
        pending = memory.pending[row["transaction_id"]]
        earlier.extend((offset, pending.transaction_id, pending.producer_group, row["outcome"], row["stored_us"],
                        row["record_id"], row["check_id"], topic, row["order"])
                       for offset, topic in zip(pending.offsets, pending.topics))
    columns = [list(values) for values in zip(*earlier)] or [[] for _ in _OPS_SCHEMA]
    earlier_ops = pa.table(dict(zip(_OPS_SCHEMA.names, columns)), schema=_OPS_SCHEMA)
    return pa.concat_tables([in_batch, earlier_ops]).sort_by([("order", "ascending"), ("half_offset", "ascending")])


def promote(resolved: Resolved, new_halves: pa.Table, memory: CheckerMemory) -> pa.Table:
    """The topic rows (less ``batch_id``) of this batch's committed transactions, each message once, in
    queue-offset order: halves of this batch from ``new_halves``, earlier ones from the checker's memory.

    Example::

        deliveries = promote(resolved, ingested.halves, memory)
        deliveries.column("topic")
    """
    committed = resolved.ops.filter(pc.equal(resolved.ops.column("outcome"), Outcome.COMMIT.value))
    offsets = committed.column("half_offset")
    earlier = pc.is_in(committed.column("transaction_id"), value_set=pa.array(resolved.ids(in_batch=False), pa.string()))
    halves = new_halves.filter(pc.is_in(new_halves.column("queue_offset"), value_set=offsets))  # in queue-offset order
    if pc.any(earlier).as_py():
        halves = pa.concat_tables([halves, memory.rows.take(offsets.filter(earlier).to_pylist())]).sort_by("queue_offset")
    commit_times = committed.column("resolved_at").take(pc.index_in(halves.column("queue_offset"), value_set=offsets))
    return halves.select(["transaction_id", *MESSAGE_FIELDS, "queue_offset"]).append_column(
        "commit_timestamp", commit_times.cast(halves.schema.field("born_timestamp").type))
