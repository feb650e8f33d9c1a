"""The checker's metrics: one row per micro-batch in ``system/metrics``.

:class:`CheckerMetrics` is a ``StreamingQueryListener``. The checker hands it each
batch's :class:`~coordinator.checker.batch.BatchSummary` (what the batch decided);
when Spark reports that batch's progress (how long the trigger took, how many rows
it read, which commit-log version it reached) the listener merges the two and
appends one row with delta-rs. That runs on Spark's listener thread once the batch
has committed, so it never lengthens a batch; a failure to
record is logged and never stops the checker.

Each append carries the batch id as a Delta application transaction, so a batch
recorded once is never recorded again (a replayed batch, a repeated progress event).

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
from typing import Any, Mapping, Optional, Union

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql.streaming import StreamingQueryListener

from coordinator.checker import CHECKER_NAME
from coordinator.lakehouse import Lakehouse, open_table
from coordinator.tables import METRICS

log = logging.getLogger("coordinator.checker.metrics")



class CheckerMetrics(StreamingQueryListener):
    """Records every checker batch into ``system/metrics`` (see the module's docstring).

    Example::

        metrics = CheckerMetrics(config.lakehouse, app_id)
        spark.streams.addListener(metrics)
    """

    def __init__(self, lakehouse: Union[str, Lakehouse], app_id: str, query_name: str = CHECKER_NAME):
        lakehouse = Lakehouse.at(lakehouse)
        self.path = lakehouse.path(METRICS)
        self.storage = lakehouse.storage
        self.query_name = query_name
        # Its own application id: the checker's id already numbers the checker's own tables' writes.
        self.txn_app_id = f"{app_id}/metrics"
        self._summaries: dict[int, Any] = {}
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
            self.record(metrics_row(progress, summary))
        except Exception:  # the listener must never take the checker down
            log.exception("could not record the metrics of batch %d", summary.batch_id)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def record(self, row: dict) -> bool:
        """Append ``row`` unless its batch is recorded already; return whether it was appended.

        Example::

            metrics.record(metrics_row(progress, summary))  # True, then False
        """
        with self._lock:
            if self._table is None:
                self._table = open_table(self.path, storage=self.storage)
            else:
                self._table.update_incremental()
            recorded = self._table.transaction_version(self.txn_app_id)
            if recorded is not None and recorded >= row["batch_id"]:
                return False
            data = pa.Table.from_pylist([row], schema=METRICS.arrow_schema())
            write_deltalake(self._table, data, mode="append", commit_properties=CommitProperties(
                app_transactions=[Transaction(self.txn_app_id, row["batch_id"])]))
            return True

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
