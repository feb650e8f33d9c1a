"""Maintenance compacts, checkpoints, vacuums and cleans the logs without changing what any table holds."""

from __future__ import annotations

import glob
import math
import os
import time
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from coordinator.checker.query import CheckerQuery
from coordinator.control.progress import BatchRecord, CheckerProgress, Epoch, Progress
from coordinator.lakehouse import Lakehouse, checkpoints, create_group_tables, create_table, read_table
from coordinator.ops.maintenance import LOG_RETENTION_PROPERTY, maintain, maintained_tables
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.tables import COMMIT_LOG, TOPIC
from support import end_record, half_record
from support.lakehouse import append_rows
from tests.test_streaming_checkpoint import commit_and_await_delivery

#: The commit log of group ``g``, which the tests' records (``half_record``, ``end_record``) come from.
LOG = "groups/g/commit_log"


def contents(checker) -> dict[str, list]:
    return {name: sorted((tuple(v for k, v in row.asDict().items() if k != "batch_id") for row in checker.rows(name)), key=repr)
            for name in ("half", "op", "rejected", "T")}


def by_table(results) -> dict:
    return {result.table: result for result in results}


def checker_reads_from(lakehouse: str, version: int) -> None:
    """Record a checker whose last batch (which may be replayed) read from ``version`` of group g's commit log."""
    epoch = Epoch(number=0, first_batch_id=0, starting_versions={}, checkpoint_id="q")
    store = CheckerProgress(lakehouse)
    store.load()
    store.save(Progress(epoch, BatchRecord(5, 5, starts={LOG: version}, ends={LOG: version + 1}, now_us=0)))


def group_log(lakehouse: str) -> str:
    """Group g's commit log, created (as ``txcoord add-group`` does) if missing."""
    create_group_tables(lakehouse, "g")
    return Lakehouse(lakehouse).commit_log("g")


def commits_in_log(path: str) -> list[int]:
    """The versions whose JSON commit is still in the table's ``_delta_log``."""
    return sorted(int(os.path.basename(name)[:-5]) for name in glob.glob(os.path.join(path, "_delta_log", "*.json")))


def age_log(path: str, hours: float) -> None:
    """Make every file in the table's log (commits and checkpoints) ``hours`` old.

    delta-rs decides what has expired by the files' modification times, so ageing them
    stands in for waiting: the test takes no time and the retention can be a realistic
    hour, which no slow step of the test can outlast by accident.
    """
    then = time.time() - hours * 3600
    for name in glob.glob(os.path.join(path, "_delta_log", "0*")):
        os.utime(name, (then, then))


def write_commits(path: str, count: int) -> int:
    """Append ``count`` one-record commits to the commit log; return the last version."""
    for _ in range(count):
        append_rows(path, COMMIT_LOG, [half_record("t")])
    return DeltaTable(path).version()


@pytest.mark.usefixtures("commit_logs_compacted_eagerly")
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
    assert results[LOG].files_after == 1 and results["operators/commit_log"].files_after == 0
    assert any("check interval" in reason for reason in results["system/check_requests"].skipped)
    assert contents(checker) == before
    # The checkpoint maintenance wrote keeps the checker's idempotency records:
    checker.replay()
    assert contents(checker) == before
    # and the commit log still serves the records of versions written before the compaction.
    checker.next_versions = {}
    checker.batch_id = 100
    checker.run()
    assert {r.reason for r in checker.rows("rejected")} >= {"transaction already resolved"}
    assert len(checker.rows("T")) == 3


@pytest.mark.usefixtures("commit_logs_compacted_eagerly")
def test_the_commit_log_is_vacuumed_only_once_the_checker_has_read_past_its_compaction(checker):
    lakehouse = checker.config.lakehouse
    log = Lakehouse(lakehouse).commit_log("g")
    for name in ("a", "b"):
        checker.write(half_record(name))
    maintain(lakehouse, tables=[LOG], retention_hours=0, quiesced=True)
    compacted_at = DeltaTable(log).version()

    checker_reads_from(lakehouse, compacted_at - 1)  # its last batch, which may be replayed, reads b's version again
    held = by_table(maintain(lakehouse, tables=[LOG], retention_hours=0, quiesced=True))[LOG]
    assert held.files_vacuumed == 0 and not held.skipped

    checker_reads_from(lakehouse, compacted_at)  # past every version whose files the compaction removed
    freed = by_table(maintain(lakehouse, tables=[LOG], retention_hours=0, quiesced=True))[LOG]
    assert freed.files_vacuumed == 2 and not freed.skipped
    assert freed.seconds > 0  # how long the table took, which a scheduled run's line names for its longest
    assert sorted(read_table(log, ["transaction_id"]).column("transaction_id").to_pylist()) == ["a", "b"]


