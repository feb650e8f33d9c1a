"""The checker's streaming query: the commit logs, one batch per trigger, a clock tick in each.

The source (:mod:`.source`) reads each new version of every commit log straight from its
Delta log, so each record comes with the log, the version and the time at which it entered
it, and ends a batch of one clock tick once a second when producers are quiet,
so check-backs keep coming. Spark keeps the offsets in the query's checkpoint.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Callable, Optional

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from coordinator.checker import CHECKER_NAME
from coordinator.checker.batch import BatchRunner, batch_clock, run_batch
from coordinator.checker.epochs import begin_next_epoch
from coordinator.checker.exporter import CheckerExporter
from coordinator.checker.gate import BatchGate
from coordinator.checker.metrics import CheckerMetrics
from coordinator.checker.readahead import ReadAhead
from coordinator.checker.rehearsal import Rehearsal
from coordinator.checker.segment import Segment
from coordinator.checker.source import CommitLogSource, segments
from coordinator.commit_logs import CommitLogs
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease
from coordinator.control.progress import BatchRecord, CheckerProgress, Progress, StreamingCheckpoint
from coordinator.exceptions import (CheckpointMismatchError, CoordinatorError, LeaseLostError, StopRequested,
                                    StorageUnavailableError)
from coordinator.lakehouse import Lakehouse, init_lakehouse
from coordinator.spark.session import CHECKPOINT_MANAGER_SETTING, hadoop_location, write_streaming_checkpoints_in_place

__all__ = ["CheckerQuery", "checkpoint_location"]

log = logging.getLogger("coordinator.checker")

#: Seconds between runs of a batch that failed because the storage was unavailable past its retry bound.
OUTAGE_PAUSE_S = 5


def checkpoint_location(config: CoordinatorConfig) -> str:
    """Where the checker keeps its streaming checkpoint: inside the lakehouse it serves."""
    return Lakehouse(config.lakehouse).checker_checkpoint


class CheckerQuery:
    """The running checker: start it, then stop it between batches.

    Example::

        checker = CheckerQuery(spark, config).start()
        ...
        checker.stop()   # lets the batch in flight finish first
    """

    def __init__(self, spark: SparkSession, config: CoordinatorConfig, app_id: str = CHECKER_NAME):
        self.spark = spark
        self.config = config
        self.app_id = app_id
        self.query: Optional[StreamingQuery] = None
        self.lakehouse = Lakehouse.of(config)
        self.lease = CheckerLease(self.lakehouse, ttl_s=config.checker_lease_ttl_ms / 1000)
        self.metrics = CheckerMetrics(self.lakehouse, app_id, CHECKER_NAME,
                                     record_interval_s=config.metrics_record_interval_ms / 1000)
        self.progress_store = CheckerProgress(self.lakehouse)
        self._progress: Optional[Progress] = None
        self._pending_from: Optional[int] = None  # from the last batch this process ran
        self._checkpoint_manager: Optional[str] = None
        self.runner = BatchRunner(spark=spark)
        self.read_ahead = ReadAhead(self.lakehouse)
        self._renewer: Optional[threading.Thread] = None
        self._stop_renewing = threading.Event()
        self._lease_lock = threading.Lock()
        self._gate = BatchGate()
        self._stopping = threading.Event()
        self.exporter = CheckerExporter()
        #: The port serving the Prometheus metrics once started (``metrics_port`` set), else None.
        self.metrics_port: Optional[int] = None

    def start(self, wait_for_lease: bool = True, stop: Optional[threading.Event] = None) -> "CheckerQuery":
        """Take the lakehouse's checker lease, check the checkpoint against the lakehouse's progress
        record (raises :class:`CheckpointMismatchError`), then start.

        While another checker holds the lease, stand by until it lapses (see
        :meth:`CheckerLease.acquire`), a first batch rehearsed meanwhile so that a takeover's
        comes sooner; :class:`CheckerAlreadyRunningError` if ``stop`` is set
        meanwhile, or at once with ``wait_for_lease=False``. A lakehouse made before each group had its own
        commit log is refused (:class:`OutdatedLakehouseError`) until ``txcoord upgrade``."""
        CommitLogs(self.lakehouse).layout()
        init_lakehouse(self.lakehouse)
        self._read_ahead_unless_held()
        # Resolved before the lease: a standby then has its source's Python worker up, and its rehearsal
        # (:mod:`.rehearsal`), if the holder goes early, is not resolving it beside the query taking over.
        self.spark.dataSource.register(CommitLogSource)
        self._commit_log_reader().load()
        self.read_ahead.warm()
        if self.config.metrics_port is not None and self.metrics_port is None:
            self.exporter.watch_lag(self.lakehouse, lambda: None if self._progress is None else self._progress.next_versions)
            self.metrics_port = self.exporter.serve(self.config.metrics_host, self.config.metrics_port)
        self.exporter.holding_lease(False, standing_by=wait_for_lease)
        rehearsal = Rehearsal(self._commit_log_reader)
        try:
            self.lease.acquire(wait=wait_for_lease, stop=stop, prepare=rehearsal.start)
        except BaseException:
            self.exporter.holding_lease(False)
            self.exporter.close()
            raise
        finally:
            rehearsal.abandon()
        self.exporter.holding_lease(True)
        try:
            checkpoint = StreamingCheckpoint.read(checkpoint_location(self.config), self.lakehouse.storage)
            self._progress = self.progress_store.begin(checkpoint)
            if self.read_ahead.reading_from != self._progress.next_versions:  # not read before the lease
                self.read_ahead.read_from(self._progress.next_versions)
            self.spark.streams.addListener(self.metrics)
            self.query = self._start_query(self._progress.epoch.starting_versions)
        except BaseException:
            self.spark.streams.removeListener(self.metrics)
            self.lease.release()
            self.exporter.holding_lease(False)
            self.exporter.close()
            raise
        self._renewer = threading.Thread(target=self._keep_lease, name="checker-lease", daemon=True)
        self._renewer.start()
        log.info("checker started on %s (checkpoint %s); topic grants: %s", self.config.lakehouse,
                 checkpoint_location(self.config),
                 "off, every group may publish to every topic" if self.config.topic_grants is None
                 else f"{len(self.config.topic_grants)} group(s), the others may publish nowhere")
        return self

    def _read_ahead_unless_held(self) -> None:
        """With no live holder of the lease (a start, not a standby), have the first batch's commits read now.

        Spark then spends seconds on one core of two resolving the source (it looks up Python data sources
        and creates this one, each in a fresh Python process), and the read-ahead worker's start and read
        fit beside it; read once the lease is taken, they competed with the query's start instead, and the
        first batch was longer (docs/performance-log.md#backlog-drain). The read after the lease
        (:meth:`start`) is this one unless the progress record moved meanwhile; a start that finds the lease
        taken after all has read one segment for nothing."""
        try:
            if not self.lease.is_free():
                return
            progress = CheckerProgress(self.lakehouse).load()  # a peek: the record is read again under the lease
        except CoordinatorError as error:  # the start under the lease says so, or stands by
            log.debug("no read ahead before the lease: %s", error)
            return
        self.read_ahead.read_from(progress.next_versions if progress is not None else {})

    def recover(self) -> Progress:
        """Recover from a lost, foreign or stale checkpoint, then leave the checker ready to ``start()``.

        Replays the last batch the progress record announced, over exactly the commit-log
        versions and clock it recorded (each of its writes lands once, whether or not it
        had been made), sets the old checkpoint aside, and begins a new epoch: a fresh
        checkpoint starting at the first versions after that batch, with batch ids that keep
        increasing (:func:`~coordinator.checker.epochs.begin_next_epoch`). Nothing is
        re-delivered and nothing is skipped.

        Does not stand by: while another checker holds the lease it raises
        :class:`CheckerAlreadyRunningError`, as recovering under a running checker is a mistake
        (a holder whose process is gone from this host is taken over at once).

        Example::

            CheckerQuery(spark, config).recover()
            CheckerQuery(spark, config).start()
        """
        CommitLogs(self.lakehouse).layout()
        init_lakehouse(self.lakehouse)
        self.lease.acquire()
        try:
            progress = self.progress_store.load()
            if progress is None:
                raise CheckpointMismatchError(f"{self.progress_store.path} does not exist: no checker has run here, "
                                              "nothing to recover; start the checker normally")
            return begin_next_epoch(self.config, self.progress_store, progress, self.app_id)
        finally:
            self.lease.release()

    def _commit_log_reader(self):
        return (self.spark.readStream.format(CommitLogSource.name()).option("path", self.lakehouse.root)
                .option("storage", json.dumps(self.lakehouse.storage)))

    def _start_query(self, starting_versions: dict[str, int]) -> StreamingQuery:
        # Set only while this query runs: the rehearsal's checkpoint, in a local directory, is written the default way.
        self._checkpoint_manager = write_streaming_checkpoints_in_place(self.spark, checkpoint_location(self.config))
        if self._checkpoint_manager is not None:
            log.info("checkpoint files written in place on S3 (%s)", self._checkpoint_manager)
        records = self._commit_log_reader().option("startingVersions", json.dumps(starting_versions)).load()
        return (
            records.writeStream.queryName(CHECKER_NAME)
            .foreachBatch(self._run_batch)
            .option("checkpointLocation", hadoop_location(checkpoint_location(self.config), self.lakehouse.storage))
            .trigger(processingTime=f"{self.config.trigger_interval_ms} milliseconds")
            .start()
        )

    def _run_batch(self, batch: DataFrame, stream_batch_id: int) -> None:
        def body() -> None:
            self._hold_lease()  # a checker whose lease was taken over writes nothing more
            covered = segments(batch)
            if not covered:
                return
            segment = Segment(covered[0].starts, covered[-1].ends, covered[-1].clock_us)
            records = segment.records(self.lakehouse, self.read_ahead.take())
            self.read_ahead.start(segment)  # the next segment, while this one is decided (a backlog only)
            announced = self._announce(segment, records, stream_batch_id)
            if announced is not None:
                summary = run_batch(self.config, records, announced.batch_id, self.app_id, announced.pending_from,
                                    self.runner, announced.shared_log)
                self._pending_from = summary.pending_from
                self.metrics.batch_done(stream_batch_id, summary)
                self.exporter.batch_done(summary)

        self._gate.run(stream_batch_id, lambda: self._until_storage_answers(stream_batch_id, body))

    def _until_storage_answers(self, stream_batch_id: int, body: Callable[[], None]) -> None:
        """Run a batch's ``body``; while the storage stays unavailable past its retry bound, run it
        again from the start every :data:`OUTAGE_PAUSE_S`, until it goes through or the checker is
        stopped. Running it again is safe: every write is replay-safe, and the state, invalidated
        before the first write, rebuilds. The streaming query thus outlives an outage, and no restart
        is needed once the storage answers again."""
        while True:
            try:
                return body()
            except StorageUnavailableError as error:
                self.runner.invalidate()
                log.error("batch %d could not finish, the storage is unavailable: %s; running it again in %d s",
                          stream_batch_id, error, OUTAGE_PAUSE_S)
                if self._stopping.wait(OUTAGE_PAUSE_S):
                    raise StopRequested(f"stopping; batch {stream_batch_id} is left for the next run") from error

    def _announce(self, segment: Segment, records: pa.Table, stream_batch_id: int) -> Optional[BatchRecord]:
        """Record the batch in the progress record before it writes anything; ``None`` if it is empty.

        A batch Spark replays after a crash was announced already: it runs again as announced.
        """
        progress = self._progress
        if progress.epoch.checkpoint_id is None:  # the first batch of a new epoch: its checkpoint now exists
            checkpoint_id = StreamingCheckpoint.read(checkpoint_location(self.config), self.lakehouse.storage).checkpoint_id
            progress = self.progress_store.adopt(progress, checkpoint_id)
        batch_id = progress.epoch.first_batch_id + stream_batch_id
        if progress.last_batch is not None and progress.last_batch.batch_id == batch_id:
            self._progress = progress
            return progress.last_batch
        now_us = batch_clock(records)
        if now_us is None:
            self._progress = progress
            return None
        # After a restart the last recorded bound serves: the bound only ever grows.
        pending_from = self._pending_from if self._pending_from is not None else progress.pending_from
        announced = BatchRecord(batch_id=batch_id, stream_batch_id=stream_batch_id, starts=dict(segment.starts),
                                ends=dict(segment.ends), now_us=now_us, pending_from=pending_from)
        following = Progress(progress.epoch, announced)
        self.progress_store.save(following)
        self._progress = following  # once durable: a batch run again announces it again
        return announced

    def stop(self) -> None:
        """Stop after the batch in flight, if any, has finished and committed its writes."""
        self._stopping.set()  # a batch waiting for the storage gives up at once
        self._gate.close()
        if self.query is not None:
            self.query.stop()
            self.metrics.detach(self.spark)
            if self._checkpoint_manager is not None:
                self.spark.conf.unset(CHECKPOINT_MANAGER_SETTING)
        if self._renewer is not None:
            self._stop_renewing.set()
            self._renewer.join()
            self.lease.release()
        self.read_ahead.close()
        self.exporter.holding_lease(False)
        self.exporter.close()
        log.info("checker stopped")

    def _keep_lease(self) -> None:
        # Renewed on its own clock, not between batches: a long batch must not let the lease lapse.
        while not self._stop_renewing.wait(self.lease.ttl_s / 3):
            try:
                self._renew_lease()
            except LeaseLostError:
                log.error("checker lease lost; the next batch will fail and the checker stop")
                self.exporter.holding_lease(False)
                return
            except StorageUnavailableError as error:  # tried again at the next renewal, while the lease lasts
                log.error("checker lease not renewed, the storage is unavailable: %s", error)

    def _renew_lease(self) -> None:
        with self._lease_lock:
            self.lease.renew()

    def _hold_lease(self) -> None:
        """Before a batch: the lease is this checker's for two thirds of its TTL more at least. The renewer
        (:meth:`_keep_lease`) renews it every third of the TTL, so a batch makes a request for it only when
        that renewal is late or failed."""
        with self._lease_lock:
            self.lease.hold(self.lease.ttl_s * 2 / 3)

    def await_termination(self, timeout_s: Optional[float] = None) -> bool:
        """Wait for the query to end (``stop()`` or a failure, which is raised)."""
        return self.query.awaitTermination(timeout_s)

    def failure(self) -> Optional[Exception]:
        """The error that ended the query, if it failed (rather than stopped or still running)."""
        return self.query.exception() if self.query is not None else None
