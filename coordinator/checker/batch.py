"""One checker micro-batch: ingest, resolve, check, then write everything once.

Every decision is computed first, from this batch's records and what earlier
batches wrote; only then are the tables written, each in one idempotent append.
A crash between two writes is repaired by Spark replaying the batch: the
decisions come out the same and the writes already made are skipped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coordinator.checker.check import find_due
from coordinator.checker.context import BatchContext
from coordinator.checker.ingest import OFFSETS_PER_COMMIT, ingest_halves, refuse_unknown_kinds
from coordinator.checker.resolve import COMMIT, ROLLBACK, promote, resolve_ends
from coordinator.config import CoordinatorConfig
from coordinator.tables import CHECK_REQUESTS, DISCARDED, HALF, OP, REJECTED, TOPIC, TableDef, topic_path

log = logging.getLogger("coordinator.checker")

#: ``txnAppId`` of the checker's writes; stable across restarts (DESIGN §8).
DEFAULT_APP_ID = "txcoord-checker"


@dataclass(frozen=True)
class BatchSummary:
    """What one batch did, for logs, tests and metrics."""

    batch_id: int
    records: int = 0
    halves: int = 0
    commits: int = 0
    rollbacks: int = 0
    resolved: int = 0  # op rows written: halves committed, rolled back or discarded
    delivered: int = 0
    checks: int = 0
    discarded: int = 0
    rejected: int = 0
    pending: int = 0  # halves still unresolved after this batch
    pending_from: int = 0  # the next batch's ``pending_from``: no unresolved half lies below it
    duration_ms: int = 0


@dataclass(frozen=True)
class BatchBounds:
    """The commit-log versions a batch read (``None`` if only heartbeat ticks) and its clock."""

    first_version: Optional[int]
    last_version: Optional[int]
    now_us: int


def batch_bounds(records: DataFrame) -> Optional[BatchBounds]:
    """The bounds of a batch of records, or ``None`` for an empty batch.

    The clock is the latest commit or tick time among the batch's own rows, never
    the wall clock, so a replayed batch decides exactly as the first run did.

    Example::

        batch_bounds(records)  # BatchBounds(first_version=3, last_version=5, now_us=...)
    """
    first, last, now_us = records.agg(
        F.min("commit_version"), F.max("commit_version"), F.max(F.unix_micros("stored_timestamp"))
    ).first()
    return None if now_us is None else BatchBounds(first, last, now_us)


def run_batch(
    spark: SparkSession,
    config: CoordinatorConfig,
    records: DataFrame,
    batch_id: int,
    app_id: str = DEFAULT_APP_ID,
    bounds: Optional[BatchBounds] = None,
    pending_from: int = 0,
) -> Optional[BatchSummary]:
    """Process one micro-batch of commit-log records (plus heartbeat ticks).

    ``records`` has the commit-log columns plus ``commit_version``,
    ``stored_timestamp`` and ``is_heartbeat``; ``bounds`` are its
    :func:`batch_bounds`, computed here unless given (a replay from the progress
    record gives them). ``pending_from`` is the previous batch's
    ``BatchSummary.pending_from`` (0, the default, looks through the whole half
    queue). Returns ``None`` for an empty batch.

    Example::

        query = stream.writeStream.foreachBatch(lambda df, i: run_batch(spark, config, df, i)).start()
    """
    started = time.monotonic()
    records = records.persist()
    try:
        bounds = bounds or batch_bounds(records)
        if bounds is None:
            return None
        ctx = BatchContext(spark=spark, config=config, batch_id=batch_id, now_us=bounds.now_us, app_id=app_id,
                           pending_from=pending_from)
        next_offset = pending_from if bounds.last_version is None else (bounds.last_version + 1) * OFFSETS_PER_COMMIT
        # Only commit-log rows carry a version: a batch without one holds nothing but heartbeat ticks.
        has_records = bounds.last_version is not None
        summary = _decide_and_write(ctx, records.filter(~F.col("is_heartbeat")), has_records, next_offset)
        summary = replace(summary, duration_ms=int((time.monotonic() - started) * 1000))
        log.info("batch %d: %s", batch_id, ", ".join(f"{k}={v}" for k, v in asdict(summary).items() if k != "batch_id"))
        return summary
    finally:
        records.unpersist()


def _decide_and_write(ctx: BatchContext, records: DataFrame, has_records: bool, next_offset: int) -> BatchSummary:
    # Results read more than once are materialised with their lineage cut: writing a DataFrame
    # whose plan still reads the checker's own Delta tables costs far more than the data it holds.
    # Each Spark job costs a batch about a tenth of a second here, so counts are taken once.
    if has_records:
        record_count = records.count()
        earlier = ctx.earlier(records.select("transaction_id"))
        new_halves, half_rejections = ingest_halves(ctx, records, earlier.halves)
        halves = earlier.halves.unionByName(new_halves)
        ops, end_rejections = resolve_ends(records, halves, earlier.resolved)
        ops = ops.localCheckpoint(eager=True)
        rejected = refuse_unknown_kinds(records).unionByName(half_rejections).unionByName(end_rejections)
        half_count, rejected_count = new_halves.count(), rejected.count()
        outcomes = {outcome: (transactions, rows) for outcome, transactions, rows in ops.groupBy("outcome").agg(
            F.countDistinct("transaction_id"), F.count(F.lit(1))).collect()}
    else:  # a heartbeat-only batch: nothing to ingest or resolve, only checks to make
        new_halves = halves = _empty(ctx, HALF)
        ops = _empty(ctx, OP)
        record_count = half_count = rejected_count = 0
        outcomes = {}
    due = find_due(ctx, new_halves, ops, next_offset)
    deliveries = promote(ops, halves).localCheckpoint(eager=True) if COMMIT in outcomes else None
    per_topic = dict(deliveries.groupBy("topic").count().collect()) if deliveries is not None else {}
    op_count = sum(rows for _, rows in outcomes.values()) + due.discards
    # Order matters only for readers' convenience: a half is in system/half before its
    # op, and an op before its topic rows. Correctness under replay does not rely on it.
    if half_count:
        ctx.append(new_halves, HALF)
    if op_count:
        ctx.append(ops.unionByName(due.discard_ops) if due.discards else ops, OP)
    for topic in sorted(per_topic):
        ctx.append(deliveries.filter(F.col("topic") == topic), TOPIC, topic_path(ctx.config.lakehouse, topic))
    if due.discards:
        ctx.append(due.discarded, DISCARDED)
    if due.checks:
        ctx.append(due.requests, CHECK_REQUESTS)
    if rejected_count:
        ctx.append(rejected, REJECTED)
    return BatchSummary(
        batch_id=ctx.batch_id,
        records=record_count,
        halves=half_count,
        commits=outcomes.get(COMMIT, (0, 0))[0],
        rollbacks=outcomes.get(ROLLBACK, (0, 0))[0],
        resolved=op_count,
        delivered=sum(per_topic.values()),
        checks=due.checks,
        discarded=due.discards,
        rejected=rejected_count,
        pending=due.pending,
        pending_from=due.pending_from,
    )


def _empty(ctx: BatchContext, table: TableDef) -> DataFrame:
    """No rows, with ``table``'s columns less ``batch_id`` (as the steps produce them)."""
    columns = ", ".join(f"`{name}` {kind}" for name, kind in table.columns if name != "batch_id")
    return ctx.spark.createDataFrame([], columns)
