"""Blind appends committed straight to a Delta log, read back by delta-rs (and Spark, in its own test)."""

import contextlib
import datetime as dt
import json
import logging
import os
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from support import wait_until
from coordinator.appender import CommitBackoff, DeltaAppender, check_writable, file_stats
from coordinator.exceptions import UnsupportedTableError
from coordinator.retries import storage_request_counts
from coordinator.storage import LocalFileStore

UTC = dt.timezone.utc
SCHEMA = pa.schema([("id", pa.string()), ("n", pa.int64()), ("at", pa.timestamp("us", tz="UTC")),
                    ("tags", pa.map_(pa.string(), pa.string())), ("body", pa.binary())])


@pytest.fixture
def table(tmp_path):
    path = str(tmp_path / "table")
    DeltaTable.create(path, schema=SCHEMA)
    return path


def rows(*ids, n=1, at=dt.datetime(2026, 11, 23, 12, 0, 0, 123456, UTC)):
    return pa.Table.from_pylist([{"id": i, "n": n, "at": at, "tags": {"k": i}, "body": i.encode()} for i in ids],
                                schema=SCHEMA)


@contextlib.contextmanager
def busy_writer(appender: DeltaAppender):
    """A thread appending one row after another through ``appender`` until the block ends; the ids it wrote."""
    stop = threading.Event()
    written: list[str] = []

    def keep_writing():
        while not stop.is_set():
            written.append(f"during-{len(written)}")
            appender.append(rows(written[-1]))

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        yield written
    finally:
        stop.set()
        writer.join()


def test_each_append_is_the_next_version_and_delta_rs_reads_it_back(table):
    with DeltaAppender(table) as appender:
        assert [appender.append(rows("a", "b")), appender.append(rows("c"))] == [1, 2]
    delta = DeltaTable(table)
    assert delta.version() == 2
    assert sorted(delta.to_pyarrow_table().column("id").to_pylist()) == ["a", "b", "c"]
    assert delta.history(1)[0]["operation"] == "WRITE"
    assert not [name for name in os.listdir(os.path.join(table, "_delta_log")) if name.endswith(".tmp")]


def test_an_appender_behind_other_writers_takes_the_next_free_version(table):
    with DeltaAppender(table) as behind, DeltaAppender(table) as other:
        assert other.append(rows("first")) == 1
        write_deltalake(table, rows("by-delta-rs"), mode="append")  # version 2, another engine
        assert behind.append(rows("late")) == 3
    assert sorted(DeltaTable(table).to_pyarrow_table().column("id").to_pylist()) == ["by-delta-rs", "first", "late"]


