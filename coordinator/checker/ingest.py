"""Ingest, a step of a batch's *decide* phase (docs/design.md#a-batchs-steps): validate new HALF records and
give each accepted half its queue offset.

Computed over the batch's columns: each rule is a mask (:mod:`coordinator.validation` for the
message rules, the transaction rules here), numbering is a sort, a transaction's messages are a
group; only the refused records become Python rows (their ``system/rejected`` rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker.context import OFFSETS_PER_COMMIT, BatchContext, BatchRecords, grouped, kept, shaped
from coordinator.checker.refusals import rejection
from coordinator.checker.memory import Known
from coordinator.grants import TopicGrants
from coordinator.protocol import DELAY_PROPERTIES, RecordKind
from coordinator.tables import HALF
from coordinator.validation import first_reasons, immunity_values, message_refusals

_KINDS = pa.array([kind.value for kind in RecordKind])
_TOO_MANY = f"more than {OFFSETS_PER_COMMIT} records in one commit"


@dataclass(frozen=True)
class Ingested:
    """The halves a batch accepted (``system/half`` rows, in queue-offset order) and the HALF records it
    refused (``system/rejected`` rows)."""

    halves: pa.Table
    rejections: list[dict]


def refuse_unknown_kinds(records: BatchRecords) -> list[dict]:
    """Records that are neither HALF nor END, as rejections."""
    kinds = records.light.column("kind")
    unknown = records.light.filter(pc.invert(pc.fill_null(pc.is_in(kinds, value_set=_KINDS), False)))
    return [rejection(r, f"unknown record kind '{r['kind'] if r['kind'] is not None else 'null'}'")
            for r in unknown.to_pylist()]


def ingest_halves(ctx: BatchContext, records: BatchRecords, known: Mapping[str, Known]) -> Ingested:
    """Split this batch's HALF records into accepted halves and rejections.

    A transaction is all-or-nothing: if one of its messages is refused (a message for a topic its
    group is not granted, for one), all are.
    A transaction id already ingested by an earlier batch (one in ``known``) or
    commit is refused as a duplicate.

    Example::

        ingested = ingest_halves(ctx, records, known)
        ingested.halves.num_rows, len(ingested.rejections)
    """
    halves = records.light.filter(pc.equal(records.light.column("kind"), RecordKind.HALF.value))
    if not halves.num_rows:  # the rules' groupings and joins cost milliseconds even over no rows
        return Ingested(shaped(HALF, {}, 0, ctx.batch_id), [])
    halves = _numbered(halves)
    too_many = pc.greater_equal(halves.column("position"), OFFSETS_PER_COMMIT)
    reasons = pc.coalesce(message_refusals(halves), first_reasons([(too_many, _TOO_MANY)], halves.num_rows))
    reasons = _grant_refusals(TopicGrants(ctx.config.topic_grants), halves, reasons)
    reasons = _transaction_refusals(halves, reasons, known)
    accepted = pc.is_null(reasons)
    table = _half_rows(ctx, records, kept(halves, accepted))
    refused = halves.append_column("reason", reasons).filter(pc.invert(accepted)).sort_by("row")
    return Ingested(table, [rejection(r, r["reason"]) for r in refused.to_pylist()])


def _numbered(halves: pa.Table) -> pa.Table:
    """``halves`` (one or more) in queue-offset order, with each one's ``position`` in its commit and
    ``queue_offset`` (see :mod:`.context`): within a commit, by record id, transaction id and message
    index, nulls first as in SQL, ties in the order written."""
    halves = halves.take(pc.sort_indices(halves, [(name, "ascending", "at_start") for name in
                                                 ("sequence", "record_id", "transaction_id", "message_index")]))
    sequence = halves.column("sequence").combine_chunks()
    commits = pc.run_end_encode(sequence, run_end_type=pa.int64())
    firsts = pa.concat_arrays([pa.array([0], pa.int64()), commits.run_ends[:-1]])
    first_of_commit = pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(commits.run_ends, firsts))
    position = pc.subtract(pa.array(range(halves.num_rows), pa.int64()), first_of_commit)
    return (halves.append_column("position", position)
            .append_column("queue_offset", pc.add(pc.multiply(sequence, OFFSETS_PER_COMMIT), position)))


def _grant_refusals(grants: TopicGrants, halves: pa.Table, reasons: pa.Array) -> pa.Array:
    """``reasons``, with the grants' refusal for each record not refused yet whose group may not publish to its topic."""
    unrefused = kept(halves.select(["producer_group", "topic"]), pc.is_null(reasons))
    for pair in grouped(unrefused, ["producer_group", "topic"]).aggregate([]).to_pylist():
        refusal = grants.refusal(pair["producer_group"], pair["topic"])
        if refusal is not None:
            hit = pc.and_(pc.equal(halves.column("producer_group"), pair["producer_group"]),
                          pc.equal(halves.column("topic"), pair["topic"]))
            reasons = pc.coalesce(reasons, first_reasons([(hit, refusal)], halves.num_rows))
    return reasons


