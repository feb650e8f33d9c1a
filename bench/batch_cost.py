"""Batch cost: where a checker micro-batch's time goes, and the floor Spark and Delta set under it.

One Spark session, one empty lakehouse. ``--batches`` times: ``--commits`` commit-log commits of
``--transactions`` HALF records each, every one followed by a commit of their COMMIT ENDs (as
producers write them), then one batch over all of them with ``run_batch`` (the checker's batch
logic, as support/batches.py drives it), then one heartbeat-only batch. For each batch: wall
seconds and the number of Spark jobs it ran. The first round warms the JVM up and is not counted.

The same rounds then go through the real streaming query, in this process: each trigger's whole
time (Spark's planning, offset and commit logs, and the batch) from ``system/metrics``, and the
Spark jobs the query ran per trigger.

Then the floor, on a scratch Delta table of 200 rows, ``--floor-repeats`` times each, interleaved
so machine load hits all alike: a plain Spark append; an idempotent append (``txnAppId`` /
``txnVersion``, as every checker write is); the same idempotent append replayed (Delta skips it);
a Delta read with a filter and a count.

    python -m bench.batch_cost
    python -m bench.batch_cost --batches 3 --floor-repeats 5
    python -m bench.batch_cost --tiny             # the smallest run, for the tests (bench/tests/test_bench.py)

Prints a table and writes ``bench/results/batch_cost.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench import harness

import support

GROUP = "bench-batch-cost"
TOPIC = "BENCH_BATCH_COST"
#: ``--tiny``: one counted round of one commit of two transactions, the floor's operations once each.
TINY = {"batches": 1, "commits": 1, "transactions": 2, "floor_repeats": 1}


def timed_jobs(spark, action) -> tuple[float, int, object]:
    """Run ``action()``; return its wall seconds, the Spark jobs it started, and its result."""
    context = spark.sparkContext
    group = f"bench-{time.monotonic_ns()}"
    context.setJobGroup(group, "batch cost")
    try:
        started = time.perf_counter()
        result = action()
        seconds = time.perf_counter() - started
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return seconds, len(context.statusTracker().getJobIdsForGroup(group)), result


def batch_figures(spark, lakehouse: str, args) -> dict:
    from coordinator.config import CoordinatorConfig
    from coordinator.producer.transaction_producer import time_ordered_id

    driver = support.BatchDriver(spark, CoordinatorConfig(lakehouse=lakehouse), GROUP)
    rows = {"records": [], "heartbeat": []}
    for round_ in range(args.batches + 1):
        for _ in range(args.commits):
            ids = [time_ordered_id() for _ in range(args.transactions)]
            driver.write(support.half_rows(ids, GROUP, TOPIC))
            driver.write(support.commit_rows(ids, GROUP))
        for kind in rows:
            seconds, jobs, (summary, _) = timed_jobs(spark, driver.run)
            if kind == "records":
                assert summary.delivered == args.commits * args.transactions, summary
            if round_:
                rows[kind].append((seconds, jobs))
                print(f"  round {round_} {kind:>9} batch: {seconds:6.2f} s, {jobs} Spark jobs", flush=True)
    return {kind: {"seconds_median": round(harness.median([s for s, _ in values]), 3),
                   "spark_jobs_median": harness.median([j for _, j in values]),
                   "runs": [[round(s, 3), j] for s, j in values]}
            for kind, values in rows.items()}


def trigger_figures(spark, workdir: str, args) -> dict:
    """The same rounds through the real streaming query (:func:`support.streaming_triggers`)."""
    from coordinator.config import CoordinatorConfig
    from coordinator.lakehouse import init_lakehouse

    lakehouse = f"{workdir}/streaming"
    init_lakehouse(lakehouse)
    return support.streaming_triggers(spark, CoordinatorConfig(lakehouse=lakehouse), GROUP, TOPIC, args.batches,
                                       args.commits * args.transactions)


def floor_figures(spark, workdir: str, repeats: int) -> dict:
    path = f"{workdir}/floor"
    data = spark.range(200).selectExpr("id", "cast(id as string) as s")
    data.write.format("delta").save(path)

    def append(version=None):
        writer = data.write.format("delta").mode("append")
        if version is not None:
            writer = writer.option("txnAppId", "bench").option("txnVersion", version)
        writer.save(path)

    operations = {
        "append": lambda i: append(),
        "idempotent append": lambda i: append(i),
        "idempotent append, replayed": lambda i: append(i),
        "read, filter, count": lambda i: spark.read.format("delta").load(path).filter("id > 100").count(),
    }
    times = {name: [] for name in operations}
    for i in range(repeats):
        for name, operation in operations.items():
            seconds, _, _ = timed_jobs(spark, lambda: operation(i))
            times[name].append(seconds * 1000)
    return {name: {"ms_median": round(harness.median(values), 1), "ms_min": round(min(values), 1)}
            for name, values in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--commits", type=int, default=10, help="HALF commits (each with its END commit) per batch")
    parser.add_argument("--transactions", type=int, default=20, help="transactions per commit")
    parser.add_argument("--floor-repeats", type=int, default=15)
    parser.add_argument("--results", default=str(harness.RESULTS / "batch_cost.json"))
    args = harness.parse_args(parser, argv, "batch_cost", TINY)
    report = harness.start_report("batch_cost", vars(args))

    from coordinator.lakehouse import init_lakehouse

    workdir = tempfile.mkdtemp(prefix="bench-batch-cost-")
    with support.spark_session("bench-batch-cost") as spark:
        try:
            lakehouse = f"{workdir}/lakehouse"
            init_lakehouse(lakehouse)
            print(f"batches of {args.commits * args.transactions} transactions "
                  f"({2 * args.commits} commit-log versions), then a heartbeat-only batch:", flush=True)
            report["batches"] = batch_figures(spark, lakehouse, args)
            print("the same rounds through the streaming query...", flush=True)
            report["triggers"] = trigger_figures(spark, workdir, args)
            report["floor"] = floor_figures(spark, workdir, args.floor_repeats)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"\n{'batch':>28} {'median s':>9} {'Spark jobs':>11}")
    for kind, figures in report["batches"].items():
        print(f"{kind:>28} {figures['seconds_median']:>9} {figures['spark_jobs_median']:>11}")
    triggers = report["triggers"]
    print(f"\nstreaming query: a trigger with records (median {triggers['records_per_trigger_median']} records) "
          f"{triggers['trigger_ms_median_with_records']} ms, heartbeat-only {triggers['trigger_ms_median_heartbeat']} ms; "
          f"{triggers['spark_jobs_per_trigger']} Spark jobs per trigger ({triggers['triggers']} triggers)")
    print(f"\n{'one operation, 200 rows':>28} {'median ms':>10} {'min ms':>8}")
    for name, figures in report["floor"].items():
        print(f"{name:>28} {figures['ms_median']:>10} {figures['ms_min']:>8}")
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
