"""A checker standing by rehearses a first micro-batch in a throwaway query, so that its takeover's
first batch is not Spark's first: the rehearsal writes nothing to the lakehouse, leaves no checkpoint
behind, and the checker that takes over starts from the lakehouse's own checkpoint."""

from __future__ import annotations

import logging
import os
import tempfile
import threading

import pytest
from pyspark.sql.streaming import StreamingQueryListener

from support import end_record, half_record, wait_until
from coordinator.checker import CHECKER_NAME
from coordinator.checker.query import CheckerQuery, checkpoint_location
from coordinator.checker import rehearsal
from coordinator.checker.rehearsal import REHEARSAL_NAME
from coordinator.checker.source import segments
from coordinator.control.lease import CheckerLease, lease_record
from coordinator.lakehouse import LEASE_KEY, Lakehouse, read_table
from coordinator.producer.commit_log import CommitLogWriter


class QueriesSeen(StreamingQueryListener):
    """The names of the streaming queries started, and of those that made progress, in order."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.progressed: list[str] = []

    def onQueryStarted(self, event) -> None:
        self.started.append(event.name)

    def onQueryProgress(self, event) -> None:
        self.progressed.append(event.progress.name)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


def files_under(root: str, leave_out: str) -> set[str]:
    """Every file below ``root``, as paths relative to it, but those below ``leave_out``."""
    return {os.path.relpath(os.path.join(folder, name), root) for folder, _, names in os.walk(root)
            for name in names if not os.path.join(folder, name).startswith(leave_out)}


def rehearsal_directories() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("txcoord-rehearsal-")}


@pytest.fixture(autouse=True)
def own_temporary_directory(tmp_path, monkeypatch):
    """This test's temporary directory, so that another worker's rehearsal never shows up in it."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))


def test_a_standby_rehearses_a_first_batch_writing_nothing_then_takes_over_from_the_real_checkpoint(spark, config):
    lakehouse = Lakehouse.of(config)
    with CommitLogWriter(lakehouse, "g") as writer:
        writer.submit([half_record("paid", topic="ORDERS")]).result()
        writer.submit([end_record("paid")]).result()
    holder = CheckerLease(lakehouse, ttl_s=30).acquire()  # a live checker: this process
    queries = QueriesSeen()
    spark.streams.addListener(queries)
    before = files_under(lakehouse.root, lakehouse.path("system/_checker_standbys"))
    started: list[CheckerQuery] = []
    standby = threading.Thread(target=lambda: started.append(CheckerQuery(spark, config).start(wait_for_lease=True)))
    standby.start()
    try:
        wait_until(lambda: REHEARSAL_NAME in queries.progressed and not spark.streams.active, 240)
        assert queries.started == [REHEARSAL_NAME] and not started  # still standing by
        assert files_under(lakehouse.root, lakehouse.path("system/_checker_standbys")) == before
        assert not os.path.exists(checkpoint_location(config))
        assert not rehearsal_directories()
        holder.release()
        standby.join(120)
        wait_until(lambda: os.path.exists(lakehouse.topic("ORDERS")), 120)
    finally:
        holder.release()
        standby.join(120)
        for checker in started:
            checker.stop()
        spark.streams.removeListener(queries)
    assert queries.started == [REHEARSAL_NAME, CHECKER_NAME]
    assert read_table(lakehouse.topic("ORDERS")).column("transaction_id").to_pylist() == ["paid"]


def test_a_takeover_does_not_wait_for_a_rehearsal_still_running(spark, config, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="coordinator.checker")
    lakehouse = Lakehouse.of(config)
    holder = CheckerLease(lakehouse, ttl_s=30).acquire()
    taken_over_during_rehearsal = []

    def slow_segments(batch):  # the rehearsal's batch, until the standby has taken the lease over
        holder.release()
        taken_over_during_rehearsal.append(wait_until(lambda: lease_record(lakehouse.files.read(LEASE_KEY))["owner"]
                                                      != holder.owner, 60))
        return segments(batch)

    monkeypatch.setattr(rehearsal, "segments", slow_segments)
    started: list[CheckerQuery] = []
    standby = threading.Thread(target=lambda: started.append(CheckerQuery(spark, config).start(wait_for_lease=True)))
    standby.start()
    try:
        standby.join(240)
        assert started and taken_over_during_rehearsal == [True]
        wait_until(lambda: [query.name for query in spark.streams.active] == [CHECKER_NAME], 60)
    finally:
        holder.release()
        standby.join(120)
        for checker in started:
            checker.stop()
    assert "the rehearsal of a first batch was abandoned at the takeover" in caplog.text
    assert "rehearsed in" not in caplog.text
    wait_until(lambda: not rehearsal_directories(), 30)
