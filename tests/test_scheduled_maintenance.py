"""The checker job's own maintenance (coordinator/jobs/maintenance.py): every table maintained on a schedule while
the checker holds the lease, in a process of its own, one table at a time, with ``txcoord maintain``'s guards;
a table that cannot be maintained fails alone; a stop is never delayed and leaves no process behind.

Runs are started by a condition (:meth:`ScheduledMaintenance.run_soon`) and awaited through ``on_run``, never timed."""

from __future__ import annotations

import queue
import sys
import time

import pytest

from support import end_record, half_record
from support.lakehouse import SteadyProducer
from support.poisons import POISONS, PoisonedLog
from coordinator.checker.exporter import CheckerExporter
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease
from coordinator.exceptions import ConfigError
from coordinator.jobs.maintenance import MaintenanceRun, ScheduledMaintenance, holds
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.ops.maintenance import maintained_tables
from coordinator.producer.commit_log import CommitLogWriter

HOSTILE = "mallory"
#: Long enough that no run in these tests is due by the clock: each is started by run_soon().
NEVER_DUE_MS = 3_600_000
#: The maintenance process, compacting commit logs at any age (support/eager_maintenance_worker.py).
EAGER_WORKER = [sys.executable, "-m", "support.eager_maintenance_worker"]


def scheduled(config: CoordinatorConfig, holding=lambda: True, **kwargs) -> tuple[ScheduledMaintenance, queue.Queue]:
    """A started schedule over ``config``'s lakehouse, and the queue each run is put on."""
    runs: queue.Queue = queue.Queue()
    config = config.replace(maintenance_interval_ms=kwargs.pop("interval_ms", NEVER_DUE_MS), maintenance_retention_hours=1)
    return ScheduledMaintenance(config, holding=holding, on_run=runs.put, **kwargs).start(), runs


def next_run(maintenance: ScheduledMaintenance, runs: queue.Queue) -> MaintenanceRun:
    maintenance.run_soon()
    return runs.get(timeout=300)


def by_table(run: MaintenanceRun) -> dict:
    return {result.table: result for result in run.tables}


def test_the_scheduled_runs_maintain_every_table_beside_a_live_producer_and_lose_nothing(config):
    lakehouse = Lakehouse.of(config)
    maintenance, runs = scheduled(config, command=EAGER_WORKER)
    try:
        with SteadyProducer(lakehouse) as producer:
            producer.wait_for(20)
            first = next_run(maintenance, runs)
            producer.wait_for(len(producer.sent) + 10)  # the producer goes on between two runs
            second = next_run(maintenance, runs)
    finally:
        maintenance.close()

    for run in (first, second):
        assert run.stopped_short is None and run.failed == [], run
        assert {"groups/g/commit_log", "system/half", "system/op"} <= set(by_table(run))
    log = "groups/g/commit_log"
    assert by_table(first)[log].files_compacted >= 20 and by_table(second)[log].files_compacted >= 10
    assert by_table(first)["system/check_requests"].skipped[-1].startswith("compaction: the check interval")  # a guard kept
    rows = read_table(lakehouse.commit_log("g"), ["transaction_id"]).column(0).to_pylist()
    assert sorted(rows) == sorted(producer.sent)  # every commit once: none lost, none doubled


def test_the_schedule_runs_again_an_interval_after_each_run(config):
    # Due at once, and again after each run; without the lease each run ends at its first look.
    maintenance, runs = scheduled(config, interval_ms=1, holding=lambda: False)
    try:
        got = [runs.get(timeout=60) for _ in range(3)]
    finally:
        maintenance.close()
    assert [run.stopped_short for run in got] == ["this checker does not hold the lease"] * 3


@pytest.mark.parametrize("poison", ["a commit that is not JSON", "JSON nested beyond parsing"])
def test_a_poisoned_log_fails_alone_and_the_others_are_maintained(config, poison):
    """delta-rs cannot load such a log; handed the nested one, it would die of SIGSEGV. Counted as failed."""
    lakehouse = Lakehouse.of(config)
    with CommitLogWriter(lakehouse, "alice", commit_interval_ms=0) as writer:
        for index in range(3):
            writer.submit([half_record(f"a{index}", group="alice"), end_record(f"a{index}", group="alice")]).result()
    POISONS[poison].write(PoisonedLog(lakehouse, HOSTILE))
    exporter = CheckerExporter()
    counted = lambda run: exporter.maintenance_done(run.maintained, len(run.failed), run.seconds)  # noqa: E731
    maintenance, runs = scheduled(config, command=EAGER_WORKER)
    try:
        run = next_run(maintenance, runs)
        counted(run)
    finally:
        maintenance.close()

    results = by_table(run)
    assert [result.table for result in run.failed] == [f"groups/{HOSTILE}/commit_log"]
    assert run.stopped_short is None and results["groups/alice/commit_log"].version >= 3
    assert results["groups/alice/commit_log"].files_compacted == 3
    assert exporter.registry.get_sample_value("txcoord_maintenance_tables_total", {"outcome": "failed"}) == 1
    assert exporter.registry.get_sample_value("txcoord_maintenance_tables_total", {"outcome": "maintained"}) == run.maintained
    assert exporter.registry.get_sample_value("txcoord_maintenance_failed_tables") == 1


