"""Cold start: seconds from launching the checker job on a fresh lakehouse to its first finished batch.

Each of ``--runs`` runs makes a new temporary lakehouse (``init_lakehouse``) and launches
``spark-submit jobs/checker.py --config <toml>`` on it as deployed (``benchlib.CheckerJob``),
then follows its log for two moments, counted from the launch: "query started" (the line
``checker started on``: JVM and Spark session up, lease taken, streaming query started) and
"first batch" (the first ``batch N: records=`` line: a heartbeat-only batch has run and written
its results, as nothing else writes to the lakehouse). The checker is then stopped with SIGTERM
and the lakehouse removed, so every run starts cold: no checkpoint, no table cached.

Target: the first batch at most 20 s after the launch.

    python bench/cold_start.py             # 3 runs
    python bench/cold_start.py --runs 1
    python bench/cold_start.py --tiny      # one run, for the tests (tests/test_bench.py)

Prints a table and writes ``bench/results/cold_start.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

TARGET_S = 20.0
#: The log is read this often: the figures' resolution.
_POLL_S = 0.1
#: ``--tiny``: one cold start, which is already the whole benchmark.
TINY = {"runs": 1}


def one_start(trigger_ms: int, timeout_s: float) -> dict:
    """Launch the checker on a fresh lakehouse; return the seconds to "query started" and to the
    first finished batch, and its exit code once stopped."""
    lakehouse, checker = benchlib.checker_on_fresh_lakehouse(None, "cold-start", trigger_ms)
    log = benchlib.CheckerLog(checker.log_file.name)
    query_started_s = first_batch_s = None
    try:
        while first_batch_s is None:
            log.follow()
            elapsed = round(time.monotonic() - checker.started, 1)
            if log.query_started and query_started_s is None:
                query_started_s = elapsed
            if log.batches:
                first_batch_s = elapsed
            elif checker.process.poll() is not None:
                raise RuntimeError(f"the checker exited with {checker.process.returncode} before its first batch; "
                                   f"see {log.path}")
            elif elapsed > timeout_s:
                raise RuntimeError(f"the checker finished no batch within {timeout_s:g} s; see {log.path}")
            else:
                time.sleep(_POLL_S)
    finally:
        exit_code = checker.stop()
        if first_batch_s is not None:  # a failed run's lakehouse keeps its log for the error message
            shutil.rmtree(lakehouse, ignore_errors=True)
    return {"query_started_s": query_started_s, "first_batch_s": first_batch_s, "checker_exit_code": exit_code}


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": benchlib.median(values), "max": max(values)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="cold starts, one after the other")
    parser.add_argument("--trigger-ms", type=int, default=1000, help="checker trigger_interval_ms (the default's)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for a run's first batch")
    parser.add_argument("--results", default=str(benchlib.RESULTS / "cold_start.json"))
    args = benchlib.parse_args(parser, argv, "cold_start", TINY)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    report = benchlib.start_report("cold_start", vars(args))

    runs = []
    for number in range(1, args.runs + 1):
        runs.append(one_start(args.trigger_ms, args.timeout))
        print(f"  run {number}: query started after {runs[-1]['query_started_s']} s, "
              f"first batch after {runs[-1]['first_batch_s']} s", flush=True)
    report.update(
        runs=runs,
        query_started_s=spread([run["query_started_s"] for run in runs]),
        first_batch_s=spread([run["first_batch_s"] for run in runs]),
        target_first_batch_s=TARGET_S,
    )
    print(f"\n{'seconds from launch':>22} {'min':>6} {'median':>7} {'max':>6}")
    for name, key in [("query started", "query_started_s"), ("first batch", "first_batch_s")]:
        figures = report[key]
        print(f"{name:>22} {figures['min']:>6} {figures['median']:>7} {figures['max']:>6}")
    print(f"target: first batch ≤ {TARGET_S:g} s; checker exit codes {[run['checker_exit_code'] for run in runs]}")
    return benchlib.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
