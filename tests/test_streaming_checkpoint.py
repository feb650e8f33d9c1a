"""A lost, foreign or stale checkpoint is refused at start, and recovery neither re-delivers nor drops."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from deltalake import DeltaTable

from coordinator.checker.query import CheckerQuery
from coordinator.checker.query import checkpoint_location
from coordinator.commit_logs import CommitLogs
from coordinator.control.progress import (BatchRecord, CheckerProgress, Epoch, Progress, StreamingCheckpoint,
                                         verify_streaming_checkpoint)
from coordinator.exceptions import CheckpointMismatchError, OutdatedLakehouseError
from coordinator.lakehouse import SHARED_LOG_KEY, Lakehouse, create_group_tables, create_table, read_table
from coordinator.tables import COMMIT_LOG, OP, REJECTED
from support import end_record, half_record, wait_until
from support.lakehouse import append_rows

RECORD = "/lh/system/_checker_progress.json"
LOG = "groups/g/commit_log"


def progress(checkpoint_id="q1", first_batch_id=0, last_batch_id=None) -> Progress:
    last = None if last_batch_id is None else BatchRecord(last_batch_id, last_batch_id - first_batch_id, starts={LOG: 3},
                                                          ends={LOG: 5}, now_us=10)
    return Progress(Epoch(number=0, first_batch_id=first_batch_id, starting_versions={}, checkpoint_id=checkpoint_id), last)


def test_the_checkpoint_the_lakehouse_was_served_by_is_accepted():
    verify_streaming_checkpoint(progress(last_batch_id=7), StreamingCheckpoint(True, "q1", last_planned_batch=7), RECORD)
    verify_streaming_checkpoint(progress(last_batch_id=7), StreamingCheckpoint(True, "q1", last_planned_batch=8), RECORD)
    # A new epoch, not started:
    verify_streaming_checkpoint(progress(checkpoint_id=None), StreamingCheckpoint(False), RECORD)


@pytest.mark.parametrize("checkpoint, problem", [
    (StreamingCheckpoint(False), "checkpoint is missing"),
    (StreamingCheckpoint(True, "q2", last_planned_batch=9), "belongs to query q2, not to q1"),
    (StreamingCheckpoint(True, "q1", last_planned_batch=5), "stops at batch 5, older than batch 7"),
    (StreamingCheckpoint(True, "q1", last_planned_batch=None), "stops at batch none"),
])
def test_a_missing_foreign_or_stale_checkpoint_is_refused_with_the_way_out(checkpoint, problem):
    with pytest.raises(CheckpointMismatchError, match=problem) as refused:
        verify_streaming_checkpoint(progress(last_batch_id=7), checkpoint, RECORD)
    assert "--recover-checkpoint" in str(refused.value)


def test_a_checkpoint_of_an_earlier_source_is_read_as_such_and_refused_with_the_way_out(tmp_path):
    """Checkers before the commit-log source kept Delta change-feed offsets, and checkers of the one shared
    commit log the version of that log: continuing with per-group logs goes through recovery."""
    (tmp_path / "offsets").mkdir()
    (tmp_path / "metadata").write_text('{"id":"q1"}')
    (tmp_path / "offsets" / "7").write_text('v1\n{"batchWatermarkMs":0}\n'
                                             '{"sourceVersion":1,"reservoirId":"r","reservoirVersion":12,"index":-1}\n')
    checkpoint = StreamingCheckpoint.read(str(tmp_path))
    assert (checkpoint.checkpoint_id, checkpoint.last_planned_batch, checkpoint.outdated_offsets) == ("q1", 7, True)
    with pytest.raises(CheckpointMismatchError, match="change feed.*--recover-checkpoint"):
        verify_streaming_checkpoint(progress(last_batch_id=7), checkpoint, RECORD)
    (tmp_path / "offsets" / "8").write_text('v1\n{"batchWatermarkMs":0}\n{"version":13,"clock_us":5}\n')
    checkpoint = StreamingCheckpoint.read(str(tmp_path))
    assert (checkpoint.last_planned_batch, checkpoint.outdated_offsets) == (8, True)
    with pytest.raises(CheckpointMismatchError, match="one commit log shared by every group.*--recover-checkpoint"):
        verify_streaming_checkpoint(progress(last_batch_id=7), checkpoint, RECORD)
    (tmp_path / "offsets" / "9").write_text('v1\n{"batchWatermarkMs":0}\n{"versions":{"%s":13},"clock_us":5}\n' % LOG)
    assert not StreamingCheckpoint.read(str(tmp_path)).outdated_offsets
    verify_streaming_checkpoint(progress(last_batch_id=7), StreamingCheckpoint.read(str(tmp_path)), RECORD)


def test_a_progress_record_of_the_shared_commit_log_is_read_as_such_and_refused_at_start_with_the_way_out(spark, config):
    """A checker of the one shared commit log wrote its progress in the earlier format: it is still read, as
    that log's, and a checker of per-group logs starts from it only through ``txcoord upgrade``."""
    lakehouse = Lakehouse(config.lakehouse)
    earlier = {"epoch": {"number": 2, "first_batch_id": 40, "starting_version": 30, "checkpoint_id": "q1"},
               "last_batch": {"batch_id": 47, "stream_batch_id": 7, "first_version": 33, "last_version": 34,
                              "next_version": 35, "now_us": 10, "pending_from": 9}}
    lakehouse.files.put("system/_checker_progress.json", json.dumps(earlier).encode())

    loaded = CheckerProgress(lakehouse).load()
    assert loaded.epoch == Epoch(number=2, first_batch_id=40, starting_versions={SHARED_LOG_KEY: 30},
                                 checkpoint_id="q1", shared_log=True)
    assert loaded.last_batch == BatchRecord(47, 7, starts={SHARED_LOG_KEY: 33}, ends={SHARED_LOG_KEY: 35}, now_us=10,
                                            pending_from=9, shared_log=True)
    assert (loaded.next_versions, loaded.oldest_needed_versions, loaded.next_batch_id) == (
        {SHARED_LOG_KEY: 35}, {SHARED_LOG_KEY: 33}, 48)
    heartbeat = dict(earlier, last_batch=dict(earlier["last_batch"], first_version=None, last_version=None))
    lakehouse.files.put("system/_checker_progress.json", json.dumps(heartbeat).encode())
    assert CheckerProgress(lakehouse).load().last_batch.starts == {SHARED_LOG_KEY: 35}  # a batch of a clock tick only
    lakehouse.files.put("system/_checker_progress.json", json.dumps(earlier).encode())

    # Its lakehouse still holds the shared log: the checker refuses it until `txcoord upgrade`.
    create_table(COMMIT_LOG, lakehouse.key_path(SHARED_LOG_KEY))
    with pytest.raises(OutdatedLakehouseError, match="share one commit log.*txcoord upgrade"):
        CheckerQuery(spark, config).start()
    # Its checkpoint kept the shared log's offsets: refused too, with the way out.
    location = checkpoint_location(config)
    os.makedirs(os.path.join(location, "offsets"))
    with open(os.path.join(location, "metadata"), "w") as metadata:
        metadata.write('{"id":"q1"}')
    with open(os.path.join(location, "offsets", "7"), "w") as offsets:
        offsets.write('v1\n{"batchWatermarkMs":0}\n{"version":35,"clock_us":10}\n')
    with pytest.raises(CheckpointMismatchError, match="one commit log shared by every group.*--recover-checkpoint"):
        CheckerProgress(lakehouse).begin(StreamingCheckpoint.read(location))


