"""What every step of a checker batch shares: its id, its clock, and replay-safe table I/O."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from coordinator.config import CoordinatorConfig
from coordinator.tables import HALF, OP, TableDef

log = logging.getLogger("coordinator.checker")

_METADATA_CHANGED = "DELTA_METADATA_CHANGED"
_WRITE_ATTEMPTS = 10

#: Columns the checker adds to each commit-log record it reads.
RECORD_EXTRA_COLUMNS = (
    ("commit_version", "long"),  # the commit-log version the record entered with
    ("stored_timestamp", "timestamp"),  # when that version was committed
    ("is_heartbeat", "boolean"),  # a clock tick, not a record
)

#: A message's own fields, carried from the half queue into topics, check requests and discards.
MESSAGE_FIELDS = ("msg_id", "topic", "keys", "tags", "properties", "body", "born_timestamp")


@dataclass(frozen=True)
class EarlierRows:
    """Rows earlier batches wrote about one batch's transactions (see :meth:`BatchContext.earlier`)."""

    halves: DataFrame  # their system/half rows, without batch_id
    resolved: DataFrame  # the transaction_id of each of them that already has op rows


@dataclass(frozen=True)
class BatchContext:
    """One micro-batch: its id, its clock and the lakehouse it works on.

    ``now_us`` is read from the batch's own rows (heartbeat ticks and commit
    times), never from the wall clock, so a replayed batch decides exactly as
    the first run did. Reads of checker tables see only earlier batches
    (``batch_id < self.batch_id``) for the same reason, and every write carries
    ``txnAppId``/``txnVersion`` so Delta skips it when the batch is replayed.
    """

    spark: SparkSession
    config: CoordinatorConfig
    batch_id: int
    now_us: int
    app_id: str
    #: Every half below this queue offset is resolved (RocketMQ's half consume offset): the
    #: pending set is looked for from here, so its cost ignores resolved history.
    pending_from: int = 0

    @property
    def now(self) -> Column:
        """The batch clock as a timestamp column."""
        return F.timestamp_micros(F.lit(self.now_us))

    def path(self, table: TableDef) -> str:
        return table.path(self.config.lakehouse)

    def read(self, table: TableDef) -> DataFrame:
        """``table`` as earlier batches left it.

        Example::

            pending_before = ctx.read(HALF).join(ctx.read(OP), ..., "left_anti")
        """
        return self.spark.read.format("delta").load(self.path(table)).filter(F.col("batch_id") < self.batch_id)

    def earlier(self, transaction_ids: DataFrame) -> "EarlierRows":
        """What earlier batches wrote about the transactions in ``transaction_ids``: read once
        per batch, and shared by every step that needs it.

        Filters on the range of the ids first: producers' ids are time-ordered, so Delta's
        data skipping leaves out every file of older transactions.

        Example::

            earlier = ctx.earlier(records.select("transaction_id"))
            earlier.halves.count()
        """
        transaction_ids = transaction_ids.where(F.col("transaction_id").isNotNull()).distinct()
        low, high = transaction_ids.agg(F.min("transaction_id"), F.max("transaction_id")).first()

        def rows(table: TableDef) -> DataFrame:
            all_rows = self.read(table)
            if low is None:
                return all_rows.limit(0)
            return all_rows.filter(F.col("transaction_id").between(low, high)).join(transaction_ids, "transaction_id", "left_semi")

        return EarlierRows(
            # Materialised once: ingest, resolve and promote all read it.
            halves=rows(HALF).drop("batch_id").localCheckpoint(eager=True),
            resolved=rows(OP).select("transaction_id").distinct(),
        )

    def conform(self, df: DataFrame, table: TableDef) -> DataFrame:
        """``df`` with exactly ``table``'s columns and types, stamped with this batch's id."""
        types = dict(table.columns)
        df = df.withColumn("batch_id", F.lit(self.batch_id))
        return df.select([F.col(name).cast(types[name]).alias(name) for name in table.column_names])

    def append(self, df: DataFrame, table: TableDef, path: str | None = None) -> None:
        """Append ``df`` to ``table`` once: a replay of this batch writes nothing again.

        An append that loses to a concurrent metadata change (``txcoord maintain`` setting a
        table property) is tried again: the change touches no data, and the append is idempotent.

        Example::

            ctx.append(check_requests, CHECK_REQUESTS)
        """
        writer = (
            self.conform(df, table)
            .write.format("delta")
            .mode("append")
            .option("txnAppId", self.app_id)
            .option("txnVersion", self.batch_id)
        )
        for attempt in range(1, _WRITE_ATTEMPTS + 1):
            try:
                writer.save(path or self.path(table))
                return
            except Exception as error:  # raised through py4j, so only its message names the cause
                if _METADATA_CHANGED not in str(error) or attempt == _WRITE_ATTEMPTS:
                    raise
                log.warning("batch %d: append to %s lost to a metadata change; attempt %d of %d",
                            self.batch_id, path or table.name, attempt + 1, _WRITE_ATTEMPTS)
                time.sleep(0.1 * attempt)
