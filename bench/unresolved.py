"""Many unresolved: ``--halves`` halves falling due at once. How long the round that issues their
check requests takes, and the checker's peak memory.

The halves (no END: their producer "crashed"), 200-byte bodies, go into the commit log in
``--commits`` commits. One ``run_batch`` (the checker's batch logic, driven as
support/batches.py drives it) ingests them before they are due; the next one runs with a clock
past their immunity (``--immunity-s``, set through ``transaction_timeout_ms``), so every one of
them is due in that round. A third round, still inside the check interval, shows what the
pending set costs when nothing is due. The batch clock is explicit, so nothing sleeps.

Memory: the Spark driver JVM's heap in use, sampled every 100 ms during the due round, and its
peak RSS (``VmHWM``, reset just before the round); this Python process's peak RSS (``maxrss``).

    python -m bench.unresolved                  # 100,000 halves
    python -m bench.unresolved --halves 10000
    python -m bench.unresolved --tiny           # 20 halves, for the tests (bench/tests/test_bench.py)

Prints a table and writes ``bench/results/unresolved.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench import harness

import support

TOPIC = "BENCH_UNRESOLVED"
GROUP = "bench-unresolved"
#: ``--tiny``: a few halves, in two commits.
TINY = {"halves": 20, "commits": 2}


class HeapSampler(threading.Thread):
    def __init__(self, spark):
        super().__init__(name="heap-sampler", daemon=True)
        self.runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
        self.peak_bytes = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.1):
            try:
                self.peak_bytes = max(self.peak_bytes, self.runtime.totalMemory() - self.runtime.freeMemory())
            except Exception:
                return

    def stop(self) -> float:
        self._halt.set()
        self.join()
        return round(self.peak_bytes / 2**20, 1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--halves", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=10, help="commit-log commits that carry the halves")
    parser.add_argument("--immunity-s", type=int, default=60)
    parser.add_argument("--lakehouse", default=None, help="default: a temporary directory, removed afterwards")
    parser.add_argument("--results", default=str(harness.RESULTS / "unresolved.json"))
    args = harness.parse_args(parser, argv, "unresolved", TINY)
    report = harness.start_report("unresolved", vars(args))

    from coordinator.config import CoordinatorConfig
    from coordinator.lakehouse import init_lakehouse
    from coordinator.producer.transaction_producer import time_ordered_id

    lakehouse = args.lakehouse or tempfile.mkdtemp(prefix="bench-unresolved-")
    shutil.rmtree(lakehouse, ignore_errors=True)
    init_lakehouse(lakehouse)
    # The rounds' clock runs ahead of the wall clock by the immunity, while the check interval runs from when
    # each request's file was written (wall clock): the interval must outlast that lead for the next round to
    # find nothing due.
    config = CoordinatorConfig(lakehouse=lakehouse, transaction_timeout_ms=args.immunity_s * 1000,
                               transaction_check_interval_ms=(args.immunity_s + 60) * 1000)
    with support.spark_session("bench-unresolved") as spark:
        try:
            driver = support.BatchDriver(spark, config, GROUP)
            started = time.perf_counter()
            per_commit = -(-args.halves // args.commits)
            for low in range(0, args.halves, per_commit):
                ids = [time_ordered_id() for _ in range(min(per_commit, args.halves - low))]
                driver.write(support.half_rows(ids, GROUP, TOPIC))
            report["write_s"] = round(time.perf_counter() - started, 1)
            print(f"{args.halves:,} halves written in {args.commits} commits ({report['write_s']} s)", flush=True)

            ingest, ingest_s = driver.run()
            assert ingest.halves == args.halves and ingest.checks == 0, ingest
            print(f"  ingest round: {ingest_s * 1000:.0f} ms, {ingest.halves} halves, {ingest.checks} checks", flush=True)

            due_at = datetime.now(timezone.utc) + timedelta(seconds=args.immunity_s + 1)
            before = support.jvm_memory(spark)
            reset = support.reset_peak_rss(before["pid"])
            heap = HeapSampler(spark)
            heap.start()
            due, due_s = driver.run(now=due_at)
            heap_peak = heap.stop()
            after = support.jvm_memory(spark)
            print(f"  due round: {due_s * 1000:.0f} ms, {due.checks} check requests", flush=True)

            quiet, quiet_s = driver.run(now=due_at + timedelta(seconds=1))
            print(f"  next round (nothing due, {quiet.pending} pending): {quiet_s * 1000:.0f} ms, {quiet.checks} checks",
                  flush=True)
        finally:
            if args.lakehouse is None:
                shutil.rmtree(lakehouse, ignore_errors=True)

    figures = {
        "ingest_round_ms": round(ingest_s * 1000, 1),
        "due_round_ms": round(due_s * 1000, 1),
        "check_requests": due.checks,
        "all_checked": due.checks == args.halves,
        "next_round_ms": round(quiet_s * 1000, 1),
        "pending_after": quiet.pending,
        "jvm_heap_used_peak_mib": heap_peak,
        "jvm_heap_max_mib": after["heap_max_mib"],
        "jvm_peak_rss_mib": after["peak_rss_mib"] if reset else None,
        "jvm_rss_before_mib": before["rss_mib"],
        "jvm_rss_after_mib": after["rss_mib"],
        "python_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    f = figures
    print(f"\n{'halves':>8} {'ingest ms':>10} {'due ms':>9} {'checks':>8} {'next ms':>9} {'heap peak MiB':>14} "
          f"{'JVM peak RSS MiB':>17} {'Python RSS MiB':>15}")
    print(f"{args.halves:>8} {f['ingest_round_ms']:>10} {f['due_round_ms']:>9} {f['check_requests']:>8} "
          f"{f['next_round_ms']:>9} {f['jvm_heap_used_peak_mib']:>14} {f['jvm_peak_rss_mib']!s:>17} "
          f"{f['python_maxrss_mib']:>15}")
    report.update(figures)
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
