"""Spark in the benchmark's own process: a session, the checker's batch logic driven batch by batch with
an explicit clock, the real streaming query triggered round by round, and the driver JVM's memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Iterator, Mapping, Optional

from support.quantiles import median
from support.processes import proc_status
from support.records import commit_rows, half_rows
from support.waiting import wait_until

__all__ = ["BatchDriver", "jvm_memory", "reach_object_store", "spark_session", "streaming_triggers"]


@contextlib.contextmanager
def spark_session(app_name: str) -> Iterator:
    """The Spark session of a benchmark that drives the checker's logic in its own process: started here
    and stopped at the end, or, where this process has one already, that one, left running (the tests
    run the tiny modes in their own shared session, which later tests still need).

    Example::

        with harness.spark_session("bench-history") as spark:
            ...
    """
    from pyspark import SparkContext

    from coordinator.spark import get_spark

    ours = SparkContext._active_spark_context is None
    spark = get_spark(app_name)
    try:
        yield spark
    finally:
        if ours:
            spark.stop()





class BatchDriver:
    """Runs ``run_batch`` over the commit-log versions written since the last batch, with an
    explicit clock, carrying ``pending_from`` from batch to batch as the streaming query does.

    Example::

        driver = BatchDriver(spark, config, "order_group", first_batch_id=0, pending_from=0)
        driver.write(records)           # one commit-log commit (delta-rs)
        summary, seconds = driver.run() # one batch over every new version, clock = now
    """

    def __init__(self, spark, config, group: str, first_batch_id: int = 0, pending_from: int = 0):
        from coordinator.checker.segment import grown_to
        from coordinator.lakehouse import Lakehouse, create_table
        from coordinator.tables import COMMIT_LOG

        self.spark, self.config = spark, config
        self.lakehouse = Lakehouse.of(config)
        self.commit_log = self.lakehouse.commit_log(group)
        create_table(COMMIT_LOG, self.commit_log, self.lakehouse.storage)
        self.next_versions = grown_to(self.lakehouse, {}, budget=10**9)
        self.batch_id = first_batch_id
        self.pending_from = pending_from
        from coordinator.checker.batch import BatchRunner

        self.runner = BatchRunner()

    def write(self, records: list[dict]) -> int:
        """Append raw commit-log records as one commit; return its version."""
        from deltalake import DeltaTable, write_deltalake

        from coordinator.producer.commit_log import records_to_arrow

        storage = dict(self.lakehouse.storage) or None
        write_deltalake(self.commit_log, records_to_arrow(records), mode="append", storage_options=storage)
        return DeltaTable(self.commit_log, storage_options=storage).version()

    def records(self, starts: dict, ends: dict, now):
        from coordinator.checker.segment import Segment
        from coordinator.schedule import clock_us

        return Segment(starts, ends, clock_us(now)).records(self.lakehouse)

    def run(self, now=None):
        """One batch over every new version at clock ``now`` (default: the wall clock);
        returns ``(summary, wall seconds of run_batch)``."""
        from datetime import datetime, timezone

        from coordinator.checker.batch import run_batch
        from coordinator.checker.segment import grown_to

        started = time.perf_counter()  # finding and reading the new versions is part of the batch, as in the query
        ends = grown_to(self.lakehouse, self.next_versions)
        records = self.records(self.next_versions, ends, now or datetime.now(timezone.utc))
        summary = run_batch(self.config, records, self.batch_id, pending_from=self.pending_from,
                            runner=self.runner)
        seconds = time.perf_counter() - started
        self.next_versions, self.batch_id, self.pending_from = ends, self.batch_id + 1, summary.pending_from
        return summary, seconds


def reach_object_store(spark, storage: Mapping[str, str]) -> None:
    """Let this process's Spark session reach the S3 server of ``storage`` (the checker's checkpoint
    goes there through S3A), as the checker job's own settings do."""
    from coordinator.spark import object_store_conf

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in object_store_conf(storage).items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)


