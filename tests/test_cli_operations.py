"""``txcoord status``, ``inspect`` and ``maintain`` as operators run them, against the session's demo lakehouse.

The answers are checked against the tables themselves, not against constants.
"""

from __future__ import annotations

import json
import shutil

import pytest
from deltalake import DeltaTable

from coordinator.commit_logs import CommitLogs
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.ops.audit import transaction_timeline
from coordinator.ops.maintenance import COMMIT_LOG_COMPACTION_MIN_FILES, maintained_tables
from coordinator.tables import CHECK_REQUESTS, DISCARDED, METRICS, OP
from tests.test_cli import txcoord

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_config(demo) -> str:
    lakehouse, _, _ = demo
    return str(lakehouse / "demo.toml")


def column(path, name: str) -> list:
    return read_table(str(path), [name]).column(name).to_pylist()


def test_status_after_the_demo_reports_a_stopped_checker_and_what_the_tables_hold(demo, demo_config):
    lakehouse, _, _ = demo

    text = txcoord("status", "--config", demo_config)
    as_json = txcoord("status", "--config", demo_config, "--json")

    assert (text.returncode, as_json.returncode) == (1, 1)  # 1: no live checker (the demo stopped it)
    status = json.loads(as_json.stdout)
    assert status["checker_alive"] is False
    assert status["pending_transactions"] == 0
    assert status["checks_issued"] == len(column(Lakehouse(lakehouse).path(CHECK_REQUESTS), "transaction_id")) > 0
    assert status["discarded"] == len(set(column(Lakehouse(lakehouse).path(DISCARDED), "transaction_id"))) > 0
    assert status["last_batch_id"] == max(column(Lakehouse(lakehouse).path(METRICS), "batch_id"))
    logs = CommitLogs(Lakehouse(lakehouse))
    assert "groups/order_group/commit_log" in [ref.key for ref in logs.discover()]
    # the versions written over every commit log: the demo's group's and the operators'
    assert status["commit_log_versions"] == sum(DeltaTable(logs.path(ref)).version() + 1 for ref in logs.discover())
    assert 0 <= status["lag_versions"] <= 1  # an answer to the last check may arrive after the last batch
    lines = dict(line.split(None, 1) if " " in line else (line, "") for line in text.stdout.splitlines())
    assert lines["checker"].startswith("not running")
    assert lines["discarded"] == f"{status['discarded']} transaction(s)"


def test_inspect_prints_a_discarded_transactions_timeline(demo, demo_config):
    lakehouse, _, _ = demo
    discarded = column(Lakehouse(lakehouse).path(DISCARDED), "transaction_id")[0]

    text = txcoord("inspect", discarded, "--config", demo_config)
    as_json = txcoord("inspect", discarded, "--config", demo_config, "--json")

    assert (text.returncode, as_json.returncode) == (0, 0), text.stderr
    document = json.loads(as_json.stdout)
    assert document["outcome"] == "DISCARD"
    assert document["events"] == [event.to_dict() for event in transaction_timeline(str(lakehouse), discarded)]
    steps = [event["step"] for event in document["events"]]
    assert steps[0] == "half sent" and steps[-2:] == ["resolved", "discarded"] and steps.count("check requested") == 3
    assert text.stdout.startswith(f"transaction {discarded}: DISCARD, {len(steps)} events")
    assert len(text.stdout.splitlines()) == 2 + len(steps)  # header, column titles, one line per event


def test_inspect_of_a_committed_transaction_shows_its_delivery(demo, demo_config):
    lakehouse, _, _ = demo
    committed = next(row["transaction_id"] for row in read_table(Lakehouse(lakehouse).path(OP), ["transaction_id", "outcome"]).to_pylist()
                     if row["outcome"] == "COMMIT")

    document = json.loads(txcoord("inspect", committed, "--config", demo_config, "--json").stdout)

    assert document["outcome"] == "COMMIT"
    assert [e["table"] for e in document["events"] if e["step"] == "delivered"] == ["topics/ORDER_TOPIC"]


def test_inspect_of_an_unknown_transaction_exits_1(demo_config):
    result = txcoord("inspect", "no-such-transaction", "--config", demo_config)
    assert result.returncode == 1
    assert result.stdout.strip() == "no table mentions transaction no-such-transaction"


def test_maintain_compacts_a_copy_of_the_demo_and_changes_no_row(demo, tmp_path):
    lakehouse = tmp_path / "lakehouse"
    shutil.copytree(demo[0], lakehouse)  # the session's demo stays as the demo left it
    config = tmp_path / "maintain.toml"
    config.write_text(f"lakehouse = {json.dumps(str(lakehouse))}\n")
    tables = maintained_tables(str(lakehouse))

    def rows() -> dict[str, list]:
        return {name: sorted(map(repr, read_table(str(lakehouse / name)).to_pylist())) for name in tables}

    before = rows()
    as_json = txcoord("maintain", "--config", str(config), "--json")
    text = txcoord("maintain", "--config", str(config))

    assert (as_json.returncode, text.returncode) == (0, 0), as_json.stderr + text.stderr
    results = {r["table"]: r for r in json.loads(as_json.stdout)["tables"]}
    assert list(results) == tables
    compacted = [r for r in results.values()
                 if r["files_before"] > 1 and not r["table"].endswith(("commit_log", "check_requests"))]
    assert compacted and all(r["files_after"] == 1 for r in compacted)
    # A commit log's few files are left to the writer that compacts its own appends (COMMIT_LOG_COMPACTION_MIN_FILES).
    group_log = results["groups/order_group/commit_log"]
    assert 1 < group_log["files_before"] < COMMIT_LOG_COMPACTION_MIN_FILES and group_log["files_after"] == group_log["files_before"]
    assert rows() == before
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["table", "files", "compacted", "vacuumed", "version", "skipped"]
    assert [line.split()[0] for line in lines[1:-1]] == tables  # the second run: one line per table, then the total
    assert lines[-1].startswith(f"{len(tables)} table(s) maintained")
