"""``coordinator.ops.status`` and ``coordinator.ops.audit``: what operators read, checked against batches
driven with an explicit clock (so ages and due checks are exact)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
from deltalake import DeltaTable

from coordinator.checker.metrics import CheckerMetrics
from coordinator.control.lease import CheckerLease
from coordinator.control.progress import BatchRecord, CheckerProgress, Epoch, Progress
from coordinator.exceptions import LakehouseNotFoundError
from coordinator.lakehouse import OPERATORS_LOG_KEY, Lakehouse
from coordinator.ops.audit import outcome, transaction_timeline
from coordinator.ops.status import read_status
from support import end_record, half_record
from support.batches import stored_time
from support.lakehouse import metrics_row
from tests.test_lease import held_by_a_child


@pytest.fixture
def traffic(checker):
    """Four transactions after one batch: "late" pending, "patient" pending with a one-hour immunity,
    "done" committed (two messages), and an END for "ghost", which no half announced."""
    checker.write(half_record("late"), half_record("patient", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "3600"}),
                  half_record("done", message_count=2), half_record("done", message_index=1, message_count=2))
    checker.write(end_record("done"), end_record("ghost"))
    checker.run()
    return checker


def test_status_counts_pending_due_and_refused_transactions(traffic):
    config, stored = traffic.config, stored_time(traffic, "late")

    status = read_status(config, now=stored + dt.timedelta(seconds=10))

    assert status.pending_transactions == 2
    assert status.oldest_pending_age_s == pytest.approx(10, abs=0.01)
    assert status.checks_due == 1  # "late" is past the 6 s immunity; "patient" has an hour
    assert (status.checks_issued, status.discarded) == (0, 0)
    assert (status.rejected, status.rejected_by_reason) == (1, {"unknown transaction": 1})
    assert (status.checker_alive, status.last_batch_id, status.lag_versions) == (False, None, None)

    traffic.run(now=stored + dt.timedelta(seconds=10))  # sends the check
    asked = read_status(config, now=stored + dt.timedelta(seconds=11))
    assert (asked.checks_issued, asked.checks_due) == (1, 0)
    interval = dt.timedelta(milliseconds=config.transaction_check_interval_ms)
    assert read_status(config, now=stored + dt.timedelta(seconds=10) + interval).checks_due == 1


def test_status_reads_the_lease_and_the_last_recorded_batch(traffic):
    config = traffic.config
    lease = CheckerLease(config.lakehouse).acquire()
    group_log = Lakehouse(config.lakehouse).commit_log("g")
    head = DeltaTable(group_log).version()
    operators_versions = DeltaTable(Lakehouse(config.lakehouse).operators_log).version() + 1
    finished = dt.datetime.now(dt.timezone.utc)
    # The checker's last batch read every version of the operators' log and all but the last of group g's.
    read_up_to = {"groups/g/commit_log": head, OPERATORS_LOG_KEY: operators_versions}
    store = CheckerProgress(config.lakehouse)
    store.load()
    store.save(Progress(Epoch(number=0, first_batch_id=0, starting_versions={}, checkpoint_id="q"),
                        BatchRecord(4, 4, starts={"groups/g/commit_log": head - 1, OPERATORS_LOG_KEY: 0},
                                    ends=read_up_to, now_us=int(finished.timestamp() * 1e6))))
    row = metrics_row(batch_id=4, started_at=finished - dt.timedelta(seconds=2), finished_at=finished,
                      duration_ms=2000, commit_log_version=sum(read_up_to.values()))
    CheckerMetrics(config.lakehouse, "test").record(row)

    status = read_status(config, now=finished + dt.timedelta(seconds=3))

    assert status.checker_alive and status.checker_holder.endswith(f"pid {os.getpid()}")  # the lease is this process's
    assert (status.last_batch_id, status.last_batch_duration_ms) == (4, 2000)
    assert status.last_batch_age_s == pytest.approx(3, abs=0.01)
    # Versions written over every log: group g's and the operators'; the checker has not read g's last.
    assert (status.commit_log_versions, status.lag_versions) == (head + 1 + operators_versions, 1)
    written = os.path.getmtime(os.path.join(group_log, "_delta_log", f"{head:020d}.json"))
    assert status.lag_s == pytest.approx(finished.timestamp() + 3 - written, abs=0.01)
    lease.release()
    assert not read_status(config).checker_alive


def test_status_says_a_killed_checker_of_this_host_is_not_running(config, tmp_path, capsys):
    from coordinator.cli import main

    child = held_by_a_child(config.lakehouse)
    try:
        assert read_status(config).checker_alive
        child.kill()
        child.wait(10)
        status = read_status(config)  # its 30 s lease is still fresh, but its process is gone
        assert (status.checker_alive, status.checker_process_gone) == (False, True)
        (tmp_path / "coordinator.toml").write_text(f'lakehouse = "{config.lakehouse}"\n')
        assert main(["status", "--config", str(tmp_path / "coordinator.toml")]) == 1
        assert f"not running: {status.checker_holder} is gone" in " ".join(capsys.readouterr().out.split())
    finally:
        child.kill()
        child.wait(10)


def test_timeline_of_a_committed_and_of_a_refused_transaction(traffic):
    events = transaction_timeline(traffic.config.lakehouse, "done")
    assert [e.step for e in events] == ["half sent", "half sent", "half stored", "half stored", "commit read",
                                        "end request", "commit read", "resolved", "resolved", "delivered", "delivered"]
    assert outcome(events) == "COMMIT"
    assert [e.table for e in events if e.step == "delivered"] == ["topics/T", "topics/T"]
    assert events == sorted(events, key=lambda e: e.at)

    ghost = transaction_timeline(traffic.config.lakehouse, "ghost")
    assert [(e.step, e.detail.split(",")[0]) for e in ghost] == [
        ("end request", "COMMIT_MESSAGE from the producer"), ("commit read", "commit 2 of groups/g/commit_log as the checker read it"),
        ("rejected", "END COMMIT_MESSAGE refused: unknown transaction")]
    assert outcome(ghost) == "PENDING"
    assert transaction_timeline(traffic.config.lakehouse, "never-sent") == []


def test_a_missing_lakehouse_is_an_error(tmp_path):
    from coordinator.config import CoordinatorConfig

    with pytest.raises(LakehouseNotFoundError, match="no lakehouse at"):
        read_status(CoordinatorConfig(lakehouse=str(tmp_path / "nowhere")))
    with pytest.raises(LakehouseNotFoundError):
        transaction_timeline(str(tmp_path / "nowhere"), "t")


def test_status_and_inspect_start_no_jvm(config):
    script = ("import sys; from coordinator.ops.status import read_status; from coordinator.ops.audit import transaction_timeline; "
              "from coordinator.config import CoordinatorConfig; read_status(CoordinatorConfig(lakehouse=sys.argv[1])); "
              "transaction_timeline(sys.argv[1], 't'); assert 'pyspark' not in sys.modules, 'pyspark was imported'")
    result = subprocess.run([sys.executable, "-c", script, config.lakehouse], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
