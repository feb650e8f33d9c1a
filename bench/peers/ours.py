"""The workload against this product, deployed as a user would: ``spark-submit jobs/checker.py``
on a fresh lakehouse, one :class:`TransactionProducer` shared by every sender thread, the
listener answering the planned outcome, its check-back committing the unknown ones. The producer is
the Python one in this process (``client="python"``), or the Java client (clients/java) in a JVM of its own as
the peers' drivers run (``client="java"``: ``java/TxcoordPeer.java``, the same ``Workload.java``).

A message is consumable once the topic table version holding it is committed (its commitInfo
timestamp): from then on any query of the table returns it. Deliveries are counted from the topic
table's log, so a duplicate row would show.
"""

from __future__ import annotations

import csv
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import support
from bench.peers import install, servers, workload
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


def _record_deliveries(rows: list[dict], transaction_ids: dict[str, int], t0_s: float, lakehouse: str,
                       topic: str) -> int:
    """Fill ``rows``' first-seen times (ms from ``t0_s`` on the wall clock) and delivery counts from the topic table;
    returns how many transactions it holds."""
    found = support.deliveries(lakehouse, topic)
    for transaction_id, delivery in found.items():
        index = transaction_ids.get(transaction_id)
        if index is not None:
            row = rows[index]
            row["first_seen_ms"] = delivery.timestamp_s * 1000 - t0_s * 1000
            row["deliveries"] = delivery.rows
    return len(found)


def _drain(delivered: Callable[[], int], expected: int, drain_s: float, grace_s: float) -> float:
    """Wait until ``delivered()`` reaches ``expected`` or ``drain_s`` passed, then ``grace_s`` more (a late
    duplicate or a leaked rollback is counted too); returns the seconds until drained."""
    drain_start = time.monotonic()
    while time.monotonic() - drain_start < drain_s:
        if delivered() >= expected:
            break
        time.sleep(0.5)
    drained_after_s = time.monotonic() - drain_start
    time.sleep(grace_s)
    return round(drained_after_s, 3)


def _run_phase(plan: Plan, config_path: str, lakehouse: str, topic: str, drain_s: float, grace_s: float,
               csv_path: Path) -> dict:
    from coordinator import CoordinatorConfig, TransactionProducer

    recorder = _Recorder(plan)
    expected = sum(1 for row in recorder.rows if row["outcome"] != ROLLBACK)
    # A producer group per phase, as each Java driver is its own producer group: check-backs reach this phase's recorder.
    with TransactionProducer(f"bench-peers-{topic}", _listener(recorder), CoordinatorConfig.load(config_path)) as producer:
        send_seconds = _send_all(producer, recorder, topic)
        drained_after_s = _drain(
            lambda: _record_deliveries(recorder.rows, recorder.transaction_ids, recorder.t0, lakehouse, topic),
            expected, drain_s, grace_s)
    _record_deliveries(recorder.rows, recorder.transaction_ids, recorder.t0, lakehouse, topic)
    workload.write_rows(str(csv_path), recorder.rows)
    return {"send_seconds": send_seconds, "drained_after_s": drained_after_s}


def _summary_line(driver: subprocess.Popen, log: Path) -> dict:
    """The driver's next JSON line on its standard output."""
    for line in driver.stdout:
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{install.OURS_JAVA.driver} ended (exit {driver.wait()}) without its summary; see {log}")


def _run_java_phase(plan: Plan, config_path: str, lakehouse: str, topic: str, drain_s: float, grace_s: float,
                    csv_path: Path) -> dict:
    """One phase through the Java client: ``TxcoordPeer`` sends and answers check-backs in its JVM (started as the
    peers' drivers are) until the deliveries, read here, are drained; its rows get their deliveries here."""
    workdir, log = csv_path.parent, csv_path.with_suffix(".driver.log")
    ids_path = csv_path.with_suffix(".ids.csv")
    argv = servers.java(install.OURS_JAVA, install.OURS_JAVA.driver, "--config", config_path,
                        "--group", f"bench-peers-{topic}", "--topic", topic, *plan.driver_args(),
                        "--out", str(csv_path), "--ids", str(ids_path), heap="1g", cwd=workdir)
    expected = sum(1 for k in range(plan.transactions) if plan.outcome_of(k) != ROLLBACK)
    with open(log, "w") as stderr:
        driver = subprocess.Popen(argv, cwd=workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                  text=True)
        try:
            sent = _summary_line(driver, log)
            with open(ids_path, newline="") as ids:
                transaction_ids = {row["transaction_id"]: int(row["index"]) for row in csv.DictReader(ids)}
            drained_after_s = _drain(lambda: len(support.deliveries(lakehouse, topic)), expected, drain_s, grace_s)
            driver.stdin.close()  # drained: the driver writes its rows (checks counted) and stops
            done = _summary_line(driver, log)
            exit_code = driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                driver.kill()
    if exit_code != 0:
        raise RuntimeError(f"{install.OURS_JAVA.driver} failed (exit {exit_code}); see {log}")
    rows = workload.read_rows(str(csv_path))
    _record_deliveries(rows, transaction_ids, sent["t0_epoch_ms"] / 1000, lakehouse, topic)
    workload.write_rows(str(csv_path), rows)
    return {"send_seconds": sent["send_seconds"], "drained_after_s": drained_after_s, **done}


#: The phase runner of each client.
CLIENTS = {"python": _run_phase, "java": _run_java_phase}


def run(phases: dict[str, tuple[Plan, str]], workdir: Path, drain_s: float, grace_s: float,
        client: str = "python") -> dict[str, tuple[Path, dict]]:
    """Start the checker on a fresh lakehouse in ``workdir`` and run each phase's plan on its topic through
    ``client``'s producer (:data:`CLIENTS`), one after the other, as the peers' servers serve every phase:
    ``{phase: (plan, topic)}`` → ``{phase: (csv path, summary)}``.

    Each summary holds ``send_seconds``, ``drained_after_s``, ``checker_start_s`` and ``checker_exit_code``; the Java
    client's also ``errors`` and ``foreign_messages``, as the peers' drivers report them.
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
            summary = CLIENTS[client](plan, config_path, lakehouse, topic, drain_s, grace_s, csv_path)
            results[phase] = (csv_path, {**summary, "checker_start_s": checker_start_s})
    finally:
        exit_code = checker.stop()
    for _, summary in results.values():
        summary["checker_exit_code"] = exit_code
    return results
