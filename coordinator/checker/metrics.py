"""The checker's metrics: one row per micro-batch in ``system/metrics``.

:class:`CheckerMetrics` is a ``StreamingQueryListener``. The checker hands it each
batch's :class:`~coordinator.checker.batch.BatchSummary` (what the batch decided);
when Spark reports that batch's progress (how long the trigger took, how many rows
it read, which commit-log version it reached) the listener merges the two and
queues one row. Every ``record_interval_s`` at most it appends the queued rows with
delta-rs, in one commit: a commit costs a dozen requests or more on object storage,
and an idle checker ends a batch every second. That runs on Spark's listener thread
once the batch has committed, so it never lengthens a batch; a failed append is
logged, never stops the checker, and its rows stay queued for the next one.

Each append carries its highest batch id as a Delta application transaction, so a
batch recorded once is never recorded again (a replayed batch, a repeated progress
event); a checker that dies loses the rows it had queued, a few seconds of them.

``txcoord status`` and ``notebooks/health.ipynb`` read the table back (``coordinator.ops.status``).

Example::

    metrics = CheckerMetrics("lakehouse", app_id="txcoord-checker")
    spark.streams.addListener(metrics)
    # in foreachBatch:  metrics.batch_done(stream_batch_id, run_batch(...))
    metrics.detach(spark)   # after query.stop(): records what is still queued, then unregisters
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from typing import Any, Callable, Mapping, Optional, Union

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql.streaming import StreamingQueryListener

from coordinator.checker import CHECKER_NAME
from coordinator.lakehouse import Lakehouse, open_table
from coordinator.tables import METRICS

log = logging.getLogger("coordinator.checker.metrics")

#: The most rows held for a failing table: past it the oldest are dropped (logged), so that a store
#: down for hours cannot fill the driver's memory.
MAX_QUEUED_ROWS = 10_000


class CheckerMetrics(StreamingQueryListener):
    """Records every checker batch into ``system/metrics`` (see the module's docstring).

    Example::

        metrics = CheckerMetrics(config.lakehouse, app_id)
        spark.streams.addListener(metrics)
    """

    def __init__(self, lakehouse: Union[str, Lakehouse], app_id: str, query_name: str = CHECKER_NAME,
                 record_interval_s: float = 0.0, clock: Callable[[], float] = time.monotonic):
        lakehouse = Lakehouse.at(lakehouse)
        self.path = lakehouse.path(METRICS)
        self.storage = lakehouse.storage
        self.query_name = query_name
        # Its own application id: the checker's id already numbers the checker's own tables' writes.
        self.txn_app_id = f"{app_id}/metrics"
        self.record_interval_s = record_interval_s
        self._clock = clock
        self._summaries: dict[int, Any] = {}
        self._queued: list[dict] = []
        self._last_append: Optional[float] = None
        self._table: Optional[DeltaTable] = None
        self._lock = threading.Lock()

    def batch_done(self, stream_batch_id: int, summary) -> None:
        """Hand over what the batch with Spark's id ``stream_batch_id`` did (``None``: it was empty)."""
        if summary is not None:
            self._summaries[stream_batch_id] = summary

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        summary = self._summaries.pop(progress.batchId, None)
        if summary is None:
            return  # an empty batch, or a no-data progress report, or another run's
        try:
            self.queue(metrics_row(progress, summary))
            if self._due():
                self.flush()
        except Exception:  # the listener must never take the checker down
            log.exception("could not record the metrics of batch %d", summary.batch_id)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def queue(self, row: dict) -> None:
        """Hold ``row`` for the next append (:meth:`flush`)."""
        with self._lock:
            self._queued.append(row)
            if len(self._queued) > MAX_QUEUED_ROWS:
                dropped = len(self._queued) - MAX_QUEUED_ROWS
                del self._queued[:dropped]
                log.warning("dropped the metrics of %d batch(es): %s could not be appended to for a while",
                            dropped, self.path)

    def flush(self) -> int:
        """Append every queued row not recorded yet, in one commit; return how many were appended.

        Example::

            metrics.queue(row_of_batch_7); metrics.queue(row_of_batch_8)
            metrics.flush()  # 2, then 0
        """
        return len(self._append_queued())

    def _append_queued(self) -> list[int]:
        """:meth:`flush`'s work; the batch ids it appended."""
        with self._lock:
            self._last_append = self._clock()
            if self._table is None:
                self._table = open_table(self.path, storage=self.storage)
            else:
                self._table.update_incremental()
            recorded = self._table.transaction_version(self.txn_app_id)
            new = {row["batch_id"]: row for row in reversed(self._queued)
                   if recorded is None or row["batch_id"] > recorded}  # a batch's first report wins
            if new:
                data = pa.Table.from_pylist([new[batch_id] for batch_id in sorted(new)], schema=METRICS.arrow_schema())
                write_deltalake(self._table, data, mode="append", commit_properties=CommitProperties(
                    app_transactions=[Transaction(self.txn_app_id, max(new))]))
            self._queued.clear()
            return sorted(new)

    def record(self, row: dict) -> bool:
        """Append ``row`` now (with whatever is queued) unless its batch is recorded already; return whether
        it was appended.

        Example::

            metrics.record(metrics_row(progress, summary))  # True, then False
        """
        self.queue(row)
        return row["batch_id"] in self._append_queued()

    def _due(self) -> bool:
        return self._last_append is None or self._clock() - self._last_append >= self.record_interval_s

    def detach(self, spark) -> None:
        """Unregister, after recording the batches whose progress Spark has already queued.

        Call it after ``query.stop()``.
        """
        # The listener bus delivers progress asynchronously: drain it, or the last batch goes unrecorded.
        try:
            spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        except Exception:  # a busy bus (it waits 10 s at most) costs a metrics row, never the stop
            log.warning("the last batches' metrics may be missing: Spark's listener bus did not drain", exc_info=True)
        spark.streams.removeListener(self)
        try:
            self.flush()
        except Exception:  # a failing store costs the last rows, never the stop
            log.warning("the last batches' metrics could not be recorded", exc_info=True)


def metrics_row(progress, summary) -> dict:
    """One ``system/metrics`` row from Spark's progress report and the checker's summary of the same batch.

    Example::

        metrics_row(event.progress, summary)["duration_ms"]  # e.g. 2350
    """
    started = dt.datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00"))
    duration_ms = int(progress.batchDuration)
    return {
        "batch_id": summary.batch_id,
        "started_at": started,
        "finished_at": started + dt.timedelta(milliseconds=duration_ms),
        "duration_ms": duration_ms,
        "input_rows": summary.records + 1,  # its records and its clock tick (Spark sees one row: the segment)
        "records": summary.records,
        "halves": summary.halves,
        "commits": summary.commits,
        "rollbacks": summary.rollbacks,
        "delivered": summary.delivered,
        "checks": summary.checks,
        "discarded": summary.discarded,
        "rejected": summary.rejected,
        "pending_halves": summary.pending,
        "commit_log_version": commit_log_version(progress),
        "delivered_by_topic": {topic: len(samples) for topic, samples in summary.commit_to_visible_s.items()},
        "visible_p50_ms_by_topic": _percentile_ms(summary.commit_to_visible_s, 0.5),
        "visible_p99_ms_by_topic": _percentile_ms(summary.commit_to_visible_s, 0.99),
    }


def _percentile_ms(seconds_by_topic: Mapping[str, pa.ChunkedArray], quantile: float) -> dict[str, int]:
    """Per topic, the ``quantile`` of its samples (seconds) in whole milliseconds: the nearest sample at or above it."""
    return {topic: round(pc.quantile(samples, q=quantile, interpolation="higher")[0].as_py() * 1000)
            for topic, samples in seconds_by_topic.items() if len(samples)}


def commit_log_version(progress) -> Optional[int]:
    """How many commit-log versions the checker has read, over every log, from its source's end
    offset (``{"versions": {log: first version not read}, ...}``, see ``coordinator.checker.source``).
    """
    for source in progress.sources:
        offset = json.loads(source.endOffset) if isinstance(source.endOffset, str) else source.endOffset
        if isinstance(offset, dict) and "versions" in offset:
            return sum(int(version) for version in offset["versions"].values())
    return None