def test_threads_sharing_an_appender_lose_nothing(table):
    with DeltaAppender(table) as appender:
        versions = []
        threads = [threading.Thread(target=lambda i=i: versions.extend(appender.append(rows(f"t{i}-{j}"))
                                                                       for j in range(10))) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(versions) == list(range(1, 41))
    assert DeltaTable(table).to_pyarrow_table().num_rows == 40


def test_statistics_bound_every_value_so_data_skipping_never_drops_a_row():
    at = dt.datetime(2026, 11, 23, 12, 0, 0, 123456, UTC)
    data = pa.Table.from_pylist([{"id": "z" * 40, "n": 7, "at": at, "tags": None, "body": None},
                                 {"id": "a" * 40, "n": -2, "at": at - dt.timedelta(seconds=1), "tags": {}, "body": b"x"}],
                                schema=SCHEMA)
    stats = json.loads(file_stats(data))
    assert stats["numRecords"] == 2
    assert stats["minValues"] == {"id": "a" * 32, "n": -2, "at": "2026-11-23T11:59:59.123Z"}
    # The longest id has no maximum that short; the newest time's maximum is rounded up, not cut down.
    assert stats["maxValues"] == {"n": 7, "at": "2026-11-23T12:00:00.124Z"}
    assert stats["nullCount"] == {"id": 0, "n": 0, "at": 0, "body": 1}


def test_an_app_transaction_is_written_once_whichever_writer_gets_there_first(table):
    with DeltaAppender(table) as first, DeltaAppender(table) as second:
        assert first.append(rows("batch-3"), app_transaction=("checker", 3)) == 1
        assert second.append(rows("batch-3 again"), app_transaction=("checker", 3)) is None
        assert second.append(rows("batch-4"), app_transaction=("checker", 4)) == 2
        assert second.append(rows("batch-4 replayed"), app_transaction=("checker", 4)) is None
    delta = DeltaTable(table)
    assert delta.transaction_version("checker") == 4
    assert sorted(delta.to_pyarrow_table().column("id").to_pylist()) == ["batch-3", "batch-4"]
    assert len(delta.file_uris()) == len([name for name in os.listdir(table) if name.endswith(".parquet")])


def test_a_metadata_change_by_another_writer_is_taken_in(table):
    with DeltaAppender(table) as appender:
        assert appender.append(rows("a")) == 1
        DeltaTable(table).alter.set_table_properties({"delta.logRetentionDuration": "interval 2 hours"})
        assert appender.append(rows("b")) == 3
        DeltaTable(table).alter.add_constraint({"n_positive": "n > 0"})
        with pytest.raises(UnsupportedTableError, match="n_positive"):
            appender.append(rows("c"))
    assert sorted(DeltaTable(table).to_pyarrow_table().column("id").to_pylist()) == ["a", "b"]


def test_a_table_whose_protocol_asks_more_than_appending_is_refused(tmp_path):
    path = str(tmp_path / "vectors")
    DeltaTable.create(path, schema=SCHEMA, configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(UnsupportedTableError, match="deletionVectors"):
        DeltaAppender(path)
    with pytest.raises(UnsupportedTableError, match="invariants"):
        check_writable({"minWriterVersion": 2}, {"schemaString": json.dumps({"fields": [
            {"name": "n", "type": "long", "nullable": True, "metadata": {"delta.invariants": "n > 0"}}]})})


def test_a_version_cleaned_from_the_log_is_never_written_again(table):
    with DeltaAppender(table) as stale, DeltaAppender(table, checkpoints=False) as busy:
        for i in range(5):
            busy.append(rows(f"r{i}"))
        DeltaTable(table).create_checkpoint()
        for version in range(1, 5):  # what a log cleanup does behind the checkpoint at 5
            os.remove(os.path.join(table, "_delta_log", f"{version:020d}.json"))
        assert stale.append(rows("late")) == 6
    assert DeltaTable(table).to_pyarrow_table().num_rows == 6


def test_a_checkpoint_is_written_every_checkpoint_interval_off_the_callers_path(tmp_path):
    path = str(tmp_path / "table")
    DeltaTable.create(path, schema=SCHEMA, configuration={"delta.checkpointInterval": "3"})
    with DeltaAppender(path) as appender:
        for i in range(7):
            appender.append(rows(f"r{i}"))
    with open(os.path.join(path, "_delta_log", "_last_checkpoint")) as pointer:
        assert json.load(pointer)["version"] == 6
    log = os.listdir(os.path.join(path, "_delta_log"))
    assert sorted(name for name in log if ".checkpoint." in name) == [
        f"{version:020d}.checkpoint.parquet" for version in (3, 6)]
    assert DeltaTable(path).to_pyarrow_table().num_rows == 7


def test_data_of_another_schema_is_refused_before_anything_is_written(table):
    with DeltaAppender(table) as appender:
        with pytest.raises(ValueError, match="columns"):
            appender.append(pa.table({"id": ["a"]}))
        with pytest.raises(pa.ArrowInvalid):
            appender.append(rows("a").set_column(1, "n", pa.array(["not a number"])))
        with pytest.raises(ValueError, match="nothing"):
            appender.append(rows()[:0])
    assert DeltaTable(table).version() == 0
    assert not [name for name in os.listdir(table) if name.endswith(".parquet")]


def test_spark_reads_the_appends_and_its_data_skipping_keeps_every_matching_row(table, spark):
    newest = dt.datetime(2026, 11, 23, 12, 0, 0, 123456, UTC)
    with DeltaAppender(table) as appender:
        appender.append(rows("old", at=newest - dt.timedelta(hours=1)))
        appender.append(rows("new", at=newest))
    topic = spark.read.format("delta").load(table)
    assert sorted(row.id for row in topic.collect()) == ["new", "old"]
    exact = topic.where(topic.at >= newest).collect()  # the statistics must not skip the newest row
    assert [(row.id, row.tags, bytes(row.body)) for row in exact] == [("new", {"k": "new"}, b"new")]
    skipping = DeltaTable(table).to_pyarrow_dataset().to_table(filter=pc.field("at") >= pa.scalar(newest, SCHEMA.field("at").type))
    assert skipping.column("id").to_pylist() == ["new"]


def test_compaction_rewrites_small_files_into_one_changing_no_data(table):
    with DeltaAppender(table) as appender:
        for i in range(6):
            appender.append(rows(f"r{i}", n=i))
    with DeltaAppender(table, checkpoints=False) as compactor:
        assert compactor.compact() == 6
    delta = DeltaTable(table)
    assert len(delta.file_uris()) == 1 and delta.version() == 7
    assert sorted(delta.to_pyarrow_table().column("id").to_pylist()) == [f"r{i}" for i in range(6)]
    commit = [json.loads(line) for line in open(os.path.join(table, "_delta_log", f"{7:020d}.json"))]
    assert commit[0]["commitInfo"]["operation"] == "OPTIMIZE" == delta.history(1)[0]["operation"]
    assert [a["remove"]["dataChange"] for a in commit if "remove" in a] == [False] * 6
    [add] = [a["add"] for a in commit if "add" in a]
    assert add["dataChange"] is False and json.loads(add["stats"])["numRecords"] == 6
    # Nothing left to compact: a single file stays as it is.
    with DeltaAppender(table, checkpoints=False) as compactor:
        assert compactor.compact() == 0
    assert DeltaTable(table).version() == 7


def test_an_appender_compacts_its_own_appends_every_so_many_on_its_own_thread_and_loses_nothing(table):
    with DeltaAppender(table, compact_every=4) as appender:
        versions = [appender.append(rows(f"r{i}")) for i in range(10)]
    # Closing waits for the compactions asked for (one once 4 appends wait, each taking every append then waiting).
    delta = DeltaTable(table)
    assert sorted(delta.to_pyarrow_table().column("id").to_pylist()) == [f"r{i}" for i in range(10)]
    commits = {version: [json.loads(line) for line in open(os.path.join(table, "_delta_log", f"{version:020d}.json"))]
               for version in range(1, delta.version() + 1)}
    compactions = [version for version, actions in commits.items() if actions[0]["commitInfo"]["operation"] == "OPTIMIZE"]
    compacted = sum("remove" in action for version in compactions for action in commits[version])
    assert 1 <= len(compactions) <= 2 and delta.version() == 10 + len(compactions)
    assert len(delta.file_uris()) == len(compactions) + (10 - compacted) and 10 - compacted < 4
    # Its appends' versions in order, the compactions' between them: taking turns, no race lost.
    assert versions == sorted(versions) and not set(versions) & set(compactions)


def test_a_compaction_leaves_recent_files_and_too_few_old_ones_alone(table):
    with DeltaAppender(table) as appender:
        for i in range(3):
            appender.append(rows(f"r{i}"))
    with DeltaAppender(table, checkpoints=False) as compactor:
        assert compactor.compact(older_than_s=600) == 0  # written just now: their writer compacts them
        assert compactor.compact(at_least=4) == 0  # three small files are not worth a commit that races a writer
        assert compactor.compact(at_least=3) == 3
    assert len(DeltaTable(table).file_uris()) == 1


def test_compaction_beside_a_busy_writer_commits_and_loses_nothing(table):
    """A writer appends (and checkpoints every 100 versions) while the compaction reads and commits:
    delta-rs's compaction gives up there after 15 attempts; this one commits past every winner."""
    with DeltaAppender(table) as appender:
        for i in range(50):
            appender.append(rows(f"before-{i}"))
        with busy_writer(appender) as written, DeltaAppender(table, checkpoints=False) as compactor:
            removed = compactor.compact()  # the 50, and what the writer committed before its snapshot
    ids = DeltaTable(table).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == sorted([f"before-{i}" for i in range(50)] + written) and len(written) > 0
    assert removed >= 50 and len(DeltaTable(table).file_uris()) == 50 + len(written) - removed + 1


def test_properties_set_beside_a_busy_writer_commit_and_the_writer_takes_them_in(table):
    """delta-rs's alter gives up beside a writer committing continuously; set_properties commits past every
    winner, and the writer reads the new configuration (its checkpoint interval) from the commit."""
    with DeltaAppender(table) as appender:
        with busy_writer(appender) as written, DeltaAppender(table, checkpoints=False) as maintainer:
            version = maintainer.set_properties({"delta.checkpointInterval": "7", "delta.logRetentionDuration": "interval 2 hours"})
            # Taken in by the writer's next append after that commit (under load, possibly not the first one).
            wait_until(lambda: appender._checkpoint_interval == 7, 30)
    delta = DeltaTable(table)
    assert delta.metadata().configuration["delta.checkpointInterval"] == "7"
    assert delta.metadata().configuration["delta.logRetentionDuration"] == "interval 2 hours"
    assert [entry["version"] for entry in delta.history() if entry["operation"] == "SET TBLPROPERTIES"] == [version]
    assert sorted(delta.to_pyarrow_table().column("id").to_pylist()) == sorted(written) and len(written) > 0


def test_a_property_change_made_on_an_outdated_configuration_backs_off(table):
    with DeltaAppender(table, checkpoints=False) as first, DeltaAppender(table, checkpoints=False) as second:
        assert first.set_properties({"delta.checkpointInterval": "7"}) == 1
        assert second.set_properties({"delta.logRetentionDuration": "interval 2 hours"}) is None  # it would undo the first
        assert second.set_properties({"delta.logRetentionDuration": "interval 2 hours"}) == 2  # now on top of it
    assert {key: value for key, value in DeltaTable(table).metadata().configuration.items() if key.startswith("delta.")} \
        == {"delta.checkpointInterval": "7", "delta.logRetentionDuration": "interval 2 hours"}


def test_of_two_compactions_of_the_same_files_one_commits_and_the_other_backs_off(table):
    with DeltaAppender(table) as appender:
        for i in range(4):
            appender.append(rows(f"r{i}"))
    with DeltaAppender(table, checkpoints=False) as first, DeltaAppender(table, checkpoints=False) as second:
        assert first.compact() == 4
        assert second.compact() == 0  # its snapshot's files were removed by the first: nothing committed
    delta = DeltaTable(table)
    assert sorted(delta.to_pyarrow_table().column("id").to_pylist()) == ["r0", "r1", "r2", "r3"]
    assert len(delta.file_uris()) == 1 and delta.version() == 5


class HighestDraw:
    """Stands in for ``random.Random``: every uniform draw is its upper bound, and the bounds are kept."""

    def __init__(self):
        self.bounds = []

    def uniform(self, low, high):
        self.bounds.append((low, high))
        return high


def test_the_backoff_after_a_lost_race_starts_at_the_round_trip_doubles_and_is_jittered_up_to_its_cap():
    draws = HighestDraw()
    backoff = CommitBackoff(draws, max_s=0.5)
    assert [backoff.delay(lost, round_trip_s=0.03) for lost in (1, 2, 3, 4, 5, 6)] == \
        [pytest.approx(d) for d in (0.03, 0.06, 0.12, 0.24, 0.48, 0.5)]
    assert draws.bounds[0] == (pytest.approx(0.015), pytest.approx(0.03))  # between half and all: never at once
    assert backoff.delay(1, round_trip_s=0.0) == pytest.approx(backoff.min_round_trip_s)  # a local disk's microseconds
    seeded = CommitBackoff(__import__("random").Random(3))
    assert all(0.0125 <= seeded.delay(1, 0.025) <= 0.025 for _ in range(200))


class SteppingClock:
    """An appender's clock: each reading is ``step`` seconds after the one before (every request takes that)."""

    def __init__(self, step):
        self.now, self.step = 100.0, step

    def __call__(self):
        self.now += self.step
        return self.now


def test_a_lost_race_backs_off_then_reads_the_winners_commits_and_nothing_else_and_is_counted(table, monkeypatch, caplog):
    """The loser waits a jittered, doubling backoff (never at once), reads each winner's commit once and the
    first version not made yet, and never _last_checkpoint again; every lost race is counted and logged."""
    delays, reads, wins_left = [], [], [2]  # what the loser waited and read; commits the winner still makes
    real_read = LocalFileStore.read
    with DeltaAppender(table, checkpoints=False) as winner:
        def read(files, key, *args, **kwargs):
            found = real_read(files, key, *args, **kwargs)
            if files is loser._files:
                reads.append((key, found is not None))
                if found is None and key.endswith(".json") and wins_left[0]:
                    wins_left[0] -= 1
                    winner.append(rows(f"won-{wins_left[0]}"))  # the winner commits again before the loser tries
            return found

        draws = HighestDraw()
        loser = DeltaAppender(table, checkpoints=False, backoff=CommitBackoff(draws), clock=SteppingClock(0.025),
                              sleep=delays.append)
        assert winner.append(rows("first")) == 1
        monkeypatch.setattr(LocalFileStore, "read", read)
        lost_before = storage_request_counts().commit_races_lost
        with caplog.at_level(logging.DEBUG, logger="coordinator.appender"):
            version = loser.append(rows("late"))
        loser.close()

    assert version == 4
    assert delays == [pytest.approx(d) for d in (0.025, 0.05, 0.1)]
    commit = "_delta_log/{:020d}.json".format
    assert reads == [("_delta_log/_last_checkpoint", False),
                     (commit(1), True), (commit(2), False),   # the race for 1 lost; 2 is made meanwhile
                     (commit(2), True), (commit(3), False),   # the race for 2 lost; 3 is made meanwhile
                     (commit(3), True), (commit(4), False)]   # the race for 3 lost; 4 is free
    assert storage_request_counts().commit_races_lost == lost_before + 3
    lost = [record for record in caplog.records if "race" in record.getMessage()]
    assert [record.levelno for record in lost] == [logging.DEBUG, logging.INFO, logging.DEBUG, logging.DEBUG]
    assert "1 commit race(s) lost" in lost[1].getMessage()  # then summed up at most once a minute
    assert sorted(DeltaTable(table).to_pyarrow_table().column("id").to_pylist()) == ["first", "late", "won-0", "won-1"]


def test_a_prepared_append_is_committed_after_the_commit_in_flight_and_loses_nothing(table):
    with DeltaAppender(table) as appender:
        first, second = appender.prepare(rows("a")), appender.prepare(rows("b"))
        assert DeltaTable(table).version() == 0  # both data files written, nothing committed yet
        assert [appender.commit(first), appender.commit(second)] == [1, 2]
        assert appender.prepare(rows("again"), app_transaction=("app", 1)) is not None
        replay = appender.prepare(rows("replayed"), app_transaction=("app", 1))
        assert appender.append(rows("c"), app_transaction=("app", 1)) == 3
        assert appender.commit(replay) is None  # recorded meanwhile: its data file deleted
    assert sorted(DeltaTable(table).to_pyarrow_table().column("id").to_pylist()) == ["a", "b", "c"]