@pytest.mark.usefixtures("commit_logs_compacted_eagerly")
def test_a_commit_logs_checkpoint_leaves_out_expired_tombstones_and_vacuum_still_frees_their_files(config, monkeypatch):
    # Checkpoints written with their clock an hour ahead: the compaction's tombstones are older than the
    # commit log's two minutes by then.
    monkeypatch.setattr(checkpoints, "time", SimpleNamespace(time=lambda: time.time() + 3600))
    lakehouse = config.lakehouse
    log = group_log(lakehouse)
    write_commits(log, 3)

    compacted = by_table(maintain(lakehouse, tables=[LOG], retention_hours=0, quiesced=True))[LOG]
    assert compacted.files_compacted == 3 and not compacted.skipped
    (checkpoint,) = glob.glob(os.path.join(log, "_delta_log", f"{compacted.version:020d}.checkpoint.parquet"))
    actions = pq.read_table(checkpoint, columns=["add", "remove"])
    assert actions.column("remove").null_count == len(actions) and len(actions.column("add").drop_null()) == 1

    checker_reads_from(lakehouse, compacted.version)
    freed = by_table(maintain(lakehouse, tables=[LOG], retention_hours=0, quiesced=True))[LOG]
    assert freed.files_vacuumed == 3
    on_disk = {os.path.basename(name) for name in glob.glob(os.path.join(log, "*.parquet"))}
    assert on_disk == {os.path.basename(uri) for uri in DeltaTable(log).file_uris()}


def test_a_run_reads_each_new_commit_of_a_commit_log_once_to_check_it_and_checkpoint_it(config, monkeypatch):
    from collections import Counter

    from coordinator.storage import LocalFileStore

    log = group_log(config.lakehouse)
    write_commits(log, 3)
    maintain(config.lakehouse, tables=[LOG])  # a checkpoint to carry forward from
    first = write_commits(log, 1)
    last = write_commits(log, 9)
    reads, real_read = Counter(), LocalFileStore.read

    def counted(store, key, *args, **kwargs):
        if key.endswith(".json") and "_delta_log/" in key:
            reads[int(key.rsplit("/", 1)[-1][:-5])] += 1
        return real_read(store, key, *args, **kwargs)

    monkeypatch.setattr(LocalFileStore, "read", counted)
    (run,) = maintain(config.lakehouse, tables=[LOG])

    assert run.failed is None and not run.skipped
    # The hostile-log check reads them; the first checkpoint, carried forward, takes its bytes.
    assert {version: reads[version] for version in range(first, last + 1)} == dict.fromkeys(range(first, last + 1), 1)
    assert glob.glob(os.path.join(log, "_delta_log", f"{last:020d}.checkpoint.parquet"))


def test_a_commit_log_made_before_its_properties_gains_them_in_one_commit(config):
    log = Lakehouse(config.lakehouse).commit_log("g")
    os.makedirs(log)
    DeltaTable.create(log, schema=COMMIT_LOG.arrow_schema(), configuration={"delta.appendOnly": "true"})

    maintain(config.lakehouse, tables=[LOG])
    maintain(config.lakehouse, tables=[LOG])

    assert DeltaTable(log).metadata().configuration == COMMIT_LOG.properties
    assert [entry["operation"] for entry in DeltaTable(log).history()].count("SET TBLPROPERTIES") == 1