def test_batch_ids_of_a_later_epoch_continue_from_the_last_recorded_batch(tmp_path):
    store = CheckerProgress(str(tmp_path))
    store.save(progress(first_batch_id=0, last_batch_id=7))
    following = store.next_epoch(store.load())
    assert following.epoch == Epoch(number=1, first_batch_id=8, starting_versions={LOG: 5}, checkpoint_id=None)
    assert store.load() == following
    with pytest.raises(CheckpointMismatchError, match="stops at batch 9, older than batch 10"):
        verify_streaming_checkpoint(progress(first_batch_id=8, last_batch_id=10), StreamingCheckpoint(True, "q1", 1),
                                    RECORD)


def delivered(lakehouse: str, topic: str = "T") -> list[str]:
    path = Lakehouse(lakehouse).topic(topic)
    return sorted(read_table(path, ["transaction_id"]).column("transaction_id").to_pylist()) if DeltaTable.is_deltatable(path) else []


def commit(lakehouse: str, *transaction_ids: str) -> None:
    """Commit ``transaction_ids`` through group g's own commit log: their halves, then their ENDs."""
    create_group_tables(lakehouse, "g")
    log = Lakehouse(lakehouse).commit_log("g")
    append_rows(log, COMMIT_LOG, [half_record(t) for t in transaction_ids])
    append_rows(log, COMMIT_LOG, [end_record(t) for t in transaction_ids])


