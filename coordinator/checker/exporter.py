"""The checker's metrics for Prometheus, served when the configuration sets ``metrics_port``.

Counters count what this checker process did since it started (Prometheus takes a restart's reset
in its stride: ``rate()`` and ``increase()``); gauges say how things stand after its last batch.
The registry, the text format and the HTTP server are ``prometheus_client``'s. docs/operations.md
lists each metric beside its RocketMQ counterpart.

Example::

    exporter = CheckerExporter()
    port = exporter.serve("127.0.0.1", 9464)     # http://127.0.0.1:9464/metrics
    exporter.batch_done(summary)                  # after each batch
    exporter.close()
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Mapping, Optional, Union

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from coordinator.commit_logs import CommitLogs
from coordinator.lakehouse import Lakehouse
from coordinator.protocol import LocalTransactionState
from coordinator.retries import storage_request_counts

__all__ = ["CheckerExporter"]

log = logging.getLogger("coordinator.checker")

#: Batch durations, seconds: a heartbeat takes tens of milliseconds, a backlog's batch seconds.
_BATCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: Transaction latencies, seconds: a commit is visible in about a second; a check-back takes a minute or more.
_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)

#: An END's state as the ``answer`` label says it.
_ANSWERS = {LocalTransactionState.COMMIT_MESSAGE.value: "commit", LocalTransactionState.ROLLBACK_MESSAGE.value: "rollback",
            LocalTransactionState.UNKNOW.value: "unknown"}


class CheckerExporter:
    """The checker's metrics (``txcoord_*``) in a registry of their own, and the server that exposes them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.lease_held = Gauge("txcoord_checker_lease_held", "1 while this checker holds the lakehouse's lease "
                                "and runs batches, else 0", registry=registry)
        self.standby = Gauge("txcoord_checker_standby", "1 while this checker waits for the lease another holds",
                             registry=registry)
        self.batches = Counter("txcoord_batches", "Batches run (heartbeat-only ones included)", registry=registry)
        self.batch_duration = Histogram("txcoord_batch_duration_seconds", "How long a batch took, from reading "
                                        "its records to its last write", buckets=_BATCH_BUCKETS, registry=registry)
        self.last_batch = Gauge("txcoord_last_batch_timestamp_seconds", "When the last batch finished (Unix time)",
                                registry=registry)
        self.halves = Counter("txcoord_half_messages_stored", "Half messages taken into system/half", registry=registry)
        self.ended = Counter("txcoord_transactions_ended", "Transactions ended, by outcome", ["outcome"],
                             registry=registry)
        self.ended_halves = Counter("txcoord_half_messages_ended", "Half messages ended, by topic and outcome: "
                                    "commit, rollback, discard (after the last check, or past "
                                    "file_reserved_time_hours; an operator's later commit counts as a commit)",
                                    ["topic", "outcome"], registry=registry)
        self.delivered = Counter("txcoord_messages_delivered", "Messages written to their topic's table, by topic",
                                 ["topic"], registry=registry)
        self.commit_to_visible = _BatchHistogram("txcoord_commit_to_visible_seconds", "From a transaction's COMMIT "
                                                 "entering the commit log to its message's topic row being written, "
                                                 "by topic", ["topic"], _LATENCY_BUCKETS)
        self.half_to_end = _BatchHistogram("txcoord_half_to_end_seconds", "From a half entering the commit log to the "
                                           "END that decided its transaction (commit or rollback)", [], _LATENCY_BUCKETS)
        registry.register(self.commit_to_visible)
        registry.register(self.half_to_end)
        self.checks = Counter("txcoord_check_requests_sent", "Check-backs requested from producer groups",
                              registry=registry)
        self.check_answers = Counter("txcoord_check_answers", "Producers' answers to check-backs, by answer "
                                     "(commit, rollback, unknown)", ["answer"], registry=registry)
        self.rejected = Counter("txcoord_records_rejected", "Commit-log records refused into system/rejected",
                                registry=registry)
        self.pending = Gauge("txcoord_pending_half_messages", "Half messages with no outcome after the last batch, "
                             "by topic", ["topic"], registry=registry)
        self.withheld = Gauge("txcoord_withheld_messages", "Committed messages whose topic could not be written yet, "
                              "by topic: delivered, and resolved, once it can (0: none)", ["topic"], registry=registry)
        self._oldest_pending_stored_s: Optional[float] = None
        self._withheld_topics: set[str] = set()
        self.oldest_pending_age = Gauge("txcoord_oldest_pending_transaction_age_seconds", "How long the oldest "
                                        "transaction with no outcome has waited since its half was stored (0: none)",
                                        registry=registry)
        self.oldest_pending_age.set_function(self._oldest_pending_age)
        self.maintenance_tables = Counter("txcoord_maintenance_tables", "Tables the checker's scheduled maintenance "
                                          "went over, by outcome: maintained, failed (reported, the others maintained)",
                                          ["outcome"], registry=registry)
        for outcome in ("maintained", "failed"):
            self.maintenance_tables.labels(outcome)
        self.maintenance_failed = Gauge("txcoord_maintenance_failed_tables", "Tables the last scheduled maintenance "
                                        "run could not maintain (0: none)", registry=registry)
        self.maintenance_last_run = Gauge("txcoord_maintenance_last_run_timestamp_seconds", "When the last scheduled "
                                          "maintenance run ended (Unix time; 0: none yet)", registry=registry)
        self.maintenance_seconds = Gauge("txcoord_maintenance_last_run_duration_seconds", "How long the last "
                                         "scheduled maintenance run took", registry=registry)
        self.registry.register(_StorageRequestsCollector())
        self._server = None

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host``:``port`` (0: any free port) in a background thread; return the port."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        bound = self._server.server_port
        log.info("metrics served at http://%s:%d/metrics", host, bound)
        return bound

    def batch_done(self, summary) -> None:
        """Count what one batch did (a :class:`~coordinator.checker.batch.BatchSummary`)."""
        self.batches.inc()
        self.batch_duration.observe(summary.duration_ms / 1000)
        self.last_batch.set(time.time())
        self.halves.inc(summary.halves)
        self.ended.labels("commit").inc(summary.commits)
        self.ended.labels("rollback").inc(summary.rollbacks)
        for (outcome, topic), halves in summary.ended_by_topic.items():
            self.ended_halves.labels(topic, str(outcome).lower()).inc(halves)
        for topic, latencies in summary.commit_to_visible_s.items():  # one latency per message delivered
            self.delivered.labels(topic).inc(len(latencies))
            self.commit_to_visible.observe_all(latencies, topic)
        self.half_to_end.observe_all(summary.half_to_end_s)
        self.checks.inc(summary.checks)
        for state, answers in summary.check_answers.items():
            self.check_answers.labels(_ANSWERS[state]).inc(answers)
        self.rejected.inc(summary.rejected)
        for topic, halves in summary.pending_by_topic.items():
            self.pending.labels(topic).set(halves)
        for topic in self._withheld_topics | set(summary.withheld_by_topic):  # 0 once a topic took its messages
            self.withheld.labels(topic).set(summary.withheld_by_topic.get(topic, 0))
        self._withheld_topics = set(summary.withheld_by_topic)
        stored = summary.oldest_pending_stored_us
        self._oldest_pending_stored_s = None if stored is None else stored / 1_000_000

    def maintenance_done(self, maintained: int, failed: int, seconds: float) -> None:
        """Count one scheduled maintenance run (:mod:`coordinator.jobs.maintenance`): the tables it maintained,
        those it could not, and how long it took."""
        self.maintenance_tables.labels("maintained").inc(maintained)
        self.maintenance_tables.labels("failed").inc(failed)
        self.maintenance_failed.set(failed)
        self.maintenance_seconds.set(seconds)
        self.maintenance_last_run.set(time.time())

    def _oldest_pending_age(self) -> float:
        stored = self._oldest_pending_stored_s  # as of the last batch; the age as of this scrape
        return 0.0 if stored is None else max(0.0, time.time() - stored)

    def watch_lag(self, lakehouse: Lakehouse, read: Callable[[], Optional[Mapping[str, int]]]) -> None:
        """Serve the checker's lag behind the commit logs, computed at each scrape (on the server's
        thread, never in a batch) from ``read()``: each log's first version the checker has not read
        (``None``: not known yet, nothing served)."""
        self.registry.register(_LagCollector(CommitLogs(lakehouse), read))

    def holding_lease(self, held: bool, standing_by: bool = False) -> None:
        """Say whether this checker holds the lease, or stands by for it."""
        self.lease_held.set(1 if held else 0)
        self.standby.set(1 if standing_by else 0)

    def close(self) -> None:
        """Stop serving (the port is free again)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _BatchHistogram:
    """A histogram fed a batch's samples at once, served as prometheus_client's ``Histogram`` serves one.

    A batch working off a backlog delivers ~100,000 messages, each with its latency: observed one by one
    through ``Histogram.observe`` they took a sizeable part of the batch; counted into the buckets over
    Arrow columns, almost nothing (docs/performance-log.md#backlog-drain).
    """

    def __init__(self, name: str, documentation: str, labelnames: list[str], buckets: tuple[float, ...]):
        self.name, self.documentation, self.labelnames, self.buckets = name, documentation, labelnames, buckets
        self._lock = threading.Lock()
        # Per label values: how many samples lie at or below each bucket's bound, then all of them; their sum.
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}
        if not labelnames:
            self.observe_all(pa.array([], pa.float64()))

    def observe_all(self, seconds: Union[pa.Array, pa.ChunkedArray], *labels: str) -> None:
        """Count each of ``seconds`` (an Arrow array of floats) under ``labels``."""
        seconds = seconds.drop_null()
        counts = [pc.sum(pc.less_equal(seconds, bound)).as_py() or 0 for bound in self.buckets] + [len(seconds)]
        total = pc.sum(seconds).as_py() or 0.0
        with self._lock:
            known = self._counts.setdefault(labels, [0] * len(counts))
            self._counts[labels] = [before + added for before, added in zip(known, counts)]
            self._sums[labels] = self._sums.get(labels, 0.0) + total

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        bounds = [floatToGoString(bound) for bound in self.buckets] + ["+Inf"]
        with self._lock:
            for labels, counts in sorted(self._counts.items()):
                family.add_metric(list(labels), list(zip(bounds, counts)), self._sums[labels])
        yield family


class _LagCollector:
    """``txcoord_commit_log_lag_versions`` and ``txcoord_commit_log_lag_seconds``, as of the scrape."""

    def __init__(self, logs: CommitLogs, read: Callable[[], Optional[Mapping[str, int]]]):
        self.logs, self.read = logs, read

    def describe(self):  # registering must not run a scrape's storage reads
        return []

    def collect(self):
        read = self.read()
        if read is None:
            return
        try:
            lag = self.logs.lag(read)
        except Exception:  # a storage error must not fail the whole scrape
            log.warning("metrics: could not measure the lag behind the commit logs", exc_info=True)
            return
        yield GaugeMetricFamily("txcoord_commit_log_lag_versions", "Commit-log versions written that the checker "
                                "has not read yet, over every log", value=lag.unread_versions)
        yield GaugeMetricFamily("txcoord_commit_log_lag_seconds", "Age of the oldest commit-log version the checker "
                                "has not read yet (0: none)", value=lag.seconds)


class _StorageRequestsCollector:
    """``txcoord_storage_*``: this process's storage requests that did not go straight through
    (:mod:`coordinator.retries` counts them, whichever thread made them)."""

    def describe(self):
        return []

    def collect(self):
        counts = storage_request_counts()
        retries = CounterMetricFamily("txcoord_storage_retries", "Object-storage requests tried again, by operation "
                                      "and cause (throttled, server_error, timeout, connection, other)",
                                      labels=["operation", "cause"])
        for (operation, cause), n in sorted(counts.retries.items()):
            retries.add_metric([operation, cause], n)
        exhausted = CounterMetricFamily("txcoord_storage_requests_failed", "Object-storage requests that failed on "
                                        "every attempt until max_retries or retry_timeout ran out, by operation and "
                                        "the last failure's cause", labels=["operation", "cause"])
        for (operation, cause), n in sorted(counts.exhausted.items()):
            exhausted.add_metric([operation, cause], n)
        own = CounterMetricFamily("txcoord_storage_own_writes_recognised", "Conditional writes refused on a retry "
                                  "because the file held exactly what this writer wrote: the first attempt was made "
                                  "and its reply lost", labels=["operation"])
        for operation, n in sorted(counts.own_writes_recognised.items()):
            own.add_metric([operation], n)
        races = CounterMetricFamily("txcoord_storage_commit_races_lost", "Delta commits of this process refused "
                                    "because another writer made that version first, each tried again at the next "
                                    "version after a backoff", value=counts.commit_races_lost)
        yield from (retries, exhausted, own, races)
