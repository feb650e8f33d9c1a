"""The checker on a Spark standalone cluster (a master and two workers on this machine), through
``scripts/cluster.py``: the same ``jobs/checker.py``, submitted with ``--master spark://…``.

Opt-in (``make cluster``, or ``CLUSTER_TESTS=1``): a master, two workers, the driver and its
executors are five JVMs, more than the suite allows at once on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import REPO_ROOT
from support import without_txcoord_settings


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CLUSTER_TESTS") != "1",
                    reason="five JVMs (about a minute): run `make cluster`, or set CLUSTER_TESTS=1")
def test_the_checker_job_runs_unchanged_on_a_standalone_cluster():
    result = subprocess.run([sys.executable, "-m", "scripts.cluster", "--per-fate", "2", "--json"],
                            capture_output=True, text=True, cwd=REPO_ROOT, env=without_txcoord_settings(), timeout=900)

    assert result.stdout.lstrip().startswith("{"), result.stderr[-4000:]
    summary = json.loads(result.stdout)
    print(f"cluster run: {summary.get('seconds')} s, settled after {summary.get('settled_s')} s")
    assert summary["failures"] == [], summary
    assert result.returncode == 0
    assert summary["application"] == [{"name": "txcoord-checker", "cores": 2, "state": "RUNNING"}]
    assert (summary["transactions"], summary["delivered"], summary["discarded"]) == (10, 4, 2)
