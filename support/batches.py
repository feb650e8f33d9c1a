"""The checker's batch logic driven one batch at a time with an explicit clock, as ``run_batch`` on the
driver: no streaming query and no JVM (so timing rules are tested without sleeping)."""

from __future__ import annotations

import datetime as dt
import os
from typing import Optional

import pyarrow.compute as pc
from deltalake import DeltaTable

from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.tables import COMMIT_LOG
from support.lakehouse import append_rows
from support.records import half_record

__all__ = ["ManualChecker", "stored_time"]

UTC = dt.timezone.utc


class ManualChecker:
    """The checker's batch logic, driven one batch at a time over new commit-log versions.

    ``run(now)`` processes every version of every commit log committed since the last run, with a
    heartbeat tick at ``now`` (default: the wall clock) as the batch clock, and hands each batch's
    ``pending_from`` to the next, as the streaming query does. Its memory is rebuilt with delta-rs, never
    in Spark: batch-logic tests start no JVM.
    """

    def __init__(self, config: CoordinatorConfig):
        self.config = config
        self.lakehouse = Lakehouse.of(config)  # with its [storage]: on object storage too
        self.next_versions: dict[str, int] = {}
        self.batch_id = 0
        self.pending_from = 0
        from coordinator.checker.batch import BatchRunner

        self.runner = BatchRunner()

    def write(self, *rows: dict, stored_at: Optional[dt.datetime] = None, log: Optional[str] = None) -> int:
        """Append raw commit-log records as one commit; return its version.

        ``log`` is the commit log's key (``groups/g/commit_log``); by default the first record's
        group's own (``g`` for a record with none), or the operators' for an operator's decision.
        ``stored_at`` dates the commit (its log file's modification time, which the checker reads
        as when the records were stored): a commit made "a while ago" without waiting for it.
        """
        from coordinator.commit_logs import CommitLogRef
        from coordinator.lakehouse import create_table
        from coordinator.protocol import OPERATOR_CHECK_PREFIX

        first = rows[0]
        if log is None and (first.get("check_id") or "").startswith(OPERATOR_CHECK_PREFIX):
            log = CommitLogRef.operators().key
        log = log or CommitLogRef.of_group(first.get("producer_group") or "g").key
        path = self.lakehouse.key_path(log)
        create_table(COMMIT_LOG, path)
        append_rows(path, COMMIT_LOG, list(rows))
        version = DeltaTable(path).version()
        if stored_at is not None:
            os.utime(os.path.join(path, "_delta_log", f"{version:020d}.json"), (stored_at.timestamp(),) * 2)
        return version

    def discard(self, *transaction_ids: str, messages: int = 1) -> None:
        """Write ``transaction_ids`` as halves and run batches until each is discarded (one check is the maximum)."""
        self.config = self.config.replace(transaction_check_max=1)
        self.write(*(half_record(t, body=f"{t} {i}".encode(), message_index=i, message_count=messages)
                     for t in transaction_ids for i in range(messages)))
        self.run()
        stored = stored_time(self, transaction_ids[0])
        self.run(now=stored + dt.timedelta(seconds=7))
        self.run(now=dt.datetime.now(UTC) + dt.timedelta(seconds=61))  # the check's interval has passed
        assert {r.outcome for r in self.rows("op", pc.field("transaction_id").isin(transaction_ids))} == {"DISCARD"}

    def records(self, starts: dict, ends: dict, now: dt.datetime):
        from coordinator.checker.segment import Segment

        from coordinator.schedule import clock_us

        return Segment(starts, ends, clock_us(now)).records(self.lakehouse)

    def run(self, now: Optional[dt.datetime] = None):
        """Run the next batch over every commit-log version not yet processed, at clock ``now``."""
        from coordinator.checker.segment import grown_to

        ends = grown_to(self.lakehouse, self.next_versions)
        self.last_batch = (self.next_versions, ends, now or dt.datetime.now(UTC), self.batch_id, self.pending_from)
        self.next_versions, self.batch_id = ends, self.batch_id + 1
        summary = self.replay()
        self.pending_from = summary.pending_from
        return summary

    def replay(self):
        """Run the last batch again, exactly as Spark does after a crash: same id, versions and clock."""
        from coordinator.checker.batch import run_batch

        starts, ends, now, batch_id, pending_from = self.last_batch
        return run_batch(self.config, self.records(starts, ends, now), batch_id,
                         pending_from=pending_from, runner=self.runner)

    @property
    def memory(self):
        """The checker's memory as the last batch left it (:class:`coordinator.checker.memory.CheckerMemory`)."""
        return self.runner.memory

    def restart(self) -> None:
        """Forget the memory, as a checker killed and started again does: the next batch rebuilds it."""
        from coordinator.checker.batch import BatchRunner

        self.runner = BatchRunner()

    def rows(self, name: str, where: Optional[pc.Expression] = None) -> list:
        """The rows of a system table or topic (``where`` them only), read with delta-rs: Spark's
        ``Row``s as ``table(name).collect()`` gives, in a fraction of a Spark read's time."""
        from pyspark.sql import Row

        return [Row(**row) for row in read_table(self.path(name), filter=where).to_pylist(maps_as_pydicts="strict")]

    def path(self, name: str) -> str:
        from coordinator.tables import SYSTEM_TABLES

        paths = {t.name.split("/")[-1]: Lakehouse(self.config.lakehouse).path(t) for t in SYSTEM_TABLES}
        return paths.get(name) or Lakehouse(self.config.lakehouse).topic(name)


def stored_time(checker: ManualChecker, transaction_id: str) -> dt.datetime:
    """When the half of ``transaction_id`` entered the commit log (UTC)."""
    return checker.rows("half", pc.field("transaction_id") == transaction_id)[0].stored_timestamp  # one per message
