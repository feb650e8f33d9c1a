"""``system/metrics``: the checker's listener records every batch once, with what it did."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from types import SimpleNamespace

from deltalake import DeltaTable

from coordinator.checker.batch import BatchSummary
from coordinator.checker.metrics import CheckerMetrics
from coordinator.checker.query import CheckerQuery
from coordinator.lakehouse import Lakehouse, create_group_tables, read_table
from coordinator.tables import CHECK_REQUESTS, COMMIT_LOG, HALF, METRICS, OP, REJECTED
from support import end_record, half_record, wait_until
from support.lakehouse import append_rows, metrics_row


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


def progress_event(batch_id: int, name: str = "txcoord-checker") -> SimpleNamespace:
    """A ``QueryProgressEvent`` as Spark hands it to a listener: the fields the listener reads."""
    return SimpleNamespace(progress=SimpleNamespace(
        name=name, batchId=batch_id, timestamp="2026-11-28T12:00:00.000Z", batchDuration=40,
        sources=[SimpleNamespace(endOffset='{"versions": {"groups/g/commit_log": 3}}')]))


def test_batches_ended_within_the_record_interval_are_appended_in_one_commit(config):
    now = [100.0]
    metrics = CheckerMetrics(config.lakehouse, app_id="test-checker", record_interval_s=5, clock=lambda: now[0])
    path = Lakehouse(config.lakehouse).path(METRICS)

    def report(batch_id: int, **counts) -> None:
        metrics.batch_done(batch_id, BatchSummary(batch_id=batch_id, **counts))
        metrics.onQueryProgress(progress_event(batch_id))

    def recorded() -> list[int]:
        return read_table(path, ["batch_id"]).column(0).to_pylist()

    report(0, records=3)
    assert recorded() == [0]  # the first batch at once
    first = DeltaTable(path).version()
    for batch_id in (1, 2, 3):
        now[0] += 1
        report(batch_id)
    metrics.onQueryProgress(progress_event(4, name="another-query"))  # not the checker's: ignored
    assert recorded() == [0]  # held: 3 s since the last commit
    now[0] += 2
    report(4, delivered=2)
    assert sorted(recorded()) == [0, 1, 2, 3, 4] and DeltaTable(path).version() == first + 1  # one commit for four
    assert DeltaTable(path).transaction_version("test-checker/metrics") == 4
    rows = {r["batch_id"]: r for r in read_table(path).to_pylist()}
    assert (rows[0]["records"], rows[4]["delivered"], rows[4]["commit_log_version"]) == (3, 2, 3)

    now[0] += 1
    report(5)
    report(3)  # a replayed batch reported again: already recorded
    assert metrics.flush() == 1 and sorted(recorded()) == [0, 1, 2, 3, 4, 5]  # e.g. at detach: the held rows
    assert metrics.flush() == 0 and DeltaTable(path).version() == first + 2


def test_rows_that_could_not_be_appended_are_kept_for_the_next_append(config, monkeypatch):
    import coordinator.checker.metrics as checker_metrics

    now = [0.0]
    metrics = CheckerMetrics(config.lakehouse, app_id="test-checker", record_interval_s=5, clock=lambda: now[0])
    path = Lakehouse(config.lakehouse).path(METRICS)
    real_write = checker_metrics.write_deltalake

    def refused(*args, **kwargs):
        raise OSError("503 Slow Down")

    monkeypatch.setattr(checker_metrics, "write_deltalake", refused)
    metrics.batch_done(0, BatchSummary(batch_id=0, records=1))
    metrics.onQueryProgress(progress_event(0))  # logged, never raised: the checker goes on
    monkeypatch.setattr(checker_metrics, "write_deltalake", real_write)
    for batch_id in (1, 2):
        now[0] += 5
        metrics.batch_done(batch_id, BatchSummary(batch_id=batch_id))
        metrics.onQueryProgress(progress_event(batch_id))
    assert sorted(read_table(path, ["batch_id"]).column(0).to_pylist()) == [0, 1, 2]
