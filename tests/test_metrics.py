"""``system/metrics``: the checker's listener records every batch once, with what it did."""

from __future__ import annotations

import datetime as dt

from deltalake import DeltaTable

from coordinator.checker.metrics import CheckerMetrics
from coordinator.checker.query import CheckerQuery
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.tables import COMMIT_LOG, HALF, METRICS
from tests.conftest import append_rows, end_record, half_record
from tests.producer_side import wait_until


def test_the_streaming_checker_records_each_batch_with_its_decisions(spark, config):
    config = config.replace(trigger_interval_ms=500)
    log = Lakehouse(config.lakehouse).path(COMMIT_LOG)
    checker = CheckerQuery(spark, config).start()
    try:
        append_rows(log, COMMIT_LOG, [half_record("a", topic="M", message_count=2), half_record("a", topic="M", message_index=1, message_count=2),
                                      half_record("b", topic="M"), half_record("pending", topic="M")])
        append_rows(log, COMMIT_LOG, [end_record("a"), end_record("b", "ROLLBACK_MESSAGE"), end_record("ghost")])
        head = DeltaTable(log).version()

        def caught_up() -> bool:
            rows = read_table(Lakehouse(config.lakehouse).path(METRICS), ["commit_log_version"]).column(0).to_pylist()
            return head in rows

        wait_until(caught_up, 180)
    finally:
        checker.stop()

    rows = read_table(Lakehouse(config.lakehouse).path(METRICS)).sort_by("batch_id").to_pylist()
    batch_ids = [r["batch_id"] for r in rows]
    assert batch_ids == sorted(set(batch_ids))  # one row per batch
    totals = {name: sum(r[name] for r in rows) for name in ("records", "halves", "commits", "rollbacks", "delivered", "rejected")}
    assert totals == {"records": 7, "halves": 4, "commits": 1, "rollbacks": 1, "delivered": 2, "rejected": 1}
    assert rows[-1]["pending_halves"] == 1 and rows[-1]["commit_log_version"] == head
    assert all(r["finished_at"] - r["started_at"] == dt.timedelta(milliseconds=r["duration_ms"]) and r["duration_ms"] > 0
               for r in rows)
    assert all(r["input_rows"] == r["records"] + 1 for r in rows)  # and the batch's clock tick
    # The batch that ingested the halves is the one the metrics say did.
    [ingesting] = set(read_table(Lakehouse(config.lakehouse).path(HALF), ["batch_id"]).column(0).to_pylist())
    assert next(r for r in rows if r["halves"]) ["batch_id"] == ingesting
    assert read_table(Lakehouse(config.lakehouse).topic("M")).num_rows == 2


def test_a_batch_is_recorded_once(config):
    metrics = CheckerMetrics(config.lakehouse, app_id="test-checker")
    now = dt.datetime.now(dt.timezone.utc)
    row = {name: 0 for name in METRICS.column_names} | {"batch_id": 7, "started_at": now, "finished_at": now}

    assert metrics.record(row) is True
    assert metrics.record(row | {"checks": 5}) is False  # a repeated report of batch 7 changes nothing
    assert metrics.record(row | {"batch_id": 6}) is False  # nor does an older one
    assert metrics.record(row | {"batch_id": 8}) is True

    recorded = read_table(Lakehouse(config.lakehouse).path(METRICS), ["batch_id", "checks"]).sort_by("batch_id").to_pylist()
    assert recorded == [{"batch_id": 7, "checks": 0}, {"batch_id": 8, "checks": 0}]
