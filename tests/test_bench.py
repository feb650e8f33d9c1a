"""The benchmark suite's own machinery: its Delta log reading (no JVM), and a tiny history run
(only with ``BENCH_TESTS=1``: it took 102 s on this 2-core machine at load 4-5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from coordinator.checker.session import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))
import benchlib  # noqa: E402


def test_commits_map_each_version_to_its_timestamp_and_added_files(tmp_path):
    path = str(tmp_path / "table")
    write_deltalake(path, pa.table({"transaction_id": ["a", "b"]}))
    write_deltalake(path, pa.table({"transaction_id": ["c"]}), mode="append")

    commits = benchlib.commits(path)

    assert [c["version"] for c in commits] == [0, 1]
    assert all(c["timestamp_ms"] > 0 and len(c["added"]) == 1 for c in commits)
    assert benchlib.latest_version(path) == 1
    shape = benchlib.table_shape(path)
    assert (shape["log_json_files"], shape["active_files"], shape["parquet_files_on_disk"]) == (2, 2, 2)


def test_percentile_and_median_by_nearest_rank():
    values = list(range(1, 101))
    assert benchlib.percentile(values, 0.99) == 100 and benchlib.percentile(values, 0.5) == 51
    assert benchlib.median([3, 1, 2, 4]) == 2.5 and benchlib.percentile([], 0.5) is None


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("BENCH_TESTS") != "1",
                    reason="about 100 s on two loaded cores, too long for CI: set BENCH_TESTS=1 to run it")
def test_history_benchmark_runs_at_tiny_scale_and_reports_a_ratio(tmp_path):
    results = tmp_path / "history.json"
    argv = [sys.executable, str(PROJECT_ROOT / "bench" / "history.py"), "--history", "2000", "--workload", "5",
            "--repeats", "1", "--appends", "2", "--workdir", str(tmp_path / "work"), "--results", str(results)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)

    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads(results.read_text())
    assert report["ratio"] > 0 and report["heartbeat_ratio"] > 0
    assert len(report["loadavg_start"]) == 3 and len(report["loadavg_end"]) == 3
    assert report["build"]["files"]["system/half"] == 2
