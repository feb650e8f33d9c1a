"""The whole protocol with the real producer, its check-back worker and the checker.

The five transactions of the RocketMQ example (seeds/001): msg-4 commits, msg-5 rolls
back, msg-1..3 end UNKNOW; their checks answer UNKNOW (forever), COMMIT and ROLLBACK.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from deltalake import DeltaTable

from coordinator import LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.checker.query import CheckerQuery
from coordinator.spark import spark_submit
from support import REPO_ROOT
from coordinator.control.lease import CheckerLease
from coordinator.exceptions import CheckerAlreadyRunningError
from coordinator.commit_logs import CommitLogs
from coordinator.lakehouse import Lakehouse, create_group_tables, read_table
from coordinator.tables import CHECK_REQUESTS, COMMIT_LOG, HALF
from support import Commits, Job, child_environment, first_batch_after, half_record, wait_until
from support.batches import stored_time

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)


class SeedListener(TransactionListener):
    """The listener of the RocketMQ example, recording every check it answers."""

    first_phase = {"msg-1": UNKNOW, "msg-2": UNKNOW, "msg-3": UNKNOW, "msg-4": COMMIT, "msg-5": ROLLBACK}
    check_answer = {"msg-1": UNKNOW, "msg-2": COMMIT, "msg-3": ROLLBACK}

    def __init__(self):
        self.checked: list[tuple[str, str, bytes, str]] = []

    def execute_local_transaction(self, msg, arg):
        return self.first_phase[msg.keys]

    def check_local_transaction(self, msg):
        self.checked.append((msg.keys, msg.topic, msg.body, msg.transaction_id, msg.tags, dict(msg.properties)))
        return self.check_answer[msg.keys]


GROUP = "TransactionProducer"


def end_records(lakehouse: str) -> int:
    kinds = read_table(Lakehouse(lakehouse).commit_log(GROUP), ["kind"]).column("kind").to_pylist()
    return kinds.count("END")


def answered_checks(lakehouse: str) -> int:
    log = read_table(Lakehouse(lakehouse).commit_log(GROUP), ["check_id"])
    return sum(1 for c in log.column("check_id").to_pylist() if c is not None)


def test_five_transactions_of_the_rocketmq_example(checker):
    config = checker.config  # immunity 6 s, interval 60 s, at most 5 checks
    listener = SeedListener()
    with TransactionProducer(GROUP, listener, config) as producer:
        results = {
            f"msg-{i}": producer.send_message_in_transaction(
                Message("TransactionTopicTest", f"Hello RocketMQ {i}".encode(), keys=f"msg-{i}", tags="TagA",
                        properties={"k": str(i)})
            )
            for i in range(1, 6)
        }
        assert {k: r.local_transaction_state for k, r in results.items()} == SeedListener.first_phase
        txn = {k: r.transaction_id for k, r in results.items()}
        wait_until(lambda: end_records(config.lakehouse) == 5)  # the one-way ENDs reach the commit log

        first = checker.run()
        assert (first.halves, first.commits, first.rollbacks, first.checks) == (5, 1, 1, 0)
        born = stored_time(checker, txn["msg-1"])
        checker.run(now=born + dt.timedelta(seconds=5))
        assert len(checker.rows("check_requests")) == 0  # no check before the immunity time

        now = born + dt.timedelta(seconds=7)
        assert checker.run(now=now).checks == 3
        wait_until(lambda: answered_checks(config.lakehouse) == 3)
        resolved = checker.run(now=now + dt.timedelta(seconds=1))
        assert (resolved.commits, resolved.rollbacks, resolved.rejected) == (1, 1, 0)
        for round_ in range(2, config.transaction_check_max + 1):
            # The interval runs from when the last check was written, in real time.
            now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=61)
            assert checker.run(now=now).checks == 1
            wait_until(lambda: answered_checks(config.lakehouse) == 2 + round_)
        now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=61)
        assert checker.run(now=now).discarded == 1

    delivered = {r.keys: bytes(r.body) for r in checker.rows("TransactionTopicTest")}
    assert delivered == {"msg-2": b"Hello RocketMQ 2", "msg-4": b"Hello RocketMQ 4"}
    discarded = checker.rows("discarded")
    assert [(r.keys, r.check_times, r.producer_group) for r in discarded] == [("msg-1", 5, "TransactionProducer")]
    checks_by_key = {}
    for keys, topic, body, transaction_id, tags, properties in listener.checked:
        assert (topic, body, transaction_id, tags, properties) == (
            "TransactionTopicTest", f"Hello RocketMQ {keys[-1]}".encode(), txn[keys], "TagA", {"k": keys[-1]})
        checks_by_key[keys] = checks_by_key.get(keys, 0) + 1
    assert checks_by_key == {"msg-1": 5, "msg-2": 1, "msg-3": 1}
    outcomes = {r.transaction_id: r.outcome for r in checker.rows("op")}
    assert outcomes == {txn["msg-1"]: "DISCARD", txn["msg-2"]: "COMMIT", txn["msg-3"]: "ROLLBACK",
                        txn["msg-4"]: "COMMIT", txn["msg-5"]: "ROLLBACK"}


def test_streaming_checker_heartbeat_fires_checks_with_no_new_records(spark, config):
    config = config.replace(transaction_timeout_ms=1000, trigger_interval_ms=500)
    checker = CheckerQuery(spark, config).start()
    try:
        with pytest.raises(CheckerAlreadyRunningError, match="another checker holds"):
            CheckerQuery(spark, config).start(wait_for_lease=False)  # one active checker per lakehouse
        from support.lakehouse import append_rows

        lakehouse = Lakehouse(config.lakehouse)
        create_group_tables(lakehouse, "g")
        append_rows(lakehouse.commit_log("g"), COMMIT_LOG, [half_record("quiet", group="g")])
        written_at = {log: DeltaTable(lakehouse.key_path(log.key)).version() for log in CommitLogs(lakehouse).discover()}
        # Nothing else is ever written to any commit log: only the heartbeat can bring the check.
        wait_until(lambda: read_table(lakehouse.check_requests("g")).num_rows == 1, 120)
        assert {log: DeltaTable(lakehouse.key_path(log.key)).version()
                for log in CommitLogs(lakehouse).discover()} == written_at
    finally:
        checker.stop()
    CheckerLease(config.lakehouse).acquire()  # released on stop: a new checker may start at once
    request = spark.read.format("delta").load(Lakehouse(config.lakehouse).path(CHECK_REQUESTS)).first()
    [sent] = read_table(Lakehouse(config.lakehouse).check_requests("g")).to_pylist()  # what the group's producer reads
    assert (sent["check_id"], sent["transaction_id"], sent["body"]) == (request.check_id, "quiet", b"hello")
    half = spark.read.format("delta").load(Lakehouse(config.lakehouse).path(HALF)).first()
    assert request.transaction_id == "quiet"
    assert (request.requested_at - half.stored_timestamp) >= dt.timedelta(seconds=1)


@pytest.mark.slow
def test_a_standby_takes_over_from_a_killed_checker_and_exits_zero_on_sigterm(tmp_path):
    """Two checker jobs on one lakehouse: the first (``python jobs/checker.py``) delivers, a third start with
    ``--exit-if-running`` is refused, the second (``spark-submit``) stands by with its Spark session up and a
    first batch rehearsed, once the first is killed with SIGKILL, takes over and delivers; SIGTERM then stops it cleanly."""
    lakehouse = tmp_path / "lakehouse"
    conf = tmp_path / "coordinator.toml"
    conf.write_text(f'lakehouse = "{lakehouse}"\ntrigger_interval_ms = 500\n')

    from coordinator import CoordinatorConfig

    topic = lakehouse / "topics" / "JOB_TOPIC"

    def send(producer, count):
        return [producer.send_message_in_transaction(Message("JOB_TOPIC", b"m")).transaction_id for _ in range(count)]

    def delivered() -> list[str]:
        return read_table(str(topic)).column("transaction_id").to_pylist() if DeltaTable.is_deltatable(str(topic)) else []

    first_log, standby_log = open(tmp_path / "first.log", "w+"), open(tmp_path / "standby.log", "w+")
    first = subprocess.Popen([sys.executable, str(REPO_ROOT / "jobs" / "checker.py"), "--config", str(conf)],
                             stdout=first_log, stderr=subprocess.STDOUT, start_new_session=True)
    argv, env = spark_submit(REPO_ROOT / "jobs" / "checker.py", "--config", str(conf))
    standby = None
    try:
        with TransactionProducer("jobs", Commits(), CoordinatorConfig.load(conf)) as producer:
            sent = send(producer, 3)
            wait_until(lambda: first.poll() is not None or len(delivered()) == 3, 240)
            refused = subprocess.run([sys.executable, str(REPO_ROOT / "jobs" / "checker.py"), "--config", str(conf),
                                      "--exit-if-running"], capture_output=True, text=True, timeout=60)
            standby = subprocess.Popen(argv, env=env, stdout=standby_log, stderr=subprocess.STDOUT)
            wait_until(lambda: standby.poll() is not None or "standing by with a first batch rehearsed"
                       in (tmp_path / "standby.log").read_text(), 240)
            os.killpg(first.pid, signal.SIGKILL)  # the job and the JVM it started
            first.wait(30)
            sent += send(producer, 3)
            wait_until(lambda: standby.poll() is not None or len(delivered()) == 6, 240)
        standby.send_signal(signal.SIGTERM)
        standby.wait(120)
    finally:
        for job in (first, standby):
            if job is not None and job.poll() is None:
                job.kill()
    output = (tmp_path / "standby.log").read_text()
    assert refused.returncode == 3 and "another checker holds" in refused.stderr, refused.stderr[-3000:]
    assert standby.returncode == 0, output[-3000:]
    assert "took over the checker lease" in output and "checker stopped" in output
    assert sorted(delivered()) == sorted(sent)  # each exactly once: nothing lost or repeated by the takeover


SLOW_CHMOD = """#!/bin/sh
# Hadoop's chmod for each checkpoint file. Once the test has created `hold`, each one says it runs and then
# waits for `release` (which the test creates after its stop), at most 60 s: the stop lands while one runs.
bin="$(dirname "$0")"
if [ -e "$bin/hold" ]; then
    touch "$bin/running.$$"
    waited=0
    while [ ! -e "$bin/release" ] && [ "$waited" -lt 600 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
fi
{chmod} "$@"
"""


@pytest.mark.slow
def test_a_stop_sent_to_the_whole_group_as_hadoop_runs_chmod_exits_zero_and_loses_nothing(tmp_path):
    """Spark writes each checkpoint file through Hadoop, which on a local disk spawns ``chmod`` for it; a
    stop sent to the checker's whole process group (Ctrl-C, systemd) kills that ``chmod`` too and fails the
    streaming query. Here, once the first transactions are delivered, each ``chmod`` waits until the stop
    has been sent while one runs: the job still exits 0, saying so, and the next start delivers every
    transaction once."""
    lakehouse = tmp_path / "lakehouse"
    conf = tmp_path / "coordinator.toml"
    conf.write_text(f'lakehouse = "{lakehouse}"\ntrigger_interval_ms = 100\n')
    slow_bin = tmp_path / "bin"
    slow_bin.mkdir()
    (slow_bin / "chmod").write_text(SLOW_CHMOD.format(chmod=shutil.which("chmod")))
    (slow_bin / "chmod").chmod(0o755)
    topic = lakehouse / "topics" / "STOP_TOPIC"

    def delivered() -> list[str]:
        return read_table(str(topic)).column("transaction_id").to_pylist() if DeltaTable.is_deltatable(str(topic)) else []

    from coordinator import CoordinatorConfig

    argv = [sys.executable, str(REPO_ROOT / "jobs" / "checker.py"), "--config", str(conf)]
    slowed = Job(argv, tmp_path / "first.log", env=dict(os.environ, PATH=f"{slow_bin}:{os.environ['PATH']}")).start()
    restarted = Job(argv, tmp_path / "restarted.log")
    try:
        with TransactionProducer("stops", Commits(), CoordinatorConfig.load(conf)) as producer:
            sent = [producer.send_message_in_transaction(Message("STOP_TOPIC", b"m")).transaction_id for _ in range(3)]
            wait_until(lambda: not slowed.running or len(delivered()) == 3, 240)
            (slow_bin / "hold").touch()  # from now on each chmod waits for the release
            wait_until(lambda: not slowed.running or any(slow_bin.glob("running.*")), 60, "a held chmod")
            os.killpg(slowed.pid, signal.SIGTERM)  # while a chmod runs
            (slow_bin / "release").touch()  # any chmod the stop itself brings runs at once
            slowed_exit = slowed.wait(120)
            output = (tmp_path / "first.log").read_text()
            assert slowed_exit == 0, output[-3000:]
            sent += [producer.send_message_in_transaction(Message("STOP_TOPIC", b"m")).transaction_id for _ in range(2)]
            restarted.start()
            wait_until(lambda: not restarted.running or len(delivered()) == 5, 240)
        os.killpg(restarted.pid, signal.SIGTERM)
        restarted_exit = restarted.wait(120)
    finally:
        for job in (slowed, restarted):
            if job.running:
                job.kill()
    assert "the streaming query failed as the stop signal arrived" in output, output[-3000:]
    assert "checker stopped" in output
    assert restarted_exit == 0, (tmp_path / "restarted.log").read_text()[-3000:]
    assert sorted(delivered()) == sorted(sent)  # each exactly once


def _descendants(job: Job) -> dict[int, tuple[psutil.Process, str]]:
    """``job``'s descendants now, each with its command line (read while it runs)."""
    try:
        found = psutil.Process(job.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    described = {}
    for process in found:
        try:
            described[process.pid] = (process, " ".join(process.cmdline()))
        except psutil.NoSuchProcess:  # ended since listed
            pass
    return described


def _running(processes) -> list[str]:
    """Those of ``processes`` still running (a zombie has ended), by pid and command line."""
    running = []
    for process, command in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:  # is_running: never a reused pid
                running.append(f"{process.pid} (parent {process.ppid()}) {command[:200]}")
        except psutil.NoSuchProcess:
            pass
    return running


@pytest.mark.slow
@pytest.mark.parametrize("launch, ending", [("python", "SIGTERM"), ("python", "a failed batch"),
                                            ("python", "a failed start"), ("spark-submit", "SIGTERM"),
                                            ("spark-submit", "a failed batch")])
def test_no_process_of_the_checker_outlives_its_exit(tmp_path, launch, ending):
    """The checker job, launched as ``python jobs/checker.py`` (it starts the JVM, as ``txcoord checker`` does)
    or under ``spark-submit`` (the JVM starts it), ends on SIGTERM (exit 0), on a batch that fails because its
    lease was taken over (exit 1), or at start-up on a metrics port already in use (exit 1). Every process it
    started, directly or not (the JVM, Spark's Python workers, the source's runner, the read-ahead worker,
    multiprocessing's resource tracker and the scheduled maintenance's process, here maintaining without a
    pause), seen while it ran, has ended by the time it has exited."""
    lakehouse = tmp_path / "lakehouse"
    conf = tmp_path / "coordinator.toml"
    settings = f'lakehouse = "{lakehouse}"\ntrigger_interval_ms = 200\nmaintenance_interval_ms = 1\n'
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    if ending == "a failed start":
        settings += f"metrics_port = {taken.getsockname()[1]}\n"
    conf.write_text(settings)
    job_file = REPO_ROOT / "jobs" / "checker.py"
    if launch == "python":
        argv, env = [sys.executable, str(job_file), "--config", str(conf)], dict(os.environ)
    else:
        argv, env = spark_submit(job_file, "--config", str(conf))
    checker = Job(argv, tmp_path / "checker.log", env=child_environment(env)).start()
    seen: dict[int, tuple[psutil.Process, str]] = {}

    def seen_running(command: str) -> bool:
        return any(command in described for _, described in seen.values())

    def collected(condition) -> bool:
        for pid, (process, command) in _descendants(checker).items():
            # The latest command line (the JVM's launcher execs it), but not the empty one of a process ending.
            seen[pid] = (process, command or seen.get(pid, (process, ""))[1])
        return condition()

    try:
        if ending != "a failed start":
            # Up to its first batch with the helpers of a running checker seen: its query's source runner, its
            # read-ahead worker and its maintenance.
            checker.wait_for(lambda: collected(lambda: seen_running("python_streaming_source_runner")
                                               and seen_running("multiprocessing.spawn")
                                               and seen_running("coordinator.jobs.maintenance")
                                               and first_batch_after(lakehouse, checker.started_wall)),
                             "its first batch", 300, poll_s=0.1)
            if ending == "SIGTERM":
                checker.terminate()
            else:  # a checker whose clock says the lease lapsed takes it: the next batch fails
                CheckerLease(str(lakehouse), clock=lambda: time.time() + 3600).acquire()
        wait_until(lambda: collected(lambda: not checker.running), 180, "the checker's exit", poll_s=0.05)
    finally:
        taken.close()
        if checker.running:
            checker.kill()
    output = checker.tail(40)
    assert checker.exit_code() == (0 if ending == "SIGTERM" else 1), output
    assert ending != "a failed start" or "Address already in use" in output, output
    # What it started: under spark-submit the JVM is the job itself, not one of its descendants.
    assert (launch == "spark-submit" or seen_running("java")) and seen_running("pyspark.daemon")
    assert seen_running("multiprocessing.resource_tracker"), "\n".join(described[:200] for _, described in seen.values())
    # Checked the moment the job has exited, not after a wait: a process it left behind would still be there.
    assert not _running(seen.values()), "\n".join(_running(seen.values()))