def test_a_topic_made_before_its_checkpoint_interval_gains_it_and_new_topics_are_made_with_it(config):
    """A group's lag is counted from the topic's newest checkpoint and one read a commit after it."""
    lakehouse = Lakehouse(config.lakehouse)
    old = lakehouse.topic("OLD")
    os.makedirs(old)
    DeltaTable.create(old, schema=TOPIC.arrow_schema())
    create_table(TOPIC, lakehouse.topic("NEW"))

    maintain(config.lakehouse, tables=["topics/OLD"])

    assert TOPIC.properties == {"delta.checkpointInterval": "20"}
    for path in (old, lakehouse.topic("NEW")):
        assert DeltaTable(path).metadata().configuration == TOPIC.properties


def test_a_retention_shorter_than_an_hour_is_refused_while_writers_may_run(config):
    with pytest.raises(ValueError, match="at least 1: a shorter vacuum deletes files that writers commit"):
        maintain(config.lakehouse, retention_hours=0)


def test_maintenance_of_a_missing_table_says_so(config):
    (result,) = maintain(config.lakehouse, tables=["topics/NOPE"])
    assert result.skipped == ["not a Delta table"] and result.files_after == 0


@pytest.mark.usefixtures("commit_logs_compacted_eagerly")
def test_the_logs_shrink_to_a_bound_once_their_commits_are_older_than_the_log_retention(config):
    lakehouse = config.lakehouse
    log = group_log(lakehouse)
    sizes, heads = [], []
    for _ in range(4):
        write_commits(log, 20)
        age_log(log, hours=2)
        heads.append(write_commits(log, 1))
        checker_reads_from(lakehouse, heads[-1])  # the checker is up to date
        maintain(lakehouse, tables=[LOG], log_retention_hours=1)
        sizes.append(len(commits_in_log(log)))

    # delta-rs keeps every commit from the oldest log file younger than the retention on, back to a
    # checkpoint. A run checkpoints the head before anything else, so it removes every commit before the
    # one younger than the retention: the log keeps that one and the run's own commits (its property
    # change, its compaction), instead of growing by 20 a run.
    assert commits_in_log(log)[0] == heads[-1]
    assert max(sizes) <= 1 + 2, sizes
    assert DeltaTable(log).metadata().configuration[LOG_RETENTION_PROPERTY] == "interval 1 hour"
    assert read_table(log, ["transaction_id"]).num_rows == 4 * 21  # the data is all there


@pytest.mark.usefixtures("commit_logs_compacted_eagerly")
def test_the_commit_log_keeps_every_commit_the_checker_still_needs_even_past_the_log_retention(config):
    lakehouse = config.lakehouse
    log = group_log(lakehouse)
    write_commits(log, 10)
    maintain(lakehouse, tables=[LOG])  # a checkpoint, so that the cleanup could delete up to it
    compacted = DeltaTable(log).version()
    head = write_commits(log, 10)
    age_log(log, hours=2)

    # No checker has recorded progress: it will read from version 0.
    (unread,) = maintain(lakehouse, tables=[LOG], log_retention_hours=1)
    assert any(reason.startswith("log cleanup: version 0 is older than the log retention (1:00:00), "
                                 "and the checker still reads from version 0") for reason in unread.skipped)
    assert commits_in_log(log)[0] == 0

    checker_reads_from(lakehouse, 5)  # lagging: versions 5 on are past the retention, yet still needed
    (lagging,) = maintain(lakehouse, tables=[LOG], log_retention_hours=1)
    assert any("the checker still reads from version 5" in reason for reason in lagging.skipped)
    assert commits_in_log(log)[:head + 1] == list(range(head + 1))
    changes = pa.RecordBatchReader.from_stream(DeltaTable(log).load_cdf(starting_version=5)).read_all()
    written = sorted(set(changes.column("_commit_version").to_pylist()))
    assert written == [v for v in range(5, head + 1) if v != compacted]  # the checker can still read all it needs

    checker_reads_from(lakehouse, write_commits(log, 1))  # caught up: the old commits may go now
    (caught_up,) = maintain(lakehouse, tables=[LOG], log_retention_hours=1)
    assert not any(reason.startswith("log cleanup") for reason in caught_up.skipped)
    assert commits_in_log(log)[0] > 5


