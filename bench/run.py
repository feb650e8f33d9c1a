"""Run the benchmark suite: each script in its own process, one after the other.

    python bench/run.py --quick   # small versions of 1-3 (producer, end to end, history): `make bench`
    python bench/run.py           # the full versions of all five, then batch_cost (45 minutes at least: soak 30, e2e 10)

Each benchmark writes its own JSON under ``bench/results/`` (``*-quick.json`` for the quick
versions); this script writes ``run.json`` / ``run-quick.json`` with the headline figures and
prints them, as one JSON object, on its last line:

* ``producer_txn_per_s``, ``send_p99_ms``: the single-message producer configuration with the
  highest throughput, and that configuration's send p99;
* ``e2e_p50_ms``, ``e2e_p99_ms``: commit → visible in the topic table (bench/e2e.py);
* ``history_ratio``: median batch time with records, lakehouse with history / empty one
  (bench/history.py).

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

HERE = Path(__file__).resolve().parent

QUICK = {
    "producer": ["--seconds", "3", "--threads", "1", "16", "64", "128"],
    "history": ["--history", "100000", "--workload", "small", "--repeats", "3", "--appends", "20"],
    "e2e": ["--rate", "50", "--seconds", "30", "--threads", "8", "--drain", "60"],
}
FULL = {
    "producer": [],
    "history": [],
    "e2e": [],
    "unresolved": [],
    "soak": [],
    "batch_cost": [],
}


def run_one(name: str, extra: list[str], results: Path) -> dict:
    argv = [sys.executable, str(HERE / f"{name}.py"), *extra, "--results", str(results)]
    print(f"\n=== {name}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    subprocess.run(argv, check=True)
    print(f"=== {name} took {time.monotonic() - started:.0f} s", flush=True)
    return json.loads(results.read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small versions of producer, e2e and history (< 5 min on a quiet 2-core machine)")
    parser.add_argument("--only", nargs="*", help="run only these benchmarks")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    suffix = "-quick" if args.quick else ""
    report = benchlib.start_report("run" + suffix, vars(args))
    started = time.monotonic()
    reports = {name: run_one(name, extra, benchlib.RESULTS / f"{name}{suffix}.json")
               for name, extra in plan.items() if not args.only or name in args.only}

    summary = {}
    if "producer" in reports:
        single = [r for r in reports["producer"]["runs"] if r["messages_per_txn"] == 1]
        best = max(single, key=lambda r: r["txn_per_s"])
        summary.update(producer_txn_per_s=best["txn_per_s"], send_p99_ms=best["send_p99_ms"])
    if "e2e" in reports:
        summary.update(e2e_p50_ms=reports["e2e"]["e2e_p50_ms"], e2e_p99_ms=reports["e2e"]["e2e_p99_ms"])
    if "history" in reports:
        summary.update(history_ratio=reports["history"]["ratio"])
    report.update(seconds=round(time.monotonic() - started, 1), summary=summary,
                  loadavg_by_benchmark={name: [r["loadavg_start"], r["loadavg_end"]] for name, r in reports.items()})
    benchlib.finish_report(report, benchlib.RESULTS / f"run{suffix}.json")
    print(f"suite took {report['seconds']} s")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
