"""Cold start: seconds from launching the checker job on a fresh lakehouse to its first finished batch.

Each of ``--runs`` runs makes a new temporary lakehouse (``init_lakehouse``) and launches
``spark-submit jobs/checker.py --config <toml>`` on it as deployed (``support.CheckerJob``),
then watches the lakehouse for two moments, counted from the launch: "lease taken" (the lease
names the job's process: JVM and Spark session up, its streaming query starting at once) and
"first batch" (the end of the first batch ``system/metrics`` records: a heartbeat-only batch has
run and written its results, as nothing else writes to the lakehouse). The checker is then stopped
with SIGTERM and the lakehouse removed, so every run starts cold: no checkpoint, no table cached.

Target: the first batch at most 20 s after the launch.

    python -m bench.cold_start             # 3 runs
    python -m bench.cold_start --runs 1
    python -m bench.cold_start --tiny      # one run, for the tests (bench/tests/test_bench.py)

Prints a table and writes ``bench/results/cold_start.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from bench import harness

import support

TARGET_S = 20.0
#: ``--tiny``: one cold start, which is already the whole benchmark.
TINY = {"runs": 1}


def one_start(trigger_ms: int, timeout_s: float) -> dict:
    """Launch the checker on a fresh lakehouse; return the seconds to "lease taken" and to the end of its
    first recorded batch, and its exit code once stopped."""
    lakehouse, checker = support.checker_on_fresh_lakehouse(None, "cold-start", trigger_ms)
    first_batch_s = None
    try:
        lease_seen, first = checker.wait_first_batch(checker.started_wall, timeout_s)
        lease_taken_s = round(lease_seen - checker.started_at, 1)
        first_batch_s = round(first["finished_at"] - checker.started_wall, 1)
    finally:
        exit_code = checker.stop()
        if first_batch_s is not None:  # a failed run's lakehouse keeps its log for the error message
            shutil.rmtree(lakehouse, ignore_errors=True)
    return {"lease_taken_s": lease_taken_s, "first_batch_s": first_batch_s, "checker_exit_code": exit_code}


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": harness.median(values), "max": max(values)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="cold starts, one after the other")
    parser.add_argument("--trigger-ms", type=int, default=1000, help="checker trigger_interval_ms (the default's)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for a run's first batch")
    parser.add_argument("--results", default=str(harness.RESULTS / "cold_start.json"))
    args = harness.parse_args(parser, argv, "cold_start", TINY)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    report = harness.start_report("cold_start", vars(args))

    runs = []
    for number in range(1, args.runs + 1):
        runs.append(one_start(args.trigger_ms, args.timeout))
        print(f"  run {number}: lease taken after {runs[-1]['lease_taken_s']} s, "
              f"first batch after {runs[-1]['first_batch_s']} s", flush=True)
    report.update(
        runs=runs,
        lease_taken_s=spread([run["lease_taken_s"] for run in runs]),
        first_batch_s=spread([run["first_batch_s"] for run in runs]),
        target_first_batch_s=TARGET_S,
    )
    print(f"\n{'seconds from launch':>22} {'min':>6} {'median':>7} {'max':>6}")
    for name, key in [("lease taken", "lease_taken_s"), ("first batch", "first_batch_s")]:
        figures = report[key]
        print(f"{name:>22} {figures['min']:>6} {figures['median']:>7} {figures['max']:>6}")
    print(f"target: first batch ≤ {TARGET_S:g} s; checker exit codes {[run['checker_exit_code'] for run in runs]}")
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
