"""``support``: what the tests, the benchmarks and the chaos harness share, each piece doing what their
verdicts and figures rely on."""

from __future__ import annotations

import datetime as dt
import sys
import time

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from coordinator.lakehouse import Lakehouse, init_lakehouse
from coordinator.tables import METRICS
import support
from support.lakehouse import append_rows, metrics_row

UTC = dt.timezone.utc
#: A process that takes a lakehouse's checker lease (or, with "wait", stands by for it) and sleeps.
LEASE_HOLDER = ("import sys, time; from coordinator.control.lease import CheckerLease; "
                "CheckerLease(sys.argv[1], ttl_s=30).acquire(wait=len(sys.argv) > 2); print('held', flush=True); "
                "time.sleep(120)")


def test_wait_until_returns_what_the_condition_found_and_names_what_timed_out():
    calls = []

    def third_time() -> object:
        calls.append(1)
        return len(calls) >= 3 and "found"

    assert support.wait_until(third_time, 5, poll_s=0.01) == "found" and len(calls) == 3
    with pytest.raises(TimeoutError, match="the lease: not within 0.05 s"):
        support.wait_until(lambda: None, 0.05, "the lease", poll_s=0.01)
    with pytest.raises(ZeroDivisionError):  # the condition's own error ends the wait at once
        support.wait_until(lambda: 1 / 0, 5)


def test_tally_deliveries_counts_lost_duplicated_and_unexpected_ids():
    tally = support.tally_deliveries({"a", "b", "c"}, ["a", "b", "b", "b", "x"])

    assert (tally.lost, tally.duplicated, tally.unexpected, tally.delivered) == (["c"], {"b": 2}, ["x"], 3)
    assert tally.counts() == {"lost": 1, "duplicated": 2, "unexpected": 1} and not tally.exactly_once
    assert support.tally_deliveries(["a", "b"], ["b", "a"]).exactly_once


def test_a_job_is_killed_with_its_whole_process_group_and_starts_again(tmp_path):
    # The job's child writes its pid, then both sleep (longer than any wait here): a kill must reach the child too.
    child = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}, sys.argv[1]]); time.sleep(600)"
    pid_file = tmp_path / "child.pid"
    job = support.Job([sys.executable, "-c", parent, str(pid_file)], tmp_path / "job.log").start()
    child_pid = int(support.wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30, "the child's pid"))

    assert job.running and job.kill() == -9 and not job.running
    support.wait_until(lambda: not _alive(child_pid), 60, "the child gone with its group")

    job.start()  # a supervisor's restart
    assert job.running and job.stop(10) == -15
    job.kill()  # the restarted parent's child, if it started one: the SIGTERM reached only the parent


def test_a_job_that_exits_before_what_is_awaited_fails_with_its_log(tmp_path):
    job = support.Job([sys.executable, "-c", "print('cannot start: no config'); raise SystemExit(3)"],
                      tmp_path / "job.log").start()

    with pytest.raises(RuntimeError, match="(?s)exited with 3 before its port.*cannot start: no config"):
        job.wait_for(lambda: False, "its port", 30, poll_s=0.05)
    assert job.logged("cannot start") and not job.logged("started")


def test_the_lease_says_which_job_holds_it_and_which_stands_by(tmp_path):
    lakehouse = str(tmp_path / "lakehouse")
    init_lakehouse(lakehouse)
    holder = support.Job([sys.executable, "-c", LEASE_HOLDER, lakehouse], tmp_path / "holder.log").start()
    standby = support.Job([sys.executable, "-c", LEASE_HOLDER, lakehouse, "wait"], tmp_path / "standby.log")
    try:
        holder.wait_for(lambda: support.holds_lease(lakehouse, holder), "the lease", 30)
        standby.start().wait_for(lambda: support.stands_by(lakehouse, standby), "standing by", 30)
        assert not support.holds_lease(lakehouse, standby) and not support.stands_by(lakehouse, holder)

        holder.kill()  # its process gone: the standby takes the lease over
        standby.wait_for(lambda: support.holds_lease(lakehouse, standby), "the takeover", 30)
        assert not support.holds_lease(lakehouse, holder)
    finally:
        holder.stop(10)
        standby.stop(10)