def test_a_maintenance_process_that_dies_costs_its_table_alone(config, tmp_path):
    """A crash of delta-rs (as SIGSEGV) ends the process mid-table: that table is reported, a new process takes the next."""
    worker = tmp_path / "dies_on_op.py"
    worker.write_text(
        "import os, sys\n"
        "from coordinator.jobs import maintenance\n"
        "def lines():\n"
        "    yield sys.stdin.readline()\n"
        "    for line in sys.stdin:\n"
        "        if 'system/op' in line:\n"
        "            os.kill(os.getpid(), 11)\n"
        "        yield line\n"
        "class Feed:\n"
        "    def __init__(self): self.it = lines()\n"
        "    def readline(self): return next(self.it, '')\n"
        "    def __iter__(self): return self.it\n"
        "maintenance.serve(Feed(), sys.stdout)\n")
    maintenance, runs = scheduled(config, command=[sys.executable, str(worker)])
    try:
        run = next_run(maintenance, runs)
    finally:
        maintenance.close()

    [failed] = run.failed
    assert failed.table == "system/op" and "SIGSEGV" in failed.failed
    assert run.stopped_short is None and by_table(run)["system/metrics"].failed is None  # listed after op


def test_nothing_is_maintained_by_a_checker_that_does_not_hold_the_lease(config):
    lakehouse = Lakehouse.of(config)
    ours, theirs = CheckerLease(lakehouse), CheckerLease(lakehouse)
    theirs.acquire()
    maintenance, runs = scheduled(config, holding=lambda: holds(ours))
    try:
        run = next_run(maintenance, runs)
        theirs.release()
        ours.acquire()
        held = next_run(maintenance, runs)
        ours.release()
        released = next_run(maintenance, runs)
    finally:
        maintenance.close()
    assert run.tables == [] and run.stopped_short == "this checker does not hold the lease"
    assert held.stopped_short is None and held.maintained > 0
    assert released.tables == [] and released.stopped_short == "this checker does not hold the lease"


def test_a_stop_cuts_a_run_short_at_once_and_leaves_no_process_behind(config):
    """The maintenance process here never answers (a table that takes an hour): the stop does not wait for it."""
    hangs = [sys.executable, "-c", "import sys, time; sys.stdin.readline(); sys.stdin.readline(); time.sleep(3600)"]
    maintenance, runs = scheduled(config, command=hangs)
    maintenance.run_soon()
    assert maintenance.busy.wait(60)  # the run is waiting for its process
    process = maintenance._workers[0].process

    began = time.monotonic()
    maintenance.close()
    stopped_in = time.monotonic() - began

    assert stopped_in < 5, stopped_in
    assert process.poll() is not None  # killed and reaped
    assert runs.get(timeout=5).stopped_short == "the checker is stopping"


def test_several_processes_maintain_a_table_each_and_a_poisoned_log_still_fails_alone(config):
    """As on object storage, where several processes maintain a table each at once."""
    lakehouse = Lakehouse.of(config)
    with CommitLogWriter(lakehouse, "alice", commit_interval_ms=0) as writer:
        for index in range(3):
            writer.submit([half_record(f"a{index}", group="alice"), end_record(f"a{index}", group="alice")]).result()
    POISONS["JSON nested beyond parsing"].write(PoisonedLog(lakehouse, HOSTILE))
    maintenance, runs = scheduled(config, command=EAGER_WORKER, processes=3)
    try:
        run = next_run(maintenance, runs)
    finally:
        maintenance.close()
    assert run.stopped_short is None and [result.table for result in run.failed] == [f"groups/{HOSTILE}/commit_log"]
    assert [result.table for result in run.tables] == maintained_tables(lakehouse)  # every table, in the listed order
    assert by_table(run)["groups/alice/commit_log"].files_compacted == 3
    assert all(worker.process is None for worker in maintenance._workers)  # each ended after the run


def test_off_when_the_interval_is_zero(config):
    maintenance = ScheduledMaintenance(config.replace(maintenance_interval_ms=0), holding=lambda: True).start()
    assert maintenance._thread is None
    maintenance.close()


def test_the_maintenance_settings_are_read_and_checked(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text("maintenance_interval_ms = 0\nmaintenance_log_retention_hours = 0.05\n")
    config = CoordinatorConfig.load(conf, environ={"TXCOORD_MAINTENANCE_RETENTION_HOURS": "2"})
    assert (config.maintenance_interval_ms, config.maintenance_retention_hours,
            config.maintenance_log_retention_hours) == (0, 2, 0.05)
    assert CoordinatorConfig.load(conf, environ={"TXCOORD_MAINTENANCE_LOG_RETENTION_HOURS": "1.5"}
                                  ).maintenance_log_retention_hours == 1.5
    assert CoordinatorConfig().maintenance_interval_ms == 300_000
    for bad in ({"maintenance_interval_ms": -1}, {"maintenance_retention_hours": 0},
                {"maintenance_log_retention_hours": 0}, {"maintenance_log_retention_hours": float("inf")},
                {"maintenance_log_retention_hours": "1"}):
        with pytest.raises(ConfigError):
            CoordinatorConfig(**bad)