def test_the_commit_log_writer_writes_checkpoints_but_never_cleans_the_log_itself(config):
    log = group_log(config.lakehouse)
    # A checkpoint every 2 commits, so the writer's own commits write one; by default delta-rs
    # would then delete every expired commit before it.
    DeltaTable(log).alter.set_table_properties({LOG_RETENTION_PROPERTY: "interval 1 hour", "delta.checkpointInterval": "2"})
    write_commits(log, 5)
    age_log(log, hours=2)
    before = commits_in_log(log)

    with CommitLogWriter(config.lakehouse, "g") as writer:
        for name in ("a", "b", "c"):
            writer.submit([half_record(name)]).result()

    checkpoints = glob.glob(os.path.join(log, "_delta_log", "*.checkpoint.parquet"))
    assert any(int(os.path.basename(name)[:20]) > before[-1] for name in checkpoints)
    assert commits_in_log(log) == list(range(before[-1] + 4))


def test_an_open_commit_log_writer_keeps_writing_after_maintenance_changed_the_log_retention(config):
    # A property change is a metadata commit: an append from a snapshot older than it conflicts with it.
    with CommitLogWriter(config.lakehouse, "g") as writer:
        writer.submit([half_record("before")]).result()
        maintain(config.lakehouse, tables=[LOG], log_retention_hours=2)
        assert writer.submit([end_record("before")]).result() == DeltaTable(Lakehouse(config.lakehouse).commit_log("g")).version()


def test_the_log_retention_is_set_on_every_table_and_only_when_it_changes(config):
    lakehouse = config.lakehouse
    group_log(lakehouse)  # a group's tables too: its commit log and its check requests
    assert {LOG, "groups/g/check_requests", "operators/commit_log"} <= set(maintained_tables(lakehouse))

    def settings() -> dict[str, tuple]:
        return {name: (DeltaTable(os.path.join(lakehouse, name)).metadata().configuration.get(LOG_RETENTION_PROPERTY),
                       [entry["operation"] for entry in DeltaTable(os.path.join(lakehouse, name)).history()]
                       .count("SET TBLPROPERTIES")) for name in maintained_tables(lakehouse)}

    maintain(lakehouse, log_retention_hours=1.5)
    assert set(settings().values()) == {("interval 90 minutes", 1)}

    maintain(lakehouse, log_retention_hours=1.5)
    assert set(settings().values()) == {("interval 90 minutes", 1)}  # no second metadata commit

    maintain(lakehouse)  # without a log retention, each table keeps the one it has
    assert set(settings().values()) == {("interval 90 minutes", 1)}

    maintain(lakehouse, log_retention_hours=0.001)
    # Changed on every table; the cleanup that follows keeps 3.6 s of log, so on a slow machine the first
    # SET TBLPROPERTIES commit may be gone from the history already: only the value is certain.
    assert {value for value, _ in settings().values()} == {"interval 3600 milliseconds"}


@pytest.mark.parametrize("hours", [0, -1, math.nan, math.inf, 1e-12])
def test_a_log_retention_that_is_not_a_positive_duration_is_refused_before_any_change(config, hours):
    log = group_log(config.lakehouse)
    version = DeltaTable(log).version()
    with pytest.raises(ValueError, match="log_retention_hours must be a positive, finite number of hours"):
        maintain(config.lakehouse, log_retention_hours=hours)
    assert DeltaTable(log).version() == version


def test_the_streaming_checker_keeps_delivering_after_maintenance_changed_the_commit_logs_properties(spark, config):
    # The property change is a commit of the commit log with a metaData action and no added file:
    # the checker's source must pass over it (the schema is unchanged) rather than fail the query.
    config = config.replace(trigger_interval_ms=500)
    lakehouse = config.lakehouse
    checker = CheckerQuery(spark, config).start()
    try:
        commit_and_await_delivery(lakehouse, "before")
        (result,) = maintain(lakehouse, tables=[LOG], log_retention_hours=0.25)
        assert not any(reason.startswith("properties") for reason in result.skipped)
        commit_and_await_delivery(lakehouse, "after")
        assert checker.query.isActive and checker.query.exception() is None
    finally:
        checker.stop()
    assert DeltaTable(Lakehouse(lakehouse).commit_log("g")).metadata().configuration[LOG_RETENTION_PROPERTY] == "interval 15 minutes"
