"""Step 2 — resolve and promote: validate END records, decide op rows, deliver commits to topics."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from coordinator.checker.context import MESSAGE_FIELDS
from coordinator.checker.ingest import END_KIND
from coordinator.checker.refusals import as_rejections, first_failure
from coordinator.listener import LocalTransactionState

COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
DISCARD = "DISCARD"

_OUTCOME_OF_STATE = {
    LocalTransactionState.COMMIT_MESSAGE.value: COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE.value: ROLLBACK,
}
_STATES = [state.value for state in LocalTransactionState]
WAIT_FOR_CHECK = "arrived after the immunity time: wait for check"


def resolve_ends(records: DataFrame, halves: DataFrame, resolved_before: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Validate this batch's END records (DESIGN §2 rule 8) and turn the first valid one per
    transaction into op rows, one per half message. Returns ``(ops, rejections)``.

    ``halves`` holds every half (earlier batches' and this one's) of the batch's
    transactions; ``resolved_before`` the ids of those already resolved by an earlier batch.

    ``UNKNOW`` ends are valid and change nothing. A producer's own COMMIT or ROLLBACK
    that entered the commit log after the half's immunity time is refused ("wait for
    check"): judged by commit-log time, so checker downtime never refuses anything.

    Example::

        earlier = ctx.earlier(records.select("transaction_id"))
        ops, rejected = resolve_ends(records, earlier.halves.unionByName(new_halves), earlier.resolved)
    """
    ends = records.filter(F.col("kind") == END_KIND)
    txns = halves.groupBy("transaction_id").agg(
        F.first("producer_group").alias("half_group"),
        F.min("stored_timestamp").alias("half_stored"),
        F.max("commit_version").alias("half_version"),
        F.max("immunity_ms").alias("immunity_ms"),
    )
    resolved_before = resolved_before.withColumn("resolved_before", F.lit(True))
    ends = ends.join(txns, "transaction_id", "left").join(resolved_before, "transaction_id", "left")
    immunity_end_us = F.unix_micros("half_stored") + F.col("immunity_ms") * 1000
    is_decision = F.col("state").isin(*_OUTCOME_OF_STATE)
    ends = ends.withColumn(
        "reason",
        first_failure(
            [
                (F.col("record_id").isNull(), "missing record_id"),
                (F.col("transaction_id").isNull(), "missing transaction_id"),
                (~F.col("state").isin(*_STATES), F.format_string("unknown state '%s'", F.coalesce("state", F.lit("null")))),
                (F.col("half_group").isNull(), "unknown transaction"),
                (F.col("producer_group").isNull() | (F.col("producer_group") != F.col("half_group")), "producer group does not own the transaction"),
                (F.col("commit_version") <= F.col("half_version"), "end precedes its half"),
                (F.col("resolved_before").isNotNull(), "transaction already resolved"),
                (is_decision & F.col("check_id").isNull() & (F.unix_micros("stored_timestamp") > immunity_end_us), WAIT_FOR_CHECK),
            ]
        ),
    )
    ends = ends.localCheckpoint(eager=True)
    first_decision = F.row_number().over(Window.partitionBy("transaction_id").orderBy("commit_version", "record_id"))
    decisions = ends.filter(F.col("reason").isNull() & is_decision).withColumn("rank", first_decision)
    later_decisions = decisions.filter(F.col("rank") > 1).withColumn("reason", F.lit("transaction already resolved"))
    winners = decisions.filter(F.col("rank") == 1)
    outcome = F.create_map(*[F.lit(x) for pair in _OUTCOME_OF_STATE.items() for x in pair])[F.col("state")]
    ops = winners.select(
        "transaction_id",
        outcome.alias("outcome"),
        F.col("stored_timestamp").alias("resolved_at"),
        F.col("record_id").alias("end_record_id"),
        "check_id",
    ).join(halves.select("transaction_id", F.col("queue_offset").alias("half_offset"), "producer_group"), "transaction_id")
    rejected = as_rejections(ends.filter(F.col("reason").isNotNull()).drop("rank")).unionByName(
        as_rejections(later_decisions.drop("rank"))
    )
    return ops, rejected


def promote(ops: DataFrame, halves: DataFrame) -> DataFrame:
    """The topic rows of this batch's committed transactions, each message once.

    ``halves`` holds (at least) every half of the transactions ``ops`` commits.

    Example::

        deliveries = promote(ops, halves)
    """
    committed = ops.filter(F.col("outcome") == COMMIT)
    return halves.join(
        committed.select(F.col("half_offset").alias("queue_offset"), F.col("resolved_at").alias("commit_timestamp")),
        "queue_offset",
    ).select(
        "transaction_id",
        *MESSAGE_FIELDS,
        "commit_timestamp",
        "queue_offset",
    )
