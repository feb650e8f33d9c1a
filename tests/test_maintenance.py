"""Maintenance compacts, checkpoints and vacuums without changing what any table holds."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from coordinator.checker.progress import BatchRecord, CheckerProgress, Epoch, Progress
from coordinator.lakehouse import read_table
from coordinator.maintenance import maintain, maintained_tables
from coordinator.tables import COMMIT_LOG
from tests.conftest import end_record, half_record


def contents(checker) -> dict[str, list]:
    return {name: sorted(map(tuple, checker.table(name).drop("batch_id").collect()), key=repr)
            for name in ("half", "op", "rejected", "T")}


def by_table(results) -> dict:
    return {result.table: result for result in results}


def test_compaction_keeps_every_row_and_replays_stay_idempotent(checker):
    for name in ("a", "b", "c"):
        checker.write(half_record(name))
        checker.write(end_record(name))
        checker.run()
    checker.write(end_record("unknown-transaction"))
    checker.run()
    before = contents(checker)
    lakehouse = checker.config.lakehouse
    assert "topics/T" in maintained_tables(lakehouse)

    results = by_table(maintain(lakehouse, retention_hours=0, quiesced=True))

    assert results["system/op"].files_before == 3 and results["system/op"].files_after == 1
    assert results["topics/T"].files_compacted == 3 and results["topics/T"].files_after == 1
    assert results["system/commit_log"].files_after == 1
    assert any("check interval" in reason for reason in results["system/check_requests"].skipped)
    assert contents(checker) == before
    # The checkpoint maintenance wrote keeps the checker's idempotency records:
    checker.replay()
    assert contents(checker) == before
    # and the commit log's change feed still serves versions written before the compaction.
    checker.next_version = 0
    checker.batch_id = 100
    checker.run()
    assert {r.reason for r in checker.table("rejected").collect()} >= {"transaction already resolved"}
    assert checker.table("T").count() == 3


def test_the_commit_log_is_vacuumed_only_once_the_checker_has_read_past_its_compaction(checker):
    lakehouse = checker.config.lakehouse
    log = COMMIT_LOG.path(lakehouse)
    for name in ("a", "b"):
        checker.write(half_record(name))
    maintain(lakehouse, tables=["system/commit_log"], retention_hours=0, quiesced=True)
    compacted_at = DeltaTable(log).version()
    store = CheckerProgress(lakehouse)

    def checker_reads_from(version: int) -> None:
        epoch = Epoch(number=0, first_batch_id=0, starting_version=0, checkpoint_id="q")
        store.save(Progress(epoch, BatchRecord(5, 5, version, version, version + 1, 0)))

    checker_reads_from(compacted_at - 1)  # its last batch, which may be replayed, reads b's version again
    held = by_table(maintain(lakehouse, tables=["system/commit_log"], retention_hours=0, quiesced=True))["system/commit_log"]
    assert held.files_vacuumed == 0 and not held.skipped

    checker_reads_from(compacted_at)  # past every version whose files the compaction removed
    freed = by_table(maintain(lakehouse, tables=["system/commit_log"], retention_hours=0, quiesced=True))["system/commit_log"]
    assert freed.files_vacuumed == 2 and not freed.skipped
    assert sorted(read_table(log, ["transaction_id"]).column("transaction_id").to_pylist()) == ["a", "b"]


def test_a_retention_shorter_than_an_hour_is_refused_while_writers_may_run(config):
    with pytest.raises(ValueError, match="at least 1: a shorter vacuum deletes files that writers commit"):
        maintain(config.lakehouse, retention_hours=0)


def test_maintenance_of_a_missing_table_says_so(config):
    (result,) = maintain(config.lakehouse, tables=["topics/NOPE"])
    assert result.skipped == ["not a Delta table"] and result.files_after == 0
