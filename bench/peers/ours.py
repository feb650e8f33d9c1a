"""The workload against this product, deployed as a user would: ``spark-submit jobs/checker.py``
on a fresh lakehouse, one :class:`TransactionProducer` shared by every sender thread, the
listener answering the planned outcome, its check-back committing the unknown ones.

A message is consumable once the topic table version holding it is committed (its commitInfo
timestamp): from then on any query of the table returns it. Deliveries are counted from the topic
table's log, so a duplicate row would show.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import support
from bench.peers import workload
from bench.peers.servers import TRANSACTION_CHECK_INTERVAL_MS, TRANSACTION_TIMEOUT_MS
from bench.peers.workload import COMMIT, ROLLBACK, UNKNOWN, Plan

from coordinator.config import CoordinatorConfig

#: The product's default: how often the checker looks for new commits.
TRIGGER_INTERVAL_MS = CoordinatorConfig().trigger_interval_ms


class _Recorder:
    """Per-transaction times, in ms from ``t0`` on the wall clock (Delta commit timestamps are wall-clock)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.t0 = time.time()
        self.rows = [{"index": k, "outcome": plan.outcome_of(k), "started_ms": None, "returned_ms": None,
                      "resolved_by_check_ms": None, "first_seen_ms": None, "deliveries": 0, "checks": 0}
                     for k in range(plan.transactions)]
        self.transaction_ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def now_ms(self) -> float:
        return (time.time() - self.t0) * 1000

    def checked(self, body: bytes) -> str:
        """A check-back asked about this body: count it and return the planned answer."""
        index = self.plan.index_of(body)
        if index is None:
            return ROLLBACK
        row = self.rows[index]
        answer = COMMIT if row["outcome"] in (COMMIT, UNKNOWN) else ROLLBACK
        with self._lock:
            row["checks"] += 1
            if answer == COMMIT and row["resolved_by_check_ms"] is None:
                row["resolved_by_check_ms"] = self.now_ms()
        return answer


def _listener(recorder: _Recorder):
    from coordinator import LocalTransactionState, TransactionListener

    states = {COMMIT: LocalTransactionState.COMMIT_MESSAGE, ROLLBACK: LocalTransactionState.ROLLBACK_MESSAGE,
              UNKNOWN: LocalTransactionState.UNKNOW}

    class PlannedOutcomes(TransactionListener):
        def execute_local_transaction(self, msg, outcome):
            return states[outcome]

        def check_local_transaction(self, msg):
            return states[recorder.checked(msg.body)]

    return PlannedOutcomes()


def _send_all(producer, recorder: _Recorder, topic: str) -> float:
    """Every planned transaction from ``plan.threads`` threads, on the plan's schedule; returns the sending seconds."""
    from coordinator import Message

    plan, lock = recorder.plan, threading.Lock()

    def send_one(k: int) -> None:
        row = recorder.rows[k]
        row["started_ms"] = recorder.now_ms()
        try:
            result = producer.send_message_in_transaction(Message(topic, plan.body_of(k)), row["outcome"])
        except Exception as error:  # counted as a send error, as the Java drivers do
            print(f"  transaction {k} failed: {error}", flush=True)
            return
        row["returned_ms"] = recorder.now_ms()
        with lock:
            recorder.transaction_ids[result.transaction_id] = k

    return support.send_on_schedule(send_one, plan.transactions, plan.rate, plan.threads)


def _record_deliveries(recorder: _Recorder, lakehouse: str, topic: str) -> int:
    """Fill first-seen times and delivery counts from the topic table; returns how many transactions it holds."""
    found = support.deliveries(lakehouse, topic)
    for transaction_id, delivery in found.items():
        index = recorder.transaction_ids.get(transaction_id)
        if index is not None:
            row = recorder.rows[index]
            row["first_seen_ms"] = delivery.timestamp_s * 1000 - recorder.t0 * 1000
            row["deliveries"] = delivery.rows
    return len(found)


def _run_phase(plan: Plan, config_path: str, lakehouse: str, topic: str, drain_s: float, grace_s: float,
               csv_path: Path) -> dict:
    from coordinator import CoordinatorConfig, TransactionProducer

    recorder = _Recorder(plan)
    expected = sum(1 for row in recorder.rows if row["outcome"] != ROLLBACK)
    # A producer group per phase, as each Java driver is its own producer group: check-backs reach this phase's recorder.
    with TransactionProducer(f"bench-peers-{topic}", _listener(recorder), CoordinatorConfig.load(config_path)) as producer:
        send_seconds = _send_all(producer, recorder, topic)
        drain_start = time.monotonic()
        while time.monotonic() - drain_start < drain_s:
            if _record_deliveries(recorder, lakehouse, topic) >= expected:
                break
            time.sleep(0.5)
        drained_after_s = time.monotonic() - drain_start
        time.sleep(grace_s)
    _record_deliveries(recorder, lakehouse, topic)
    workload.write_rows(str(csv_path), recorder.rows)
    return {"send_seconds": send_seconds, "drained_after_s": round(drained_after_s, 3)}


def run(phases: dict[str, tuple[Plan, str]], workdir: Path, drain_s: float, grace_s: float) -> dict[str, tuple[Path, dict]]:
    """Start the checker on a fresh lakehouse in ``workdir`` and run each phase's plan on its topic, one after the
    other, as the peers' servers serve every phase: ``{phase: (plan, topic)}`` → ``{phase: (csv path, summary)}``.

    Each summary holds ``send_seconds``, ``drained_after_s``, ``checker_start_s`` and ``checker_exit_code``.
    """
    from coordinator.lakehouse import init_lakehouse

    lakehouse = str(workdir / "lakehouse")
    init_lakehouse(lakehouse)
    config_path = support.write_config(lakehouse, trigger_interval_ms=TRIGGER_INTERVAL_MS,
                                        transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
                                        transaction_check_interval_ms=TRANSACTION_CHECK_INTERVAL_MS)
    checker = support.CheckerJob(config_path, lakehouse, str(workdir / "checker.log"))
    results = {}
    try:
        checker_start_s = checker.wait_ready(300)
        for phase, (plan, topic) in phases.items():
            csv_path = workdir / f"{topic}.csv"
            summary = _run_phase(plan, config_path, lakehouse, topic, drain_s, grace_s, csv_path)
            results[phase] = (csv_path, {**summary, "checker_start_s": checker_start_s})
    finally:
        exit_code = checker.stop()
    for _, summary in results.values():
        summary["checker_exit_code"] = exit_code
    return results
