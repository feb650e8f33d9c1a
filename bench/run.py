"""Run the benchmark suite: each script in its own process, one after the other.

    python -m bench.run --quick   # one cold start, then small versions of producer, end to end, history
                                  # and batch_cost, and end to end on object storage at 25 ms a request:
                                  # `make bench`
    python -m bench.run           # the full versions: cold_start, producer, history, e2e, unresolved,
                                  # soak, batch_cost, groups, drain (95 minutes at least: soak 60, drain 15, e2e 10)
    python -m bench.run --tiny    # each of those with --tiny: the smallest run that goes through all of it,
                                  # in seconds (e2e's with --observed, from two producer processes
                                  # in two groups); its figures mean nothing
                                  # (bench/tests/test_bench.py runs them)

Each benchmark writes its own JSON under ``bench/results/`` (``*-quick.json`` for the quick
versions, ``*-tiny.json`` for the tiny ones), or beside ``--results``; this script writes ``run.json``
(``run-quick.json``, ``run-tiny.json``) with the headline figures and prints them, as one JSON
object, on its last line:

* ``producer_txn_per_s``, ``send_p99_ms``: the single-message producer configuration with the
  highest throughput, and that configuration's send p99;
* ``e2e_p50_ms``, ``e2e_p99_ms``: commit → visible in the topic table (bench/e2e.py);
* ``history_ratio``: median batch time with records, lakehouse with history / empty one
  (bench/history.py);
* ``batch_records_ms``, ``batch_heartbeat_ms``, ``batch_records_jobs``: median batch time with
  records and heartbeat-only, and the Spark jobs of one with records (bench/batch_cost.py), with
  ``reference_spark_append_ms``, a plain Spark Delta append measured in the same run, to quote
  them against;
* ``cold_start_s``: median seconds from launching the checker job to its first finished batch
  (bench/cold_start.py);
* ``groups_trigger_ratio``: median trigger time with records, 50 groups of which one is busy / one
  group alone (bench/groups.py; the target is at most 1.5);
* ``idle_logs_requests_ratio``, ``idle_log_found_s_max``: the checker's source on object storage at 25 ms a
  request, requests a second beside 1,000 idle groups / with the 10 busy ones alone (the target is at most 2),
  and the longest a long-idle group's next record waited to be found (bench/idle_logs.py; at most 2 s);
* ``drain_ratio``, ``drain_steady_ratio``: backlog drain rate, this checkout / the reference commit's
  checker, over the whole drain and after its first batch (bench/drain.py);
* ``e2e_s3_25ms_p50_ms``, ``e2e_s3_25ms_p99_ms``, ``producer_usd_per_million_txn``,
  ``checker_usd_per_million_txn``, ``idle_checker_usd_per_day``: bench/e2e.py with
  ``--storage-latency-ms 25`` (the S3 server, 25 ms added to every request by a proxy per party):
  commit → visible, and the producer's and the checker's requests priced at S3's list prices.

The machine is shared: the load average at start and end is recorded, and a warning printed
when the 1-minute load is above 1.5 at start.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench import harness


QUICK = {
    "cold_start": ["--runs", "1"],
    "producer": ["--seconds", "3", "--threads", "1", "16", "64", "128"],
    "history": ["--history", "100000", "--workload", "small", "--repeats", "3", "--appends", "20"],
    "e2e": ["--rate", "50", "--seconds", "30", "--threads", "8", "--drain", "60"],
    "batch_cost": ["--batches", "3", "--floor-repeats", "3"],
    "e2e_s3_25ms": ["--storage-latency-ms", "25", "--rate", "50", "--seconds", "20", "--threads", "16",
                    "--reference-producer-seconds", "0", "--idle-seconds", "10", "--drain", "90"],
}
#: The runs of a plan whose name is not their benchmark's: the benchmark each runs.
BENCHMARK_OF = {"e2e_s3_25ms": "e2e"}
FULL = {
    "cold_start": [],
    "producer": [],
    "history": [],
    "e2e": [],
    "unresolved": [],
    "soak": [],
    "batch_cost": [],
    "groups": [],
    "drain": [],
    "idle_logs": [],
}
#: The observers and the producer processes go through e2e's tiny run too.
TINY = {name: ["--tiny"] for name in FULL} | {"e2e": ["--tiny", "--observed", "--processes", "2", "--groups", "2"]}


def run_one(name: str, extra: list[str], results: Path) -> dict:
    argv = [sys.executable, "-m", f"bench.{BENCHMARK_OF.get(name, name)}", *extra, "--results", str(results)]
    print(f"\n=== {name}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    subprocess.run(argv, check=True, cwd=harness.ROOT)
    seconds = time.monotonic() - started
    print(f"=== {name} took {seconds:.0f} s", flush=True)
    return json.loads(results.read_text()) | {"run_seconds": round(seconds, 1)}


def headline(reports: dict[str, dict]) -> dict:
    """The headline figures (this module's docstring lists them) of the benchmarks' ``reports`` (name → JSON)."""
    summary = {}
    if "producer" in reports:
        single = [r for r in reports["producer"]["runs"] if r["messages_per_txn"] == 1]
        best = max(single, key=lambda r: r["txn_per_s"])
        summary.update(producer_txn_per_s=best["txn_per_s"], send_p99_ms=best["send_p99_ms"])
    if "e2e" in reports:
        summary.update(e2e_p50_ms=reports["e2e"]["e2e_p50_ms"], e2e_p99_ms=reports["e2e"]["e2e_p99_ms"])
    if "history" in reports:
        summary.update(history_ratio=reports["history"]["ratio"])
    if "batch_cost" in reports:
        batches, floor = reports["batch_cost"]["batches"], reports["batch_cost"]["floor"]
        summary.update(batch_records_ms=round(batches["records"]["seconds_median"] * 1000, 1),
                       batch_heartbeat_ms=round(batches["heartbeat"]["seconds_median"] * 1000, 1),
                       batch_records_jobs=batches["records"]["spark_jobs_median"],
                       reference_spark_append_ms=floor["append"]["ms_median"])
    if "cold_start" in reports:
        summary.update(cold_start_s=reports["cold_start"]["first_batch_s"]["median"])
    if "groups" in reports:
        summary.update(groups_trigger_ratio=reports["groups"]["ratio"]["with_records"])
    if "e2e_s3_25ms" in reports:
        latency = reports["e2e_s3_25ms"]
        summary.update(e2e_s3_25ms_p50_ms=latency["e2e_p50_ms"], e2e_s3_25ms_p99_ms=latency["e2e_p99_ms"],
                       producer_usd_per_million_txn=latency["producer_requests"]["usd_per_million_transactions"],
                       checker_usd_per_million_txn=latency["checker_requests"]["usd_per_million_transactions"],
                       idle_checker_usd_per_day=latency["checker_idle"]["usd_per_day"])
    if "idle_logs" in reports:
        summary.update(idle_logs_requests_ratio=reports["idle_logs"]["ratio"],
                       idle_log_found_s_max=reports["idle_logs"]["found_after_s_max"])
    if "drain" in reports:
        summary.update(drain_ratio=reports["drain"]["ratios"]["txn_per_s"],
                       drain_steady_ratio=reports["drain"]["ratios"]["steady_txn_per_s"])
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="one cold start and small versions of producer, e2e, history and batch_cost, and e2e on "
                           "object storage at 25 ms a request")
    size.add_argument("--tiny", action="store_true", help=f"every benchmark with --tiny: {harness.TINY_HELP}")
    parser.add_argument("--only", nargs="*", help="run only these benchmarks")
    parser.add_argument("--results", default=None,
                        help="this run's JSON (default: bench/results/run.json, run-quick.json, run-tiny.json); "
                             "each benchmark's goes beside it")
    args = parser.parse_args(argv)
    plan, suffix = (QUICK, "-quick") if args.quick else (TINY, "-tiny") if args.tiny else (FULL, "")
    results = Path(args.results) if args.results else harness.RESULTS / f"run{suffix}.json"
    report = harness.start_report("run" + suffix, vars(args))
    started = time.monotonic()
    reports = {name: run_one(name, extra, results.parent / f"{name}{suffix}.json")
               for name, extra in plan.items() if not args.only or name in args.only}

    summary = headline(reports)
    report.update(seconds=round(time.monotonic() - started, 1), summary=summary,
                  seconds_by_benchmark={name: r["run_seconds"] for name, r in reports.items()},
                  loadavg_by_benchmark={name: [r["loadavg_start"], r["loadavg_end"]] for name, r in reports.items()})
    harness.finish_report(report, results)
    print(f"suite took {report['seconds']} s")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