def test_recorded_batches_are_those_started_since_a_moment_oldest_first(tmp_path):
    lakehouse = Lakehouse(str(tmp_path / "lakehouse"))
    init_lakehouse(lakehouse)
    base = dt.datetime(2026, 11, 25, 6, 0, tzinfo=UTC)
    rows = [metrics_row(batch_id=batch_id, started_at=base + dt.timedelta(seconds=10 * batch_id),
                        finished_at=base + dt.timedelta(seconds=10 * batch_id + 2), delivered=batch_id)
            for batch_id in (3, 1, 2, 0)]
    append_rows(lakehouse.path(METRICS), METRICS, rows)

    since = (base + dt.timedelta(seconds=15)).timestamp()  # after batch 1 started, before batch 2
    batches = support.recorded_batches(lakehouse, since)

    assert [b["batch_id"] for b in batches] == [2, 3]
    assert batches[0]["finished_at"] == (base + dt.timedelta(seconds=22)).timestamp()
    assert support.first_batch_after(lakehouse, since)["batch_id"] == 2
    assert support.first_batch_after(lakehouse, (base + dt.timedelta(minutes=5)).timestamp()) is None


def test_records_are_a_well_behaved_producers_unless_overridden():
    half = support.half_record("t1", group="orders", topic="ORDERS", body=b"{}")
    end = support.end_record("t1", "ROLLBACK_MESSAGE", group="orders")

    assert (half["kind"], half["transaction_id"], half["producer_group"], half["message_count"]) == ("HALF", "t1", "orders", 1)
    assert (end["kind"], end["state"], end["check_id"]) == ("END", "ROLLBACK_MESSAGE", None)
    assert support.half_record("t2", topic="bad topic!")["topic"] == "bad topic!"
    assert support.half_record(None)["transaction_id"] is None  # as only a hostile writer writes it
    assert support.half_record("t1")["record_id"] != support.half_record("t1")["record_id"]
    assert [r["transaction_id"] for r in support.commit_rows(["a", "b"], "g")] == ["a", "b"]


def test_commits_map_each_version_to_its_timestamp_and_added_files(tmp_path):
    path = str(tmp_path / "table")
    write_deltalake(path, pa.table({"transaction_id": ["a", "b"]}))
    write_deltalake(path, pa.table({"transaction_id": ["c"]}), mode="append")

    commits = support.commits(path)

    assert [c["version"] for c in commits] == [0, 1]
    assert all(c["timestamp_ms"] > 0 and len(c["added"]) == 1 for c in commits)
    assert support.latest_version(path) == 1
    shape = support.table_shape(path)
    assert (shape["log_json_files"], shape["active_files"], shape["parquet_files_on_disk"]) == (2, 2, 2)


def test_deliveries_report_first_version_time_and_row_count_per_transaction(tmp_path):
    lakehouse = str(tmp_path)
    path = Lakehouse(lakehouse).topic("T")
    write_deltalake(path, pa.table({"transaction_id": ["a", "b"]}))
    write_deltalake(path, pa.table({"transaction_id": ["a"]}), mode="append")
    found = support.deliveries(lakehouse, "T")
    assert {tid: delivery.rows for tid, delivery in found.items()} == {"a": 2, "b": 1}
    first_commit = support.commits(path)[0]
    assert found["a"].timestamp_s == first_commit["timestamp_ms"] / 1000


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_stopped_job_reports_the_time_it_started(tmp_path):
    before_wall, before = time.time(), time.monotonic()
    job = support.Job([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "job.log").start()

    assert before_wall <= job.started_wall <= time.time() and before <= job.started_at <= time.monotonic()
    assert job.stop(10) == -15
