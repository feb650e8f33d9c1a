"""History independence: checker micro-batch time over an empty lakehouse and over one holding
``--history`` resolved transactions (docs/design.md#cost-follows-new-and-pending-work: a batch's
cost follows its new and pending work, so a long resolved history adds next to nothing).

Lakehouse A is empty. Lakehouse B gets its history straight from Spark, one commit per table
written as ``--appends`` files of contiguous offsets (so each of system/half, system/op and
topics/<T> holds that many files, as after maintenance; system/check_requests gets one check for 1% of them): queue offsets 0..N-1 (commit
version 0, below the workload's, whose commit versions start at 1), batch ids below the
workload's, time-ordered transaction ids from 30 days ago, every one committed.

The same workload then runs through both with ``run_batch`` (the checker's batch logic, as
support/batches.py drives it): ``--workload`` HALF records in one commit-log commit and their
COMMIT ENDs in the next, one batch over both, then one heartbeat-only batch; ``--repeats``
times, A and B alternating (in an order that flips every round) so that a change in machine
load hits both alike. ``pending_from`` is carried from batch to batch as the streaming checker
carries it; B starts at N (what a checker that had resolved all of its history would hold).
The first round warms up and is not counted.

    python -m bench.history                                   # 1,000,000 resolved, 500 per batch
    python -m bench.history --history 100000 --workload small # the quick version
    python -m bench.history --tiny                            # 2,000 resolved, 5 per batch: for the tests

Prints a table and writes ``bench/results/history.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench import harness

import support

WORKLOADS = {"small": 100, "default": 500}
TOPIC = "BENCH_HISTORY"
GROUP = "bench-history"
#: ``--tiny``: a history of two files per table, one counted round of five transactions.
TINY = {"history": 2000, "workload": "5", "repeats": 1, "appends": 2}


def build_history(spark, lakehouse: str, n: int, appends: int) -> dict:
    """Write ``n`` resolved (committed) transactions into B's half, op, topic and check tables."""
    from pyspark.sql import functions as F

    from coordinator.lakehouse import Lakehouse
    from coordinator.tables import CHECK_REQUESTS, HALF, OP, TOPIC as TOPIC_DEF, TableDef

    started = time.perf_counter()
    base_ms = int((datetime.now(timezone.utc) - timedelta(days=30)).timestamp() * 1000)
    per_append = -(-n // appends)

    def conform(df, table: TableDef):
        """``df`` in ``table``'s schema (tables/__init__.py, the one definition): its columns in the
        table's order and types, and a typed null for each column the history leaves unset, so a
        column added to the table later (check_requests' producer_instance was one) cannot break this."""
        return df.select([(F.col(name) if name in df.columns else F.lit(None)).cast(kind).alias(name)
                          for name, kind in table.columns])

    ms = F.lit(base_ms) + F.col("id")  # one transaction per millisecond: ids grow with offsets
    # spark.range splits 0..n-1 into contiguous ranges, one per partition: each written file
    # covers a narrow range of offsets and of ids, as compacted files would.
    rows = spark.range(0, n, numPartitions=appends).select(
        F.col("id").alias("queue_offset"),
        F.concat(F.lower(F.lpad(F.hex(ms), 12, "0")), F.substring(F.md5(F.col("id").cast("string")), 1, 20)).alias("transaction_id"),
        F.lit(GROUP).alias("producer_group"),
        F.md5(F.concat(F.lit("m"), F.col("id").cast("string"))).alias("msg_id"),
        F.lit(0).alias("message_index"),
        F.lit(1).alias("message_count"),
        F.lit(TOPIC).alias("topic"),
        F.col("id").cast("string").alias("keys"),
        F.lit(None).cast("string").alias("tags"),
        F.create_map().cast("map<string,string>").alias("properties"),
        F.lit(support.BODY).alias("body"),
        F.timestamp_millis(ms).alias("born_timestamp"),
        F.timestamp_millis(ms).alias("stored_timestamp"),
        F.timestamp_millis(ms + 50).alias("resolved_at"),
        F.lit(6000).alias("immunity_ms"),
        F.lit(0).alias("commit_version"),
        (F.col("id") / per_append).cast("long").alias("batch_id"),
    )
    half = conform(rows, HALF)
    op = conform(rows.select(F.col("queue_offset").alias("half_offset"), "transaction_id", "producer_group",
                             F.lit("COMMIT").alias("outcome"), "resolved_at",
                             F.md5(F.concat(F.lit("e"), F.col("queue_offset").cast("string"))).alias("end_record_id"),
                             F.lit(None).cast("string").alias("check_id"), "batch_id"), OP)
    topic = conform(rows.withColumn("commit_timestamp", F.col("resolved_at")), TOPIC_DEF)
    checks = conform(rows.filter(F.col("queue_offset") % 100 == 0).select(
        F.concat_ws("-", "transaction_id", F.lit("1")).alias("check_id"), "transaction_id", "producer_group",
        F.lit(1).alias("check_times"), F.col("stored_timestamp").alias("requested_at"),
        F.col("queue_offset").alias("half_offset"), "msg_id", "topic", "keys", "tags", "properties", "body",
        "born_timestamp", "batch_id"), CHECK_REQUESTS)
    files = {}
    for name, df, path in [("system/half", half, Lakehouse(lakehouse).path(HALF)), ("system/op", op, Lakehouse(lakehouse).path(OP)),
                           (f"topics/{TOPIC}", topic, Lakehouse(lakehouse).topic(TOPIC)),
                           ("system/check_requests", checks, Lakehouse(lakehouse).path(CHECK_REQUESTS))]:
        df.write.format("delta").mode("append").save(path)
        files[name] = support.table_shape(path)["active_files"]
    return {"seconds": round(time.perf_counter() - started, 1), "files": files,
            "history_batch_ids": f"0..{appends - 1}"}


def run_workload(drivers: dict, workload: int, repeats: int) -> dict:
    """The same workload through every driver, alternating; returns each one's batch timings."""
    timings = {name: {"records": [], "heartbeat": [], "summaries": []} for name in drivers}
    for round_ in range(repeats + 1):  # round 0 warms up
        # The order flips every round, so that neither lakehouse always runs first.
        for name, driver in (list(drivers.items()) if round_ % 2 == 0 else list(drivers.items())[::-1]):
            from coordinator.producer.transaction_producer import time_ordered_id

            ids = [time_ordered_id() for _ in range(workload)]
            driver.write(support.half_rows(ids, GROUP, TOPIC))
            driver.write(support.commit_rows(ids, GROUP))
            summary, seconds = driver.run()
            assert summary.delivered == workload and summary.pending == 0, summary
            heartbeat, heartbeat_seconds = driver.run()
            if round_ > 0:
                timings[name]["records"].append(round(seconds * 1000, 1))
                timings[name]["heartbeat"].append(round(heartbeat_seconds * 1000, 1))
                timings[name]["summaries"].append({"records": summary.records, "delivered": summary.delivered,
                                                   "pending_from": summary.pending_from})
            print(f"  round {round_}{' (warm-up)' if round_ == 0 else ''} {name}: batch with records "
                  f"{seconds * 1000:.0f} ms, heartbeat-only {heartbeat_seconds * 1000:.0f} ms", flush=True)
    return timings


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=1_000_000, help="resolved transactions in lakehouse B")
    parser.add_argument("--workload", default="default",
                        help=f"transactions per batch: a number or one of {WORKLOADS} (default: default)")
    parser.add_argument("--repeats", type=int, default=5, help="counted rounds (one more warms up)")
    parser.add_argument("--appends", type=int, default=20, help="files per table of B's history")
    parser.add_argument("--workdir", default=None, help="where the two lakehouses go (default: a temporary directory)")
    parser.add_argument("--results", default=str(harness.RESULTS / "history.json"))
    args = harness.parse_args(parser, argv, "history", TINY)
    workload = WORKLOADS[args.workload] if args.workload in WORKLOADS else int(args.workload)
    report = harness.start_report("history", vars(args) | {"transactions_per_batch": workload})

    from coordinator.config import CoordinatorConfig
    from coordinator.lakehouse import init_lakehouse

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-history-")
    with support.spark_session("bench-history") as spark:
        try:
            lakehouses = {"empty": os.path.join(workdir, "A-empty"), "history": os.path.join(workdir, "B-history")}
            for path in lakehouses.values():
                shutil.rmtree(path, ignore_errors=True)
                init_lakehouse(path)
            print(f"building B's history: {args.history:,} committed transactions, {args.appends} files per table "
                  "(as after maintenance)", flush=True)
            report["build"] = build_history(spark, lakehouses["history"], args.history, args.appends)
            print(f"  built in {report['build']['seconds']} s; files: {report['build']['files']}", flush=True)
            drivers = {name: support.BatchDriver(spark, CoordinatorConfig(lakehouse=path), GROUP, first_batch_id=args.appends,
                                                  pending_from=args.history if name == "history" else 0)
                       for name, path in lakehouses.items()}
            timings = run_workload(drivers, workload, args.repeats)
        finally:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)

    medians = {name: {kind: harness.median(t[kind]) for kind in ("records", "heartbeat")} for name, t in timings.items()}
    ratio = round(medians["history"]["records"] / medians["empty"]["records"], 3)
    heartbeat_ratio = round(medians["history"]["heartbeat"] / medians["empty"]["heartbeat"], 3)
    print(f"\n{workload} transactions per batch, {args.repeats} rounds; median run_batch time in ms")
    print(f"{'lakehouse':>28} {'with records':>13} {'heartbeat-only':>15}")
    for name, label in [("empty", "A: empty"), ("history", f"B: {args.history:,} resolved")]:
        print(f"{label:>28} {medians[name]['records']:>13.1f} {medians[name]['heartbeat']:>15.1f}")
    print(f"{'ratio B/A':>28} {ratio:>13.3f} {heartbeat_ratio:>15.3f}")
    report.update({"transactions_per_batch": workload, "timings_ms": timings, "median_ms": medians,
                   "ratio": ratio, "heartbeat_ratio": heartbeat_ratio})
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