def streaming_triggers(spark, config, group: str, topic: str, rounds: int, transactions: int,
                       producer_storage: Optional[Mapping[str, str]] = None,
                       reader_storage: Optional[Mapping[str, str]] = None) -> dict:
    """The real streaming query (``CheckerQuery``, in this process) over ``rounds`` rounds after a
    warm-up one, each a commit of ``transactions`` HALF records of ``group`` then one of their COMMIT
    ENDs, waited for until delivered, then for a heartbeat-only trigger after it. Each trigger's whole time
    (planning, the offset and commit logs, the batch) as ``system/metrics`` records it, and the Spark
    jobs the query ran per trigger. The commits are written with ``producer_storage`` and ``system/metrics``
    is read with ``reader_storage`` where given (other routes to the same lakehouse than the checker's
    ``config.storage``, so that a proxy per party counts each party's requests alone).

    Example::

        streaming_triggers(spark, CoordinatorConfig(lakehouse="/tmp/lh"), "g", "T", rounds=5, transactions=200)
    """
    from coordinator.checker.query import CheckerQuery
    from coordinator.lakehouse import Lakehouse
    from coordinator.producer.transaction_producer import time_ordered_id
    from coordinator.tables import METRICS

    def routed(storage: Optional[Mapping[str, str]]):
        return config if storage is None else dataclasses.replace(config, storage=dict(storage))

    writer = BatchDriver(spark, routed(producer_storage), group)
    lakehouse = Lakehouse.of(routed(reader_storage))

    def recorded() -> list[dict]:
        return lakehouse.read(METRICS).sort_by("batch_id").to_pylist()

    def latest_once_delivered(total: int) -> Optional[dict]:
        """The latest recorded batch once ``total`` messages are delivered, ``None`` before."""
        rows = recorded()
        return rows[-1] if sum(r["delivered"] for r in rows) == total else None

    earlier = recorded() if lakehouse.exists(METRICS) else []  # of an earlier run
    checker = CheckerQuery(spark, config).start()
    try:
        wait_until(lambda: len(recorded()) >= len(earlier) + 2, 120, "two batches of the streaming checker")
        delivered_before = sum(r["delivered"] for r in recorded())
        first_counted = None
        for round_ in range(rounds + 1):
            if round_ == 1:
                first_counted = max(r["batch_id"] for r in recorded()) + 1
            ids = [time_ordered_id() for _ in range(transactions)]
            writer.write(half_rows(ids, group, topic))
            writer.write(commit_rows(ids, group))
            latest = wait_until(lambda: latest_once_delivered(delivered_before + (round_ + 1) * transactions),
                                120, f"round {round_}'s deliveries")
            # Every round measures one (the source ends one per HEARTBEAT_MS while no commit comes).
            wait_until(lambda: any(not r["records"] and r["batch_id"] > latest["batch_id"] for r in recorded()),
                       120, f"a heartbeat-only batch after round {round_}'s deliveries (batch {latest['batch_id']})")
        jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(str(checker.query.runId)))
    finally:
        checker.stop()
    rows = recorded()[len(earlier):]
    counted = [r for r in rows if r["batch_id"] >= first_counted]
    busy = [r for r in counted if r["records"]]
    idle = [r for r in counted if not r["records"]]
    return {"trigger_ms_median_with_records": median([r["duration_ms"] for r in busy]),
            "records_per_trigger_median": median([r["records"] for r in busy]),
            "trigger_ms_median_heartbeat": median([r["duration_ms"] for r in idle]),
            "spark_jobs_per_trigger": round(jobs / len(rows), 2), "triggers": len(rows)}



def jvm_memory(spark) -> dict:
    """The Spark driver JVM's heap in use and committed (MiB), and its process RSS and peak RSS (MiB)."""
    jvm = spark.sparkContext._jvm
    runtime = jvm.java.lang.Runtime.getRuntime()
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    status = proc_status(pid)
    return {"pid": pid, "heap_used_mib": round((runtime.totalMemory() - runtime.freeMemory()) / 2**20, 1),
            "heap_committed_mib": round(runtime.totalMemory() / 2**20, 1),
            "heap_max_mib": round(runtime.maxMemory() / 2**20, 1),
            "rss_mib": status.get("VmRSS"), "peak_rss_mib": status.get("VmHWM")}