def _transaction_refusals(halves: pa.Table, reasons: pa.Array, known: Mapping[str, Known]) -> pa.Array:
    """``reasons``, with the transaction-level rules applied: one commit, one group, every message present,
    a new id; then every message of a transaction (in one commit) with a refused one is refused too."""
    keyed = pa.table({"i": pa.array(range(halves.num_rows), pa.int64()),
                      **{name: halves.column(name) for name in ("transaction_id", "sequence", "message_index",
                                                                "message_count", "producer_group")}})
    named = kept(keyed, pc.is_valid(keyed.column("transaction_id")))
    firsts = grouped(named, "transaction_id").aggregate([("sequence", "min")])
    commits = grouped(named, ["transaction_id", "sequence"]).aggregate([
        ("i", "count"), ("message_index", "count_distinct"), ("message_count", "max"), ("message_count", "min"),
        ("producer_group", "min"), ("producer_group", "max")])
    joined = keyed.join(commits, ["transaction_id", "sequence"], join_type="left outer").sort_by("i")
    first_sequence = firsts.column("sequence_min").take(pc.index_in(joined.column("transaction_id"),
                                                                    value_set=firsts.column("transaction_id")))
    expected = joined.column("message_count_max")
    duplicate = pc.or_(pc.greater(joined.column("sequence"), first_sequence),
                       pc.is_in(joined.column("transaction_id"), value_set=pa.array(list(known), pa.string())))
    incomplete = pc.and_(pc.is_valid(expected), pc.or_(pc.or_(
        pc.not_equal(joined.column("i_count"), expected), pc.not_equal(joined.column("message_index_count_distinct"), expected)),
        pc.not_equal(joined.column("message_count_min"), expected)))
    mixed_groups = pc.not_equal(joined.column("producer_group_min"), joined.column("producer_group_max"))
    reasons = pc.coalesce(reasons, first_reasons([(duplicate, "duplicate transaction_id"),
                                                  (incomplete, "transaction's messages incomplete or inconsistent"),
                                                  (mixed_groups, "transaction's messages name different producer groups")],
                                                 halves.num_rows))
    if reasons.null_count == len(reasons):
        return reasons  # nothing refused: no transaction is spoilt
    refused = keyed.select(["i", "transaction_id", "sequence"]).append_column("refused", pc.is_valid(reasons))
    spoilt = grouped(refused.filter(pc.is_valid(refused.column("transaction_id"))),
                     ["transaction_id", "sequence"]).aggregate([("refused", "any")])
    spoilt = refused.join(spoilt, ["transaction_id", "sequence"], join_type="left outer").sort_by("i")
    return pc.coalesce(reasons, first_reasons([(spoilt.column("refused_any"), "another message of the transaction was refused")],
                                              halves.num_rows))


def _half_rows(ctx: BatchContext, records: BatchRecords, accepted: pa.Table) -> pa.Table:
    """The accepted halves (in queue-offset order) as ``system/half`` rows."""
    taken = records.table.take(accepted.column("row"))
    columns = {name: taken.column(name) for name in HALF.column_names if name in taken.column_names}
    immunity_s = immunity_values(accepted.column("properties").combine_chunks()).cast(pa.int64())
    columns.update(
        queue_offset=accepted.column("queue_offset"),
        properties=_without_delays(taken.column("properties").combine_chunks()),
        immunity_ms=pc.fill_null(pc.multiply(immunity_s, 1000), ctx.config.transaction_timeout_ms),
    )
    return shaped(HALF, columns, accepted.num_rows, ctx.batch_id)


def _without_delays(properties: pa.MapArray) -> pa.Array:
    """``properties`` less the delay properties, which transactional messages do not support (cleared as RocketMQ does)."""
    if not pc.any(pc.is_in(properties.keys, value_set=pa.array(DELAY_PROPERTIES))).as_py():
        return properties
    return pa.array([None if entries is None else [(k, v) for k, v in entries if k not in DELAY_PROPERTIES]
                     for entries in properties.to_pylist()], properties.type)
