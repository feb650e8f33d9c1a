"""Every system table is read and written by both engines: delta-rs (producers, init) and Spark (checker)."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from coordinator.exceptions import InvalidArgumentError
from coordinator.lakehouse import Lakehouse, create_group_tables, init_lakehouse, read_table
from coordinator.tables import CHECK_REQUESTS, COMMIT_LOG, GROUP_CHECK_REQUESTS, SYSTEM_TABLES, TOPIC, TableDef
from support.lakehouse import append_rows

NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.timezone.utc)
SAMPLE = {"string": "s", "int": 1, "long": 2, "boolean": True, "binary": b"\x00\x01", "timestamp": NOW,
          "map<string,string>": {"k": "v"}, "map<string,long>": {"k": 3}}


MARKERS = ("from-delta-rs", "from-spark", "from-delta-rs-again")


def marker_column(table: TableDef) -> str:
    """The column that tells the test's rows apart: the first if it is a string, else ``transaction_id``,
    else the first (``system/metrics`` has no string column)."""
    names = dict(table.columns)
    if table.columns[0][1] != "string" and "transaction_id" in names:
        return "transaction_id"
    return table.columns[0][0]


def marker(table: TableDef, text: str):
    """``text`` in the marker column's type."""
    return text if dict(table.columns)[marker_column(table)] == "string" else MARKERS.index(text)


def sample_row(table: TableDef, text: str) -> dict:
    row = {name: SAMPLE[kind] for name, kind in table.columns}
    row[marker_column(table)] = marker(table, text)
    return row


def table_path(lakehouse: str, table: TableDef) -> str:
    """Where ``table`` lives: a system table's own place, a group's tables under group ``g``'s directory."""
    if table is COMMIT_LOG:
        return Lakehouse(lakehouse).commit_log("g")
    if table is GROUP_CHECK_REQUESTS:
        return Lakehouse(lakehouse).check_requests("g")
    return Lakehouse(lakehouse).path(table)


@pytest.mark.parametrize("table", (*SYSTEM_TABLES, COMMIT_LOG, GROUP_CHECK_REQUESTS), ids=lambda t: t.name)
def test_both_engines_read_and_write(spark, tmp_path, table):
    lakehouse = str(tmp_path / "lh")
    init_lakehouse(lakehouse)
    create_group_tables(lakehouse, "g")
    path = table_path(lakehouse, table)
    key = marker_column(table)

    append_rows(path, table, [sample_row(table, "from-delta-rs")])
    spark.createDataFrame([sample_row(table, "from-spark")], table.spark_ddl()).write.format("delta").mode("append").save(path)
    append_rows(path, table, [sample_row(table, "from-delta-rs-again")])

    seen_by_spark = spark.read.format("delta").load(path)
    seen_by_delta_rs = read_table(path)
    expected = sorted(marker(table, text) for text in MARKERS)
    assert sorted(r[key] for r in seen_by_spark.collect()) == expected
    assert sorted(seen_by_delta_rs.column(key).to_pylist()) == expected
    assert seen_by_spark.schema.simpleString() == spark.createDataFrame([], table.spark_ddl()).schema.simpleString()
    row = seen_by_spark.filter(seen_by_spark[key] == marker(table, "from-delta-rs")).first().asDict()
    for name, kind in table.columns:
        got = row[name]
        if kind == "timestamp":
            got = got.astimezone(dt.timezone.utc) if got.tzinfo else got.replace(tzinfo=dt.timezone.utc)
        if kind == "binary":
            got = bytes(got)
        if name != key:
            assert got == SAMPLE[kind], name
    protocol = DeltaTable(path).protocol()
    assert "timestampNtz" not in (protocol.writer_features or []) and "timestampNtz" not in (protocol.reader_features or [])


def test_topic_schema_matches_what_the_checker_writes(spark, checker):
    from support import end_record, half_record

    checker.write(half_record("t"))
    checker.write(end_record("t"))
    checker.run()
    topic = spark.read.format("delta").load(f"{checker.config.lakehouse}/topics/T")
    assert topic.schema.simpleString() == spark.createDataFrame([], TOPIC.spark_ddl()).schema.simpleString()
    assert read_table(f"{checker.config.lakehouse}/topics/T").num_rows == 1


def test_init_is_idempotent_and_needs_no_jvm(tmp_path):
    lakehouse = str(tmp_path / "lh")
    code = ("import sys; from coordinator.lakehouse import init_lakehouse; "
            f"print(len(init_lakehouse({lakehouse!r}))); assert 'pyspark' not in sys.modules")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # every system table and the operators' commit log; no group's tables (a group's come when it is added)
    assert (first.stdout.strip(), second.stdout.strip()) == (str(len(SYSTEM_TABLES) + 1), "0")
    assert Lakehouse(lakehouse).exists("operators/commit_log") and not os.path.exists(os.path.join(lakehouse, "groups"))


def test_an_older_lakehouse_is_named_as_such_until_init_adds_the_missing_column(tmp_path, capsys):
    from coordinator.cli import main

    lakehouse = str(tmp_path / "lh")
    init_lakehouse(lakehouse)
    requests = Lakehouse(lakehouse).path(CHECK_REQUESTS)
    shutil.rmtree(requests)  # as an older txcoord made it: no producer_instance column
    older = CHECK_REQUESTS.arrow_schema()
    write_deltalake(requests, older.empty_table().drop_columns(["producer_instance"]))
    config = tmp_path / "coordinator.toml"
    config.write_text(f"lakehouse = '{lakehouse}'\n")

    assert main(["status", "--config", str(config)]) == 2
    assert "has no column producer_instance: an older txcoord made it" in capsys.readouterr().err
    assert main(["init", "--config", str(config)]) == 0
    assert main(["status", "--config", str(config), "--json"]) == 1  # readable now; no checker is alive
    assert "producer_instance" in read_table(requests).column_names


def test_a_log_listed_while_a_commit_lands_is_opened_again(tmp_path, monkeypatch):
    import types

    from deltalake.exceptions import DeltaError

    from coordinator.lakehouse import delta, open_table

    path = str(tmp_path / "t")
    for value in range(4):
        write_deltalake(path, pa.table({"x": [value]}), mode="append")
    second = tmp_path / "t" / "_delta_log" / f"{2:020d}.json"
    aside = tmp_path / "aside.json"
    second.rename(aside)  # as a listing sees it while version 2 is being committed: 0, 1, 3
    with pytest.raises(DeltaError, match="Expected contiguous commit files"):
        DeltaTable(path)
    pauses = []

    def pause(seconds):  # version 2 lands while open_table waits to list the log again
        pauses.append(seconds)
        if aside.exists():
            aside.rename(second)

    monkeypatch.setattr(delta, "time", types.SimpleNamespace(sleep=pause))
    assert open_table(path).version() == 3
    assert len(pauses) == 1  # opened again once, after the gap it listed


def test_a_table_each_group_has_is_asked_for_by_group():
    lakehouse = Lakehouse("/lh")
    with pytest.raises(InvalidArgumentError, match="one table per producer group"):
        lakehouse.path(COMMIT_LOG)
    assert lakehouse.commit_log("order_group") == "/lh/groups/order_group/commit_log"
