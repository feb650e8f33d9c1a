"""Checkpoints carried forward from the previous one hold what delta-rs's own rebuild holds, and both
delta-rs and Spark read a table from them alone."""

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from coordinator.appender import DeltaAppender
from coordinator.lakehouse.checkpoints import write_delta_checkpoint

SCHEMA = pa.schema([("id", pa.string()), ("n", pa.int64())])
MINUTE_MS = 60_000


def rows(*ids):
    return pa.table({"id": list(ids), "n": list(range(len(ids)))}, schema=SCHEMA)


@pytest.fixture
def table(tmp_path):
    """A table checkpointed by delta-rs at version 4, then appended to, compacted and appended to again,
    with application transactions before and after the checkpoint: version 10."""
    path = str(tmp_path / "table")
    DeltaTable.create(path, schema=SCHEMA, configuration={"delta.deletedFileRetentionDuration": "interval 10 minutes"})
    with DeltaAppender(path, checkpoints=False) as appender:
        for i in range(4):
            appender.append(rows(f"a{i}"), app_transaction=("checker", i))
        DeltaTable(path).create_checkpoint()
        appender.append(rows("b0"), app_transaction=("checker", 4))
        appender.append(rows("b1"), app_transaction=("other", 0))
        with DeltaAppender(path, checkpoints=False) as compactor:
            assert compactor.compact() == 6
        appender.append(rows("c0"), app_transaction=("checker", 5))
        appender.append(rows("c1"))
        assert appender.append(rows("c2")) == 10
    return path


def checkpoint(path, version):
    return pq.read_table(os.path.join(path, "_delta_log", f"{version:020d}.checkpoint.parquet"))


def state(checkpoint_rows: pa.Table) -> dict:
    """What a checkpoint says, in a form that ignores row order."""
    listed = checkpoint_rows.to_pylist()
    return {
        "add": sorted((r["add"]["path"], r["add"]["size"], r["add"]["stats"]) for r in listed if r["add"]),
        "remove": sorted(r["remove"]["path"] for r in listed if r["remove"]),
        "txn": sorted((r["txn"]["appId"], r["txn"]["version"]) for r in listed if r["txn"]),
        "metaData": [r["metaData"] for r in listed if r["metaData"]],
        "protocol": [r["protocol"] for r in listed if r["protocol"]],
    }


def last_checkpoint(path):
    with open(os.path.join(path, "_delta_log", "_last_checkpoint")) as pointer:
        return json.load(pointer)


def without_commits_up_to(path, version):
    """Delete the table's commits up to ``version`` (what a log cleanup does): only a checkpoint gives its state."""
    for old in range(version + 1):
        os.remove(os.path.join(path, "_delta_log", f"{old:020d}.json"))


def test_a_carried_checkpoint_holds_what_delta_rs_rebuilds(table, tmp_path):
    rebuilt = str(tmp_path / "rebuilt")
    shutil.copytree(table, rebuilt)
    DeltaTable(rebuilt).create_checkpoint()

    assert write_delta_checkpoint(table, 10) is True

    ours = state(checkpoint(table, 10))
    assert ours == state(checkpoint(rebuilt, 10))
    assert ours["txn"] == [("checker", 5), ("other", 0)]
    assert len(ours["add"]) == 4 and len(ours["remove"]) == 6  # the compacted file and 3 appends; its 6 sources
    assert last_checkpoint(table) | {"sizeInBytes": None} == last_checkpoint(rebuilt) | {"sizeInBytes": None}


def test_delta_rs_reads_the_table_from_a_carried_checkpoint_alone(table):
    expected = DeltaTable(table).to_pyarrow_table().sort_by("id")
    write_delta_checkpoint(table, 10)
    without_commits_up_to(table, 10)
    assert DeltaTable(table).to_pyarrow_table().sort_by("id") == expected
    assert DeltaTable(table).transaction_version("checker") == 5


def test_spark_reads_the_table_from_a_carried_checkpoint_alone(table, spark):
    write_delta_checkpoint(table, 10)
    with DeltaAppender(table, checkpoints=False) as appender:
        appender.append(rows("d0"))
    without_commits_up_to(table, 10)
    read = spark.read.format("delta").load(table)
    assert sorted(row.id for row in read.collect()) == ["a0", "a1", "a2", "a3", "b0", "b1", "c0", "c1", "c2", "d0"]


def test_tombstones_past_their_retention_are_left_out(table):
    removed_ms = max(remove["deletionTimestamp"] for remove in logged_removes(table))
    write_delta_checkpoint(table, 10, now_ms=removed_ms + 9 * MINUTE_MS)  # within the table's 10 minutes
    assert len(state(checkpoint(table, 10))["remove"]) == 6
    with DeltaAppender(table, checkpoints=False) as appender:
        appender.append(rows("d0"))
    assert write_delta_checkpoint(table, 11, now_ms=removed_ms + 11 * MINUTE_MS) is True  # from 10's, now expired
    assert state(checkpoint(table, 11))["remove"] == []
    assert len(state(checkpoint(table, 11))["add"]) == 5


def logged_removes(path):
    """The remove actions of the table's commits."""
    removes = []
    for name in sorted(os.listdir(os.path.join(path, "_delta_log"))):
        if name.endswith(".json"):
            with open(os.path.join(path, "_delta_log", name)) as commit:
                removes += [action["remove"] for action in map(json.loads, filter(str.strip, commit)) if "remove" in action]
    return removes


def test_what_cannot_be_carried_is_rebuilt_by_delta_rs(table, tmp_path):
    with DeltaAppender(table, checkpoints=False) as appender:
        assert appender.set_properties({"delta.checkpointInterval": "7"}) == 11
    assert write_delta_checkpoint(table, 11) is False  # a metadata change since the checkpoint at 4
    assert last_checkpoint(table)["version"] == 11
    assert dict(state(checkpoint(table, 11))["metaData"][0]["configuration"])["delta.checkpointInterval"] == "7"

    fresh = str(tmp_path / "fresh")
    DeltaTable.create(fresh, schema=SCHEMA)
    with DeltaAppender(fresh, checkpoints=False) as appender:
        appender.append(rows("x"))
    assert write_delta_checkpoint(fresh, 1) is False  # no checkpoint to carry forward
    assert last_checkpoint(fresh)["version"] == 1


def test_a_version_at_or_before_the_newest_checkpoint_is_left_alone(table):
    write_delta_checkpoint(table, 10)
    assert write_delta_checkpoint(table, 8) is False
    assert not os.path.exists(os.path.join(table, "_delta_log", f"{8:020d}.checkpoint.parquet"))
    assert last_checkpoint(table)["version"] == 10