def commit_and_await_delivery(lakehouse: str, transaction_id: str) -> None:
    """Commit ``transaction_id`` and wait (up to 120 s) for a running checker to deliver it, once."""
    expected = sorted([*delivered(lakehouse), transaction_id])
    commit(lakehouse, transaction_id)
    wait_until(lambda: delivered(lakehouse) == expected, 120)


def test_lost_checkpoint_after_a_crash_mid_batch_is_recovered_without_loss_or_duplicate(spark, config, monkeypatch, tmp_path):
    import coordinator.checker.writer as writer

    config = config.replace(trigger_interval_ms=500)
    lakehouse = config.lakehouse
    checker = CheckerQuery(spark, config).start()
    try:
        commit_and_await_delivery(lakehouse, "before")
    finally:
        checker.stop()

    # The next batch dies between its topic write and its op write...
    real_append = writer.TableWriter.append

    def crash_on_op(self, path, data, batch_id, **options):
        # Only the batch that resolves "in-flight": a stopped query may replay its last batch first.
        if path.endswith("/system/op") and "in-flight" in data.column("transaction_id").to_pylist():
            raise RuntimeError("simulated crash after the topic was written")
        return real_append(self, path, data, batch_id, **options)

    monkeypatch.setattr(writer.TableWriter, "append", crash_on_op)
    commit(lakehouse, "in-flight")
    checker = CheckerQuery(spark, config).start()
    try:
        with pytest.raises(Exception, match="simulated crash"):
            checker.await_termination(120)
    finally:
        checker.stop()
    monkeypatch.setattr(writer.TableWriter, "append", real_append)
    in_flight_ops = read_table(Lakehouse(lakehouse).path(OP), ["transaction_id"]).column("transaction_id").to_pylist()
    assert in_flight_ops.count("in-flight") == 0 and delivered(lakehouse) == ["before", "in-flight"]

    # ...and then its checkpoint is lost. Starting anyway would restart at version 0.
    shutil.rmtree(checkpoint_location(config))
    with pytest.raises(CheckpointMismatchError, match="checkpoint is missing"):
        CheckerQuery(spark, config).start()

    recovered = CheckerQuery(spark, config).recover()
    assert delivered(lakehouse) == ["before", "in-flight"]  # the announced batch, completed exactly once
    assert recovered.epoch.number == 1
    # The new checkpoint starts after the last version of each log: one nobody has written yet.
    logs = CommitLogs(Lakehouse(lakehouse))
    assert [ref.key for ref in logs.discover()] == [LOG, "operators/commit_log"]
    assert recovered.epoch.starting_versions == {ref.key: DeltaTable(logs.path(ref)).version() + 1 for ref in logs.discover()}
    checker = CheckerQuery(spark, config).start()
    try:
        commit_and_await_delivery(lakehouse, "after")  # delivered: after, before, in-flight
        commit(lakehouse, "later")
        wait_until(lambda: "later" in delivered(lakehouse), 120)
    finally:
        checker.stop()

    assert delivered(lakehouse) == ["after", "before", "in-flight", "later"]
    ops = read_table(Lakehouse(lakehouse).path(OP), ["transaction_id"]).column("transaction_id").to_pylist()
    assert sorted(ops) == ["after", "before", "in-flight", "later"]
    assert read_table(Lakehouse(lakehouse).path(REJECTED)).num_rows == 0  # nothing was read twice

    # A checkpoint from another lakehouse is refused too.
    other = tmp_path / "other-checkpoint"
    shutil.copytree(checkpoint_location(config), other)
    (other / "metadata").write_text('{"id":"00000000-0000-0000-0000-000000000000"}')
    shutil.rmtree(checkpoint_location(config))
    shutil.copytree(other, checkpoint_location(config))
    with pytest.raises(CheckpointMismatchError, match="belongs to query 00000000"):
        CheckerQuery(spark, config).start()
