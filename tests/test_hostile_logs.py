"""What a group can write into its own commit log costs that log alone (docs/design.md#hostile-input): bytes that
cannot be read, parsed, typed or placed are refused into ``system/rejected`` with the reason, the log and the
version, the batch goes on, another group's transaction in the same batch is delivered, and a replay refuses
the same way. Batches are run on the driver alone (no JVM), as the checker runs them."""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bench.harness import end_record, half_record
from coordinator.checker.segment import MAX_DATA_FILE_ROWS
from coordinator.lakehouse import Lakehouse, create_table, delta_log_file, read_table
from coordinator.lakehouse.deltalog import MAX_COMMIT_FILE_BYTES
from coordinator.tables import COMMIT_LOG
from tests.conftest import ManualChecker, stored_time

HOSTILE = "mallory"


@pytest.fixture
def batches(config) -> ManualChecker:
    return ManualChecker(None, config)


class HostileLog:
    """Raw commits in group ``mallory``'s own log, as its principal may write them: any bytes at all."""

    def __init__(self, lakehouse: str) -> None:
        self.path = Lakehouse(lakehouse).commit_log(HOSTILE)
        create_table(COMMIT_LOG, self.path)
        self.version = len([n for n in os.listdir(os.path.join(self.path, "_delta_log")) if n.endswith(".json")])

    def commit(self, data: bytes) -> int:
        """``data`` as the log's next version; that version."""
        version = self.version
        with open(os.path.join(self.path, "_delta_log", os.path.basename(delta_log_file(version))), "wb") as file:
            file.write(data)
        self.version += 1
        return version

    def add(self, path: str) -> int:
        """A commit adding ``path`` (as written, unencoded) with new data."""
        return self.commit(json.dumps({"add": {"path": path, "size": 1, "partitionValues": {}, "modificationTime": 0,
                                               "dataChange": True}}).encode())

    def data_file(self, name: str, data: bytes) -> str:
        with open(os.path.join(self.path, name), "wb") as file:
            file.write(data)
        return name

    def parquet(self, name: str, table: pa.Table) -> str:
        pq.write_table(table, os.path.join(self.path, name))
        return name

    def records(self, *rows: dict) -> int:
        """A well-formed commit of ``rows`` (commit-log records); its version."""
        columns = {name: [row.get(name) for row in rows] for name in COMMIT_LOG.column_names}
        columns["properties"] = [list((value or {}).items()) for value in columns["properties"]]
        return self.add(self.parquet(f"part-{uuid.uuid4().hex}.parquet",
                                     pa.table(columns, schema=COMMIT_LOG.arrow_schema())))


def honest_commit(batches: ManualChecker) -> str:
    """A transaction of group ``alice``, half and commit in one batch."""
    transaction_id = f"alice-{uuid.uuid4().hex[:8]}"
    batches.write(half_record(transaction_id, group="alice", topic="ORDERS"))
    batches.write(end_record(transaction_id, group="alice"))
    return transaction_id


def rejected_from(batches: ManualChecker) -> list[dict]:
    return [row for row in read_table(batches.path("rejected")).to_pylist() if row["commit_log"] and HOSTILE in row["commit_log"]]


def delivered(batches: ManualChecker, transaction_id: str) -> int:
    return read_table(batches.path("ORDERS"), filter=pc.field("transaction_id") == transaction_id).num_rows


