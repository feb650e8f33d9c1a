"""Step 1 — ingest: validate new HALF records and give each accepted half its queue offset."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from coordinator.checker.context import BatchContext
from coordinator.checker.refusals import as_rejections, first_failure
from coordinator.message import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    DELAY_PROPERTIES,
    IMMUNITY_DIGITS,
    MAX_BODY_BYTES,
    MAX_IMMUNITY_SECONDS,
    TOPIC_CHARACTERS,
    TOPIC_MAX_LENGTH,
    TOPIC_PATTERN,
)

HALF_KIND = "HALF"
END_KIND = "END"

#: A queue offset is ``commit_version * OFFSETS_PER_COMMIT + position in that commit``:
#: unique, increasing in commit-log order, and the same every time a batch is replayed.
OFFSETS_PER_COMMIT = 1 << 20


def refuse_unknown_kinds(records: DataFrame) -> DataFrame:
    """Records that are neither HALF nor END, as rejections."""
    unknown = records.filter(~F.coalesce(F.col("kind").isin(HALF_KIND, END_KIND), F.lit(False)))
    return as_rejections(unknown.withColumn("reason", F.format_string("unknown record kind '%s'", F.coalesce("kind", F.lit("null")))))


def ingest_halves(ctx: BatchContext, records: DataFrame, earlier_halves: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Split this batch's HALF records into accepted halves (``system/half`` rows) and rejections.

    A transaction is all-or-nothing: if one of its messages is refused, all are.
    A transaction id already ingested by an earlier batch (one in ``earlier_halves``)
    or commit is refused as a duplicate.

    Example::

        halves, rejected = ingest_halves(ctx, records, ctx.earlier(records.select("transaction_id")).halves)
    """
    halves = records.filter(F.col("kind") == HALF_KIND)
    position = F.row_number().over(Window.partitionBy("commit_version").orderBy("record_id", "transaction_id", "message_index")) - 1
    halves = halves.withColumn("position", position).withColumn(
        "queue_offset", F.col("commit_version") * OFFSETS_PER_COMMIT + F.col("position")
    )
    immunity = F.col("properties").getItem(CHECK_IMMUNITY_TIME_IN_SECONDS)
    body_size = F.length("body")
    halves = halves.withColumn(
        "reason",
        first_failure(
            [
                (F.col("record_id").isNull(), "missing record_id"),
                (_blank("transaction_id"), "missing transaction_id"),
                (_blank("producer_group"), "missing producer_group"),
                (_blank("msg_id"), "missing msg_id"),
                (_blank("topic"), "missing topic"),
                (F.length("topic") > TOPIC_MAX_LENGTH, f"topic longer than {TOPIC_MAX_LENGTH} characters"),
                # \z, Java's very end of input: its $ would let a trailing newline through.
                (~F.col("topic").rlike(rf"^[{TOPIC_CHARACTERS}]+\z"), f"topic does not match {TOPIC_PATTERN}"),
                (F.col("body").isNull() | (body_size == 0), "empty body"),
                (body_size > MAX_BODY_BYTES, f"body larger than {MAX_BODY_BYTES} bytes"),
                (
                    F.col("message_count").isNull() | (F.col("message_count") < 1)
                    | F.col("message_index").isNull() | (F.col("message_index") < 0)
                    | (F.col("message_index") >= F.col("message_count")),
                    "bad message_index/message_count",
                ),
                (
                    immunity.isNotNull() & ~F.coalesce(
                        immunity.rlike(rf"^{IMMUNITY_DIGITS}\z") & (immunity.cast("long").between(1, MAX_IMMUNITY_SECONDS)), F.lit(False)
                    ),
                    f"bad {CHECK_IMMUNITY_TIME_IN_SECONDS}",
                ),
                (F.col("position") >= OFFSETS_PER_COMMIT, f"more than {OFFSETS_PER_COMMIT} records in one commit"),
            ]
        ),
    )
    # Materialised once: both the accepted halves and the rejections are read from it.
    halves = _refuse_whole_transactions(halves, earlier_halves).localCheckpoint(eager=True)
    accepted = halves.filter(F.col("reason").isNull()).select(
        "queue_offset",
        "transaction_id",
        "producer_group",
        "msg_id",
        "message_index",
        "message_count",
        "topic",
        "keys",
        "tags",
        F.map_filter("properties", lambda key, _: ~key.isin(*DELAY_PROPERTIES)).alias("properties"),
        "body",
        "born_timestamp",
        "stored_timestamp",
        F.coalesce(immunity.cast("long") * 1000, F.lit(ctx.config.transaction_timeout_ms)).alias("immunity_ms"),
        "commit_version",
    )
    return accepted, as_rejections(halves.filter(F.col("reason").isNotNull()))


def _blank(name: str):
    return F.col(name).isNull() | (F.trim(F.col(name)) == "")


def _refuse_whole_transactions(halves: DataFrame, earlier_halves: DataFrame) -> DataFrame:
    """Apply the transaction-level rules: one commit, one group, every message present, a new id."""
    by_txn = Window.partitionBy("transaction_id")
    first_version = F.min("commit_version").over(by_txn)
    halves = halves.withColumn(
        "reason",
        F.coalesce(
            "reason",
            F.when(F.col("commit_version") > first_version, F.lit("duplicate transaction_id")),
        ),
    )
    seen_before = earlier_halves.select("transaction_id").distinct().withColumn("seen_before", F.lit(True))
    halves = halves.join(seen_before, "transaction_id", "left")
    same_commit = Window.partitionBy("transaction_id", "commit_version")
    halves = halves.withColumn(
        "reason",
        F.coalesce(
            "reason",
            F.when(F.col("seen_before"), F.lit("duplicate transaction_id")),
            F.when(
                (F.count(F.lit(1)).over(same_commit) != F.max("message_count").over(same_commit))
                | (F.size(F.collect_set("message_index").over(same_commit)) != F.max("message_count").over(same_commit))
                | (F.min("message_count").over(same_commit) != F.max("message_count").over(same_commit)),
                F.lit("transaction's messages incomplete or inconsistent"),
            ),
            F.when(
                F.min("producer_group").over(same_commit) != F.max("producer_group").over(same_commit),
                F.lit("transaction's messages name different producer groups"),
            ),
        ),
    )
    refused_in_txn = F.max(F.col("reason").isNotNull().cast("int")).over(same_commit) == 1
    return halves.withColumn(
        "reason",
        F.coalesce("reason", F.when(refused_in_txn, F.lit("another message of the transaction was refused"))),
    ).drop("seen_before")
