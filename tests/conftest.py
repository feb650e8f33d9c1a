"""Shared fixtures: one Spark session for the whole suite, a fresh lakehouse per test,
a raw commit-log writer that bypasses the producer API, and a checker driven batch by
batch with an explicit clock (so timing rules are tested without sleeping)."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any, Callable, Optional

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import init_lakehouse
from coordinator.tables import COMMIT_LOG, TableDef

UTC = dt.timezone.utc


@pytest.fixture(scope="session")
def spark():
    from coordinator.spark import get_spark

    session = get_spark("txcoord-tests")
    yield session
    session.stop()


@pytest.fixture
def config(tmp_path) -> CoordinatorConfig:
    lakehouse = str(tmp_path / "lakehouse")
    init_lakehouse(lakehouse)
    return CoordinatorConfig(lakehouse=lakehouse, transaction_check_max=5)


def half_record(transaction_id: str, group: str = "g", topic: str = "T", body: bytes = b"hello", **overrides: Any) -> dict:
    """A HALF record as a well-behaved producer writes it; ``overrides`` replace any column."""
    record = dict(
        record_id=uuid.uuid4().hex,
        kind="HALF",
        transaction_id=transaction_id,
        producer_group=group,
        msg_id=uuid.uuid4().hex,
        message_index=0,
        message_count=1,
        topic=topic,
        keys=f"key-{transaction_id}",
        tags=None,
        properties={},
        body=body,
        born_timestamp=dt.datetime.now(UTC),
    )
    record.update(overrides)
    return record


def end_record(transaction_id: str, state: str = "COMMIT_MESSAGE", group: str = "g", check_id: Optional[str] = None, **overrides: Any) -> dict:
    """An END record; ``check_id`` marks it as the answer to a check."""
    record = dict(
        record_id=uuid.uuid4().hex,
        kind="END",
        transaction_id=transaction_id,
        producer_group=group,
        state=state,
        check_id=check_id,
        born_timestamp=dt.datetime.now(UTC),
    )
    record.update(overrides)
    return record


def append_rows(path: str, table: TableDef, rows: list[dict]) -> None:
    """Append ``rows`` (missing columns null) to a table with delta-rs, as one commit."""
    columns = {name: [row.get(name) for row in rows] for name in table.column_names}
    for name, values in columns.items():
        if name == "properties":
            columns[name] = [None if v is None else list(v.items()) for v in values]
    write_deltalake(path, pa.table(columns, schema=table.arrow_schema()), mode="append")


class ManualChecker:
    """The checker's batch logic, driven one batch at a time over new commit-log versions.

    ``run(now)`` processes every version committed since the last run, with a
    heartbeat tick at ``now`` (default: the wall clock) as the batch clock.
    """

    def __init__(self, spark, config: CoordinatorConfig):
        self.spark = spark
        self.config = config
        self.next_version = 0
        self.batch_id = 0

    def write(self, *rows: dict) -> int:
        """Append raw commit-log records as one commit; return its version."""
        append_rows(COMMIT_LOG.path(self.config.lakehouse), COMMIT_LOG, list(rows))
        return DeltaTable(COMMIT_LOG.path(self.config.lakehouse)).version()

    def records(self, now: Optional[dt.datetime]):
        from coordinator.checker import read_records
        from coordinator.checker.context import RECORD_EXTRA_COLUMNS

        latest = DeltaTable(COMMIT_LOG.path(self.config.lakehouse)).version()
        schema = COMMIT_LOG.spark_ddl() + ", " + ", ".join(f"{n} {t}" for n, t in RECORD_EXTRA_COLUMNS)
        tick = [{"stored_timestamp": now or dt.datetime.now(UTC), "is_heartbeat": True}]
        records = self.spark.createDataFrame(tick, schema)
        if latest >= self.next_version:
            records = read_records(self.spark, self.config, self.next_version, latest).unionByName(records)
        return records, latest

    def run(self, now: Optional[dt.datetime] = None, batch_id: Optional[int] = None):
        """Run one batch (``batch_id`` given: replay that batch over the same versions is the caller's job)."""
        from coordinator.checker import run_batch

        records, latest = self.records(now)
        summary = run_batch(self.spark, self.config, records, self.batch_id if batch_id is None else batch_id)
        self.next_version = latest + 1
        if batch_id is None:
            self.batch_id += 1
        return summary

    def table(self, name: str):
        from coordinator.tables import SYSTEM_TABLES, topic_path

        paths = {t.name.split("/")[-1]: t.path(self.config.lakehouse) for t in SYSTEM_TABLES}
        path = paths.get(name) or topic_path(self.config.lakehouse, name)
        return self.spark.read.format("delta").load(path)


@pytest.fixture
def checker(spark, config) -> ManualChecker:
    return ManualChecker(spark, config)


def stored_time(checker: ManualChecker, transaction_id: str) -> dt.datetime:
    """When the half of ``transaction_id`` entered the commit log (UTC)."""
    row = checker.table("half").filter(f"transaction_id = '{transaction_id}'").selectExpr("unix_micros(stored_timestamp) AS us").first()
    return dt.datetime.fromtimestamp(row.us / 1e6, UTC)


def wait_until(condition: Callable[[], bool], timeout_s: float = 30, interval_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %.0f s" % timeout_s)
        time.sleep(interval_s)
