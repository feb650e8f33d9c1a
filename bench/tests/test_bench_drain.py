"""``bench/drain.py``: a backlog drained by this checkout's checker and by the reference commit's, side by side.

Slow (two checker jobs), and not marked ``benchmark``: ``make test`` runs it in the lane of the other
slow tests, which ends before the benchmarks' lane.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import drain
from support import REPO_ROOT



def test_ratios_are_this_tree_over_the_reference_and_none_where_a_figure_is_missing():
    results = {"drain": {"this": [{"txn_per_s": 30.0, "steady_txn_per_s": None},
                                  {"txn_per_s": 50.0, "steady_txn_per_s": 80.0}],
                         "reference": [{"txn_per_s": 10.0, "steady_txn_per_s": None},
                                       {"txn_per_s": 10.0, "steady_txn_per_s": None}]}}

    assert drain.ratios(results) == {"txn_per_s": 4.0, "steady_txn_per_s": None}


def test_ratios_of_figures_under_a_tenth_are_not_rounded_away():
    results = {"batch": {"this": [{"batch_s_median": 0.039, "trigger_ms_median": 223.5},
                                  {"batch_s_median": 0.045, "trigger_ms_median": 182.0}],
                         "reference": [{"batch_s_median": 0.064, "trigger_ms_median": 236.0},
                                       {"batch_s_median": 0.044, "trigger_ms_median": 176.5}]}}

    assert drain.ratios(results) == {"batch_s_median": round(0.042 / 0.054, 3), "trigger_ms_median": round(202.75 / 206.25, 3)}


@pytest.mark.slow
def test_drain_tiny_run_drains_the_same_backlog_in_both_trees_once(tmp_path):
    """A worktree of the reference commit, then 200 transactions drained by each tree's checker."""
    results = tmp_path / "drain.json"
    run = subprocess.run([sys.executable, "-m", "bench.drain", "--tiny", "--results", str(results)],
                         capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    report = json.loads(results.read_text())
    assert report["commits"]["reference"] == drain.REFERENCE_COMMIT
    for tree in ("this", "reference"):
        [figures] = report["results"]["drain"][tree]
        assert (figures["transactions"], figures["delivered"], figures["duplicated"]) == (200, 200, 0)
        assert figures["records"] == 400  # each transaction's HALF and its COMMIT
        assert figures["batches"] >= 1 and figures["txn_per_s"] > 0
    assert report["ratios"]["txn_per_s"] > 0
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert "bench-drain-reference" not in worktrees  # removed after the run
