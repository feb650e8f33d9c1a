"""Failover: seconds from ``kill -9`` of the active checker to the first batch finished by the
checker that takes over, with nothing lost or duplicated.

Runs the chaos harness (:mod:`bench.chaos`) with producers sending and the checker killed
``--kills`` times, no producer kills, in two modes:

- ``standby``: a second checker stands by with its Spark session up (``--standby``); each kill
  hits the active one, the standby takes over, and the killed one, restarted at once, stands by
  in its turn;
- ``restart``: one checker, restarted at once after each kill, as a supervisor would; it takes
  the lease over as soon as it finds the killed run's process gone, but starts Spark first.

For each mode: every kill's failover, min / median / max, the chaos verdict (every count 0:
each committed message delivered exactly once, nothing else delivered). Target: every standby
failover at most the lease TTL (``checker_lease_ttl_ms``, 30 s by default) + 5 s.

    python -m bench.failover                    # 5 kills per mode
    python -m bench.failover --kills 3 --modes standby
    python -m bench.failover --tiny             # one kill per mode, 7 transactions: about two minutes

Prints a table and writes ``bench/results/failover.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from bench import harness
from bench.chaos.options import Options
from bench.chaos.producer import KINDS
from bench.chaos.run import Run
from coordinator.config import CoordinatorConfig

TARGET_MARGIN_S = 5.0
#: ``--tiny``: both modes, one kill each, one producer sending one transaction of each kind over 3 s.
TINY = {"kills": 1, "transactions": len(KINDS), "producers": 1, "send_seconds": 3.0}


def run_mode(mode: str, args: argparse.Namespace, workdir: Path) -> dict:
    """One chaos run in ``mode``; its failovers and its verdict."""
    # The consumer group's pauses, resets and dead-letter rounds are the chaos run's (docs/chaos.md): they would
    # only lengthen a failover measurement.
    options = replace(Options(), transactions=args.transactions, producers=args.producers,
                      checker_kills=args.kills, producer_kills=0, seed=args.seed, send_seconds=args.send_seconds,
                      lakehouse=str(workdir / mode), results=str(workdir / f"{mode}.json"), standby=mode == "standby",
                      consumer_pauses=0, consumer_resets=0, dead_letter_rounds=0)
    print(f"{mode}: {args.kills} kills of the active checker, {args.transactions} transactions", flush=True)
    report = Run(options).execute()
    failovers = [f["failover_s"] for f in report["did"]["failovers"]]
    return {
        "failover_s": failovers,
        "min_s": min(failovers, default=None),
        "median_s": harness.median(failovers),
        "max_s": max(failovers, default=None),
        "taken_over_by": [f["taken_over_by"] for f in report["did"]["failovers"]],
        "kills": len(report["did"]["checker_kills"]),
        "violations": report["violations"],
        "found": report["found"],
        "examples": {name: examples for name, examples in report["examples"].items() if examples},
        "duration_s": report["did"]["duration_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5, help="kills of the active checker per mode")
    parser.add_argument("--modes", nargs="+", choices=("standby", "restart"), default=["standby", "restart"])
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--send-seconds", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results", default=str(Path(__file__).resolve().parent / "results" / "failover.json"))
    args = harness.parse_args(parser, argv, "failover", TINY)

    ttl_s = CoordinatorConfig().checker_lease_ttl_ms / 1000
    target_s = ttl_s + TARGET_MARGIN_S
    report = harness.start_report("failover", vars(args))
    workdir = Path(tempfile.mkdtemp(prefix="failover-"))
    modes = {mode: run_mode(mode, args, workdir) for mode in args.modes}
    if any(figures["violations"] for figures in modes.values()):
        print(f"violations: the runs' lakehouses and logs are kept in {workdir}")
    else:
        shutil.rmtree(workdir)
    standby = modes.get("standby")
    report.update(lease_ttl_s=ttl_s, target_s=target_s, modes=modes,
                  standby_met=bool(standby and standby["failover_s"] and standby["max_s"] <= target_s
                                   and standby["violations"] == 0))
    print()
    print(f"{'mode':<9}{'kills':>6}{'min s':>8}{'median s':>10}{'max s':>8}  violations  failovers (s)")
    for mode, figures in modes.items():
        print(f"{mode:<9}{figures['kills']:>6}{figures['min_s']!s:>8}{figures['median_s']!s:>10}{figures['max_s']!s:>8}"
              f"  {figures['violations']:>10}  {', '.join(map(str, figures['failover_s']))}")
    print(f"target: standby failover ≤ lease TTL {ttl_s:g} s + {TARGET_MARGIN_S:g} s = {target_s:g} s: "
          f"{'met' if report['standby_met'] else 'NOT met'}")
    harness.finish_report(report, Path(args.results))
    return 0 if all(figures["violations"] == 0 for figures in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
