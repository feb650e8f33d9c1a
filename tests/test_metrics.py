"""``system/metrics``: the checker's listener records every batch once, with what it did."""

from __future__ import annotations

import datetime as dt
from collections import Counter

from deltalake import DeltaTable

from coordinator.checker.metrics import CheckerMetrics
from coordinator.checker.query import CheckerQuery
from coordinator.lakehouse import Lakehouse, create_group_tables, read_table
from coordinator.tables import CHECK_REQUESTS, COMMIT_LOG, HALF, METRICS, OP, REJECTED
from tests.support import end_record, half_record, wait_until
from tests.support.lakehouse import append_rows, metrics_row


def test_the_streaming_checker_records_each_batch_with_its_decisions(spark, config):
    config = config.replace(trigger_interval_ms=500)
    create_group_tables(config.lakehouse, "g")
    log = Lakehouse(config.lakehouse).commit_log("g")
    # ``commit_log_version`` counts the versions read over every log: group g's, and the operators' one
    # version (its creation), which nothing writes here and the first batch reads.
    operators_versions = DeltaTable(Lakehouse(config.lakehouse).operators_log).version() + 1

    def read_of_g(versions_read: int) -> int:
        """The last version of g's log read, given how many versions were read over every log."""
        return versions_read - operators_versions - 1

    checker = CheckerQuery(spark, config).start()
    try:
        append_rows(log, COMMIT_LOG, [half_record("a", topic="M", message_count=2), half_record("a", topic="M", message_index=1, message_count=2),
                                      half_record("b", topic="M"), half_record("pending", topic="M")])
        append_rows(log, COMMIT_LOG, [end_record("a"), end_record("b", "ROLLBACK_MESSAGE"), end_record("ghost")])
        head = DeltaTable(log).version()

        def caught_up() -> bool:
            rows = read_table(Lakehouse(config.lakehouse).path(METRICS), ["commit_log_version"]).column(0).to_pylist()
            return any(read_of_g(r) == head for r in rows)

        wait_until(caught_up, 180)
    finally:
        checker.stop()

    rows = read_table(Lakehouse(config.lakehouse).path(METRICS)).sort_by("batch_id").to_pylist()
    batch_ids = [r["batch_id"] for r in rows]
    assert batch_ids == sorted(set(batch_ids))  # one row per batch
    totals = {name: sum(r[name] for r in rows) for name in ("records", "halves", "commits", "rollbacks", "delivered", "rejected")}
    assert totals == {"records": 7, "halves": 4, "commits": 1, "rollbacks": 1, "delivered": 2, "rejected": 1}
    assert rows[-1]["pending_halves"] == 1 and read_of_g(rows[-1]["commit_log_version"]) == head
    assert all(r["finished_at"] - r["started_at"] == dt.timedelta(milliseconds=r["duration_ms"]) and r["duration_ms"] > 0
               for r in rows)
    assert all(r["input_rows"] == r["records"] + 1 for r in rows)  # and the batch's clock tick
    # Each row is what its batch did: the commit-log records it read (the versions since the previous
    # row's), and the rows the checker's tables hold with its batch id.
    lakehouse = Lakehouse(config.lakehouse)
    by_batch = {name: Counter(read_table(lakehouse.path(table), ["batch_id"]).column(0).to_pylist())
                for name, table in (("halves", HALF), ("rejected", REJECTED), ("checks", CHECK_REQUESTS))}
    by_batch["delivered"] = Counter(read_table(lakehouse.topic("M"), ["batch_id"]).column(0).to_pylist())
    ops = read_table(lakehouse.path(OP), ["batch_id", "transaction_id", "outcome"]).to_pylist()  # one per message
    ended = {(o["batch_id"], o["transaction_id"], o["outcome"]) for o in ops}
    by_batch["commits"] = Counter(batch_id for batch_id, _, outcome in ended if outcome == "COMMIT")
    by_batch["rollbacks"] = Counter(batch_id for batch_id, _, outcome in ended if outcome == "ROLLBACK")
    read_up_to = -1
    for r in rows:
        assert read_of_g(r["commit_log_version"]) >= read_up_to
        assert r["records"] == log_rows(log, read_of_g(r["commit_log_version"])) - log_rows(log, read_up_to), r
        assert {name: r[name] for name in by_batch} == {name: by_batch[name][r["batch_id"]] for name in by_batch}, r
        read_up_to = read_of_g(r["commit_log_version"])
    assert read_table(lakehouse.topic("M")).num_rows == 2
    # Per topic: the batch that delivered wrote both of M's messages, with latencies no later than its end.
    delivering = [r for r in rows if r["delivered"]]
    assert [dict(r["delivered_by_topic"]) for r in delivering] == [{"M": 2}]
    p50, p99 = dict(delivering[0]["visible_p50_ms_by_topic"])["M"], dict(delivering[0]["visible_p99_ms_by_topic"])["M"]
    commits = read_table(lakehouse.topic("M"), ["commit_timestamp"]).column(0).to_pylist()
    assert 0 <= p50 <= p99 <= (delivering[0]["finished_at"] - min(commits)).total_seconds() * 1000
    assert all(not r["delivered_by_topic"] for r in rows if not r["delivered"])


def log_rows(log: str, version: int) -> int:
    """How many records the commit log holds at ``version`` (none before its first)."""
    return DeltaTable(log, version=version).to_pyarrow_dataset().count_rows() if version >= 0 else 0


def test_a_batch_is_recorded_once(config):
    metrics = CheckerMetrics(config.lakehouse, app_id="test-checker")
    now = dt.datetime.now(dt.timezone.utc)
    row = metrics_row(batch_id=7, started_at=now, finished_at=now)

    assert metrics.record(row) is True
    assert metrics.record(row | {"checks": 5}) is False  # a repeated report of batch 7 changes nothing
    assert metrics.record(row | {"batch_id": 6}) is False  # nor does an older one
    assert metrics.record(row | {"batch_id": 8}) is True

    recorded = read_table(Lakehouse(config.lakehouse).path(METRICS)).sort_by("batch_id").to_pylist()
    assert recorded == [row, row | {"batch_id": 8}]  # each row whole, as first reported
