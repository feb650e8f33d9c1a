"""The credits service: grants loyalty points for every order announced on ``ORDER_TOPIC``.

A Structured Streaming query over the Delta table ``topics/ORDER_TOPIC``; each
micro-batch MERGEs one row per order into ``services/credits``, keyed by
``order_id``, so a replayed batch (after a crash) or a re-delivered order grants
nothing twice.

Run it with Python, which stops it gracefully on SIGTERM/SIGINT (the batch in
flight finishes, then exit 0)::

    python -m coordinator.demo.credits --config demo-lakehouse/demo.toml
    python -m coordinator.demo.credits --config X.toml --until-idle 20   # exit once caught up and idle for 20 s

``spark-submit`` of this file (``jobs/credits.py`` in a checkout) works too, with the same graceful stop.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from typing import Optional

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from coordinator.checker.gate import BatchGate
from coordinator.config import CoordinatorConfig
from coordinator.demo.services import CREDITS, ORDER_TOPIC
from coordinator.jobs.runtime import start_job
from coordinator.lakehouse import Lakehouse, create_table


log = logging.getLogger("credits")

QUERY_NAME = "txcoord-credits"
_ORDER_SCHEMA = "order_id long, customer string, amount double"


def checkpoint_location(lakehouse: str) -> str:
    """Where the credits query keeps its streaming checkpoint.

    Example::

        checkpoint_location("/lh")  # '/lh/services/_checkpoints/credits'
    """
    return Lakehouse(lakehouse).service_checkpoint("credits")


def credits_of(topic_rows: DataFrame) -> DataFrame:
    """One credit row per order in ``topic_rows`` (the earliest message of each order wins).

    Bodies that are not order JSON are left out.

    Example::

        credits_of(spark.read.format("delta").load("lh/topics/ORDER_TOPIC")).show()
    """
    orders = topic_rows.select(
        "msg_id", "transaction_id", "queue_offset", F.from_json(F.col("body").cast("string"), _ORDER_SCHEMA).alias("order")
    ).filter(F.col("order.order_id").isNotNull() & F.col("order.amount").isNotNull())
    # MERGE inserts every unmatched source row, so duplicates inside one batch must go first.
    earliest = F.row_number().over(Window.partitionBy("order.order_id").orderBy("queue_offset", "msg_id"))
    return orders.withColumn("rank", earliest).filter(F.col("rank") == 1).select(
        F.col("order.order_id").alias("order_id"),
        F.col("order.customer").alias("customer"),
        F.floor("order.amount").cast("long").alias("points"),  # same rule as demo_services.points_for
        "msg_id",
        "transaction_id",
        "queue_offset",
    )


def grant_credits(spark: SparkSession, lakehouse: str, topic_rows: DataFrame, batch_id: int) -> int:
    """MERGE the credits of ``topic_rows`` into ``services/credits``; orders already credited are skipped.

    Returns how many orders the batch carried (granted now or before).

    Example::

        grant_credits(spark, "lh", batch_df, batch_id=3)
    """
    from delta.tables import DeltaTable

    new = credits_of(topic_rows).withColumn("granted_at", F.current_timestamp()).withColumn("batch_id", F.lit(batch_id).cast("long"))
    new = new.localCheckpoint(eager=True)  # read the batch once: it is counted and merged
    orders = new.count()
    if orders:
        (
            DeltaTable.forPath(spark, Lakehouse(lakehouse).path(CREDITS))
            .alias("credit")
            .merge(new.alias("new"), "credit.order_id = new.order_id")
            .whenNotMatchedInsertAll()
            .execute()
        )
    return orders


class CreditsQuery:
    """The running credits stream: start it, then stop it between batches.

    Example::

        query = CreditsQuery(spark, config).start()
        ...
        query.stop()   # the batch in flight finishes first
    """

    def __init__(self, spark: SparkSession, config: CoordinatorConfig) -> None:
        self.spark = spark
        self.config = config
        self.query = None
        self.orders_read = 0
        self._caught_up_since: Optional[float] = None
        self._gate = BatchGate()  # a MERGE is never cut short by stop()

    def start(self) -> "CreditsQuery":
        lakehouse = Lakehouse.of(self.config)
        create_table(CREDITS, lakehouse.path(CREDITS), lakehouse.storage)
        self.query = (
            self.spark.readStream.format("delta")
            .load(lakehouse.topic(ORDER_TOPIC))
            .writeStream.queryName(QUERY_NAME)
            .foreachBatch(self._run_batch)
            .option("checkpointLocation", checkpoint_location(self.config.lakehouse))
            .trigger(processingTime=f"{self.config.trigger_interval_ms} milliseconds")
            .start()
        )
        log.info("credits stream started on %s", lakehouse.topic(ORDER_TOPIC))
        return self

    def _run_batch(self, topic_rows: DataFrame, batch_id: int) -> None:
        def body() -> None:
            orders = grant_credits(self.spark, self.config.lakehouse, topic_rows, batch_id)
            self.orders_read += orders
            log.info("batch %d: %d order(s) read, %d in total", batch_id, orders, self.orders_read)

        self._gate.run(batch_id, body)

    def idle_for(self) -> float:
        """Seconds the stream has been caught up, with nothing new in the topic.

        0 until the query has looked at the topic once, and whenever it has work:
        "idle" must never mean "still starting".
        """
        busy = (self._gate.busy or self.query.lastProgress is None
                or self.query.status["isDataAvailable"])
        if busy:
            self._caught_up_since = None
            return 0.0
        if self._caught_up_since is None:
            self._caught_up_since = time.monotonic()
        return time.monotonic() - self._caught_up_since

    def stop(self) -> None:
        """Stop after the batch in flight, if any, has merged its credits."""
        self._gate.close()
        if self.query is not None:
            self.query.stop()
        log.info("credits stream stopped")


def wait_for_table(lakehouse: Lakehouse, table: str, give_up: threading.Event, timeout_s: Optional[float]) -> bool:
    """Wait until ``table`` (a path in ``lakehouse``) is a Delta table: a topic's appears on its first delivery.

    Returns ``False`` if ``give_up`` is set or ``timeout_s`` passes first.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not lakehouse.exists(table):
        if give_up.is_set() or (deadline is not None and time.monotonic() > deadline):
            return False
        give_up.wait(0.5)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="credits", description="Grant loyalty points for the orders on ORDER_TOPIC.")
    parser.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    parser.add_argument("--until-idle", type=float, default=None, metavar="SECONDS",
                        help="exit 0 once caught up and no order has arrived for this long (default: run until SIGTERM)")
    job = start_job("txcoord-credits", parser.parse_args(argv), parser.prog)
    args, config, spark, stop_requested = job.args, job.config, job.spark, job.stop_requested
    try:
        lakehouse = Lakehouse.of(config)
        log.info("waiting for %s", lakehouse.topic(ORDER_TOPIC))
        if not wait_for_table(lakehouse, f"topics/{ORDER_TOPIC}", stop_requested, args.until_idle):
            log.info("no topic table yet; nothing to credit")
            return 0
        credits = CreditsQuery(spark, config).start()
        while not stop_requested.is_set():
            if credits.query.awaitTermination(1):
                print("credits: the streaming query ended unexpectedly", file=sys.stderr)
                return 1
            if args.until_idle is not None and credits.idle_for() >= args.until_idle:
                log.info("idle for %.0f s; stopping", credits.idle_for())
                break
        credits.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
