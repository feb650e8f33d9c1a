"""A benchmark's report: its envelope (time, machine, load average), the ``--tiny`` option, and the
statistics every report quotes (from :mod:`support.quantiles`, which the benchmarks share with the tests).
What else the benchmarks and the chaos harness use to run the product lives in :mod:`support`.

Other engineers share this machine: every report records ``os.getloadavg()`` at start and end, and a
loaded machine is flagged at start, because its figures mean little.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Optional

from support import REPO_ROOT
from support.quantiles import median, percentile

__all__ = ["RESULTS", "ROOT", "TINY_HELP", "finish_report", "machine", "median", "parse_args", "percentile",
           "print_verdicts", "start_report"]

#: The checkout the benchmarks run from.
ROOT = REPO_ROOT
RESULTS = ROOT / "bench" / "results"
#: Above this 1-minute load average (on this 2-core machine) the figures are not worth much.
LOAD_WARNING = 1.5


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    """This machine as every report names it: cores, platform, Python."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def start_report(benchmark: str, args: dict) -> dict:
    """The report's envelope, with the load average now; warns when the machine is busy."""
    now = load()
    if now[0] > LOAD_WARNING:
        print(f"WARNING: 1-minute load average {now[0]} > {LOAD_WARNING} on {os.cpu_count()} cores: "
              "other jobs are running, these figures are not representative", file=sys.stderr, flush=True)
    return {
        "benchmark": benchmark,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "loadavg_start": now,
        "args": args,
    }


def print_verdicts(verdicts: list[dict]) -> None:
    """Each ``{"figure", "value", "target", "met"}`` a line: the figure, its value, its target and whether it was
    met (``met`` ``None``: not measured)."""
    for verdict in verdicts:
        said = {True: "met", False: "MISSED", None: "not measured"}[verdict["met"]]
        print(f"  {verdict['figure']:<50} {verdict['value']!s:>10}   target {verdict['target']!s:<10} {said}")


def finish_report(report: dict, path: Path) -> dict:
    """Stamp the end load average and write the report as JSON to ``path``."""
    report["loadavg_end"] = load()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average (1, 5, 15 min): start {report['loadavg_start']}, end {report['loadavg_end']}; "
          f"written to {path}", flush=True)
    return report


TINY_HELP = ("the smallest run that still goes through the whole benchmark, in seconds, for the tests "
             "(bench/tests/test_bench.py): its figures mean nothing; options given explicitly still win")


def parse_args(parser: argparse.ArgumentParser, argv: Optional[list[str]], benchmark: str,
               tiny: Mapping[str, object]) -> argparse.Namespace:
    """``parser``'s arguments from ``argv``, with a ``--tiny`` option: it makes ``tiny`` (option
    destinations → values) the defaults, and ``bench/results/<benchmark>-tiny.json`` the default
    results file (gitignored), so that a tiny run never overwrites a real one.

    Tiny runs exist so that a benchmark cannot rot: the tests run each one and check what it reports.

    Example::

        args = harness.parse_args(parser, argv, "cold_start", {"runs": 1})
    """
    parser.add_argument("--tiny", action="store_true", help=TINY_HELP)
    if parser.parse_known_args(argv)[0].tiny:
        parser.set_defaults(**tiny, results=str(RESULTS / f"{benchmark}-tiny.json"))
    return parser.parse_args(argv)

