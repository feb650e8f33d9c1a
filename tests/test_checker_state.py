"""The checker's memory between batches (``coordinator.checker.memory``): what it keeps is what a
rebuild from the tables finds, so a restart or a replay decides as an unbroken run does."""

from __future__ import annotations

import dataclasses
import datetime as dt

from types import SimpleNamespace

from coordinator.checker import unresolved
from coordinator.checker.memory import CheckerMemory
from coordinator.checker.rebuild import rebuild_memory
from coordinator.checker.unresolved import rebuild_in_spark, unresolved_range_rows
from coordinator.protocol import CHECK_IMMUNITY_TIME_IN_SECONDS
from support import end_record, half_record
from support.batches import stored_time

SECOND = dt.timedelta(seconds=1)


def pending_view(memory: CheckerMemory) -> dict:
    return {tid: dataclasses.asdict(p) for tid, p in memory.pending.items()}


def rebuilt(checker, spark, where: str = "never") -> CheckerMemory:
    """A memory rebuilt from the tables, its anti-join run ``where`` (``never``: the driver; ``always``: Spark)."""
    return rebuild_memory(checker.config.replace(rebuild_in_spark=where), checker.batch_id, checker.pending_from,
                          spark)


def test_state_kept_in_memory_equals_the_state_rebuilt_from_the_tables(checker, spark):
    checker.write(half_record("committed"), half_record("rolled-back"), half_record("silent"),
                  half_record("two", topic="A", message_index=0, message_count=2),
                  half_record("two", topic="B", message_index=1, message_count=2),
                  half_record("patient", properties={CHECK_IMMUNITY_TIME_IN_SECONDS: "600"}))
    checker.write(end_record("committed"), end_record("rolled-back", "ROLLBACK_MESSAGE"), end_record("silent", "UNKNOW"))
    checker.run()
    born = stored_time(checker, "silent")
    checker.run(now=born + 7 * SECOND)  # "silent" and "two" are checked once

    kept = pending_view(checker.memory)
    assert sorted(kept) == ["patient", "silent", "two"]
    assert (kept["silent"]["checks"], kept["two"]["checks"], kept["patient"]["checks"]) == (1, 1, 0)
    assert kept["silent"]["last_check_us"] is not None
    for where in ("never", "always"):
        fresh = rebuilt(checker, spark, where)
        assert pending_view(fresh) == kept, where
        assert fresh.lowest_pending_offset() == checker.memory.lowest_pending_offset() == checker.pending_from
        assert fresh.pending_halves().equals(checker.memory.pending_halves())
        assert fresh.pending_halves().num_rows == 4


def test_a_rebuild_runs_in_spark_when_told_or_on_a_cluster_for_a_large_range(checker, spark, monkeypatch):
    checker.write(*(half_record(f"t{i}") for i in range(3)))
    checker.run()
    checker.write(*(half_record(f"t{i}") for i in range(3, 5)))
    checker.run()  # a second file of the half queue
    lakehouse, config = checker.lakehouse, checker.config
    offsets = {r.transaction_id: r.queue_offset for r in checker.rows("half")}
    assert [unresolved_range_rows(lakehouse, offset) for offset in (0, offsets["t3"], max(offsets.values()) + 1)] == [5, 2, 0]
    assert not rebuild_in_spark(config, spark, lakehouse, 0)  # local Spark: the driver is faster
    assert rebuild_in_spark(config.replace(rebuild_in_spark="always"), spark, lakehouse, 0)
    assert not rebuild_in_spark(config.replace(rebuild_in_spark="never"), spark, lakehouse, 0)
    monkeypatch.setattr(unresolved, "SPARK_REBUILD_MIN_ROWS", 5)
    on_cluster = SimpleNamespace(sparkContext=SimpleNamespace(master="spark://cluster:7077"))
    assert rebuild_in_spark(config, on_cluster, lakehouse, 0) and not rebuild_in_spark(config, on_cluster, lakehouse, offsets["t3"])


def test_a_late_end_of_a_transaction_resolved_before_a_restart_is_judged_from_the_tables(checker):
    checker.write(half_record("done"))
    checker.write(end_record("done"))
    checker.run()
    checker.restart()  # a restarted checker: nothing in memory but what it rebuilds
    late = end_record("done", "ROLLBACK_MESSAGE")
    forged = end_record("done", group="intruder")
    again = half_record("done")
    checker.write(late)
    checker.write(forged)  # in the intruder's own log: the claim is judged against the tables
    checker.write(again)
    summary = checker.run()

    reasons = {r.record_id: r.reason for r in checker.rows("rejected")}
    assert reasons == {late["record_id"]: "transaction already resolved",
                       forged["record_id"]: "producer group does not own the transaction",
                       again["record_id"]: "duplicate transaction_id"}
    assert summary.rejected == 3 and len(checker.rows("T")) == 1
