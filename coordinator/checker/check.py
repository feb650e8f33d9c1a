"""Step 3 — check: find unresolved halves that are due, ask their producer group, or give up.

The pending set is the half queue anti-joined with the op queue on the half
queue offset. Per transaction: a first check once the immunity time has passed
since the half entered the commit log, then one every
``transaction_check_interval_ms``; after ``transaction_check_max`` checks, or once
older than ``file_reserved_time_hours``, the transaction is discarded (and that
counts as resolved: an op row with outcome ``DISCARD``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from coordinator.checker.context import MESSAGE_FIELDS, BatchContext
from coordinator.checker.resolve import DISCARD
from coordinator.tables import CHECK_REQUESTS, HALF, OP

EXPIRED = "expired: older than file_reserved_time_hours"


@dataclass(frozen=True)
class Due:
    """What the check step decided, and where the next batch may start looking for pending halves."""

    requests: DataFrame  # check_requests rows
    discarded: DataFrame  # discarded rows, one per message
    discard_ops: DataFrame  # the op rows of the discarded halves
    checks: int  # rows in requests
    discards: int  # rows in discarded (and in discard_ops)
    pending: int  # halves still unresolved after this batch
    pending_from: int  # no unresolved half has a lower queue offset


def pending_halves(ctx: BatchContext, new_halves: DataFrame, new_ops: DataFrame) -> DataFrame:
    """Halves with no op row, counting this batch's halves and ops.

    Only offsets from ``ctx.pending_from`` on are read: every half below it is resolved,
    and Delta skips the files holding only those (offsets grow with each append).
    """
    halves = ctx.read(HALF).filter(F.col("queue_offset") >= ctx.pending_from).drop("batch_id").unionByName(new_halves)
    ops = ctx.read(OP).filter(F.col("half_offset") >= ctx.pending_from).select("half_offset")
    ops = ops.unionByName(new_ops.select("half_offset"))
    return halves.join(ops, halves.queue_offset == ops.half_offset, "left_anti")


def check_history(ctx: BatchContext, transactions: DataFrame) -> DataFrame:
    """Per transaction in ``transactions``: the checks requested so far and when the last one was.

    The interval runs from when the last request became visible to producers (its data
    file was written at the end of that batch), not from the batch clock it carries: a
    slow batch must not eat into the time a producer has to answer.
    """
    return (
        ctx.read(CHECK_REQUESTS)
        .filter(F.col("half_offset") >= ctx.pending_from)
        .select("transaction_id", F.col("_metadata.file_modification_time").alias("written_at"))
        .join(transactions.select("transaction_id"), "transaction_id", "left_semi")
        .groupBy("transaction_id")
        .agg(F.count(F.lit(1)).cast("int").alias("checks_so_far"), F.max("written_at").alias("last_check"))
    )


def find_due(ctx: BatchContext, new_halves: DataFrame, new_ops: DataFrame, next_offset: int) -> Due:
    """Decide, for every pending transaction, whether to check it, discard it, or wait.

    ``next_offset`` is the lowest queue offset a later half can get (the first after
    this batch's commit-log versions): the next ``pending_from`` when nothing is pending.

    Example::

        due = find_due(ctx, new_halves, ops, next_offset)
        due.checks, due.requests
    """
    config = ctx.config
    # Materialised once: the decisions, the discards and the next lower bound all come from it.
    pending = pending_halves(ctx, new_halves, new_ops).localCheckpoint(eager=True)
    now_us = F.lit(ctx.now_us)
    stored_us = F.unix_micros("stored_timestamp")
    expired = now_us > stored_us + F.lit(config.file_reserved_time_hours * 3_600_000_000)
    # Only a transaction past its immunity time can have been checked or be due; the rest wait,
    # and a batch where every pending transaction waits reads no check history at all.
    immunity_passed = now_us >= stored_us + F.col("immunity_ms") * 1000
    is_candidate = (F.col("message_index") == 0) & (expired | immunity_passed)
    pending_count, lowest, candidate_count = pending.agg(
        F.count(F.lit(1)), F.min("queue_offset"), F.count(F.when(is_candidate, True))
    ).first()
    candidates = pending.filter(is_candidate)
    if candidate_count:
        history = check_history(ctx, candidates)
    else:
        history = ctx.spark.createDataFrame([], "transaction_id string, checks_so_far int, last_check timestamp")
    checks_so_far = F.coalesce("checks_so_far", F.lit(0))
    interval_passed = now_us >= F.unix_micros("last_check") + F.lit(config.transaction_check_interval_ms * 1000)
    due = F.when(F.col("last_check").isNull(), immunity_passed).otherwise(interval_passed)
    decided = (
        candidates.join(history, "transaction_id", "left")
        .withColumn("checks_so_far", checks_so_far)
        .withColumn(
            "decision",
            F.when(expired, F.lit(EXPIRED))
            .when(due & (checks_so_far >= config.transaction_check_max), F.format_string("checked %d times without an answer", checks_so_far))
            .when(due, F.lit("check")),
        )
        .filter(F.col("decision").isNotNull())
    )
    if candidate_count:
        # Materialised once: the requests, the discards and their op rows all come from it.
        decided = decided.localCheckpoint(eager=True)
        checks, given_up_count = decided.agg(
            F.count(F.when(F.col("decision") == "check", True)), F.count(F.when(F.col("decision") != "check", True))
        ).first()
    else:
        checks = given_up_count = 0
    requests = decided.filter(F.col("decision") == "check").select(
        F.concat_ws("-", "transaction_id", (F.col("checks_so_far") + 1).cast("string")).alias("check_id"),
        "transaction_id",
        "producer_group",
        (F.col("checks_so_far") + 1).alias("check_times"),
        ctx.now.alias("requested_at"),
        F.col("queue_offset").alias("half_offset"),
        *MESSAGE_FIELDS,
    )
    given_up = decided.filter(F.col("decision") != "check").select(
        "transaction_id", F.col("decision").alias("reason"), F.col("checks_so_far").alias("check_times")
    )
    discarded = pending.join(given_up, "transaction_id").select(
        "transaction_id",
        "producer_group",
        F.col("queue_offset").alias("half_offset"),
        *MESSAGE_FIELDS,
        "stored_timestamp",
        "check_times",
        "reason",
        ctx.now.alias("discarded_at"),
    )
    discard_ops = discarded.select(
        "half_offset",
        "transaction_id",
        "producer_group",
        F.lit(DISCARD).alias("outcome"),
        F.col("discarded_at").alias("resolved_at"),
        F.lit(None).cast("string").alias("end_record_id"),
        F.lit(None).cast("string").alias("check_id"),
    )
    discards = 0
    if given_up_count:
        discards = discarded.count()
        pending_count, lowest = pending.join(given_up, "transaction_id", "left_anti").agg(
            F.count(F.lit(1)), F.min("queue_offset")
        ).first()
    return Due(requests, discarded, discard_ops, checks=checks, discards=discards, pending=pending_count,
               pending_from=lowest if lowest is not None else max(ctx.pending_from, next_offset))