POISONS = {
    "a commit that is not JSON": (lambda log: log.commit(b"{not json"), "line 1 is not JSON"),
    "a commit line that is not an object": (lambda log: log.commit(b'["add"]'), "line 1 is not a JSON object"),
    "JSON nested beyond parsing": (lambda log: log.commit(b"[" * 200_000 + b"]" * 200_000), "is not JSON"),
    "an add without a path": (lambda log: log.commit(b'{"add": {"size": 1}}'), "an add action without a string path"),
    "a commit too large to be a commit": (lambda log: log.commit(b" " * (MAX_COMMIT_FILE_BYTES + 1)),
                                          f"at most {MAX_COMMIT_FILE_BYTES} are read"),
    "a data file that is not Parquet": (lambda log: log.add(log.data_file("junk.parquet", b"PAR1 not really")),
                                        "cannot be read as commit-log records"),
    "an add naming a missing file": (lambda log: log.add("part-00000-gone.parquet"), "is missing"),
    "ill-typed columns": (lambda log: log.add(log.parquet("typed.parquet", pa.table(
        {name: pa.array([[1]]) for name in COMMIT_LOG.column_names}))), "cannot be read as commit-log records"),
    "only record_id": (lambda log: log.add(log.parquet("thin.parquet", pa.table({"record_id": ["r"]}))),
                       "lacks the commit log's column(s) kind"),
    "rows beyond any commit (a decompression bomb)": (
        lambda log: log.add(log.parquet("bomb.parquet", pa.table({"record_id": pa.nulls(MAX_DATA_FILE_ROWS + 1,
                                                                                        pa.string())}))),
        f"at most {MAX_DATA_FILE_ROWS} are read"),
    "a path double percent-encoded": (lambda log: log.add("%252E%252E/%252E%252E/alice/commit_log/x.parquet"),
                                      "data file outside the commit log's directory"),
    "a path climbing out": (lambda log: log.add("../../alice/commit_log/x.parquet"),
                            "data file outside the commit log's directory"),
    "an absolute URI": (lambda log: log.add("file:///etc/passwd"), "data file outside the commit log's directory"),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_version_is_refused_for_its_log_alone_and_the_batch_goes_on(batches, config, poison):
    write, reason = POISONS[poison]
    version = write(HostileLog(config.lakehouse))
    honest = honest_commit(batches)

    batches.run()

    assert delivered(batches, honest) == 1
    [refused] = rejected_from(batches)
    assert reason in refused["reason"] and refused["commit_version"] == version
    assert refused["commit_log"] == f"groups/{HOSTILE}/commit_log"
    batches.replay()  # a replay refuses the same, and writes nothing twice
    assert rejected_from(batches) == [refused] and delivered(batches, honest) == 1


def test_a_poisoned_version_between_good_ones_costs_only_itself(batches, config):
    log = HostileLog(config.lakehouse)
    log.records(half_record("m-1", group=HOSTILE, topic="ORDERS"))
    bad = log.commit(b"\x00\xff")
    log.records(end_record("m-1", group=HOSTILE))

    batches.run()

    assert delivered(batches, "m-1") == 1
    assert [row["commit_version"] for row in rejected_from(batches)] == [bad]


def test_files_that_are_no_instance_records_cost_their_group_alone_and_are_removed(batches, config):
    lakehouse = Lakehouse(config.lakehouse)
    producers = lakehouse.key_path(f"{lakehouse.group_dir(HOSTILE)}/_producers")
    os.makedirs(producers)
    record = {"group": HOSTILE, "instance_id": "i-1", "host": "h", "pid": 1, "pid_namespace": None, "started": None,
              "last_seen": None, "heartbeat_s": 2.0}
    files = {"i-1.json": json.dumps(record).encode(), "i-2.json": b"{nope", "i-3.json": b" " * 5000,
             "i-4.json": json.dumps(record | {"instance_id": "i-4", "group": "alice", "last_seen": 1.0}).encode()}
    for name, data in files.items():
        with open(os.path.join(producers, name), "wb") as file:
            file.write(data)
    for group in (HOSTILE, "alice"):
        batches.write(half_record(f"{group}-t", group=group, topic="ORDERS"))
    batches.run()

    batches.run(now=stored_time(batches, "alice-t") + dt.timedelta(seconds=7))  # both due for their first check

    checked = read_table(batches.path("check_requests")).column("transaction_id").to_pylist()
    assert sorted(checked) == ["alice-t", f"{HOSTILE}-t"]
    refused = {row["commit_log"].rsplit("/", 1)[-1]: row["reason"] for row in rejected_from(batches)}
    assert sorted(refused) == sorted(files) and all(r.startswith("not a producer instance's record") for r in refused.values())
    assert "last_seen is NoneType" in refused["i-1.json"] and "at most 4096" in refused["i-3.json"]
    assert "names group 'alice'" in refused["i-4.json"]
    assert os.listdir(producers) == []


def test_maintain_reports_a_log_it_cannot_maintain_and_maintains_the_others(batches, config, tmp_path, capsys):
    from coordinator.cli import main

    honest_commit(batches)
    HostileLog(config.lakehouse).commit(b"{not json")  # delta-rs cannot load the table (on S3, a '..' path does as much)
    conf = tmp_path / "coordinator.toml"
    conf.write_text(f"lakehouse = {json.dumps(config.lakehouse)}\n")

    code = main(["maintain", "--config", str(conf), "--json"])

    out, err = capsys.readouterr()
    results = {table["table"]: table for table in json.loads(out)["tables"]}
    assert code == 1 and f"groups/{HOSTILE}/commit_log could not be maintained" in err
    assert results[f"groups/{HOSTILE}/commit_log"]["failed"]
    assert results["groups/alice/commit_log"]["failed"] is None and results["groups/alice/commit_log"]["version"] >= 2


def test_the_operator_tools_read_past_a_poisoned_log(batches, config, tmp_path, capsys):
    from coordinator.cli import main
    from coordinator.ops.audit import transaction_timeline

    honest = honest_commit(batches)
    HostileLog(config.lakehouse).commit(b"{not json")
    batches.run()
    conf = tmp_path / "coordinator.toml"
    conf.write_text(f"lakehouse = {json.dumps(config.lakehouse)}\n")

    [unreadable] = transaction_timeline(config.lakehouse, "never-sent")  # every log is searched for an unknown id
    assert (unreadable.step, unreadable.table) == ("log unreadable", f"groups/{HOSTILE}/commit_log")
    assert [e.step for e in transaction_timeline(config.lakehouse, honest)][-1] == "delivered"
    for command in (["inspect", "never-sent"], ["inspect", honest], ["pending"]):
        assert main([*command, "--config", str(conf)]) == 0, command
    assert main(["status", "--config", str(conf)]) == 1  # as it says: no checker runs
    out = capsys.readouterr().out
    assert "log unreadable" in out and "rejected       1 record(s)" in out
