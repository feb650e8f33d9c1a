"""The lakehouse on S3-compatible object storage, against a real server on loopback (versitygw,
``coordinator/conformance/versitygw.py``): conditional writes, the checker's lease and progress record, and the
producer's commit log, with the same guarantees as on a local disk."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from coordinator import LocalTransactionState, Message, TransactionListener, TransactionProducer
from support import REPO_ROOT
from coordinator.cli import main
from coordinator.commit_logs import CommitLogRef
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease
from coordinator.control.progress import BatchRecord, CheckerProgress, Epoch, Progress
from coordinator.demo.services import CreditStore
from coordinator.exceptions import CheckerAlreadyRunningError, LeaseLostError
from coordinator.lakehouse import Lakehouse, open_table, read_table
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.storage import FileStore
from coordinator.tables import CHECK_REQUESTS, HALF, OP
from support import Clock, DEMO_ORDERS, end_record, half_record, without_txcoord_settings
from support.lakehouse import SteadyProducer, append_rows
from tests.test_notebooks import PLOTS, run_notebook


def race(count: int, attempt) -> list:
    """Run ``attempt(i)`` for ``i`` in ``range(count)`` at once, from threads released together."""
    start = threading.Barrier(count)

    def run(i):
        start.wait()
        return attempt(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def test_a_file_is_created_once_and_replaced_only_at_the_version_read(s3_lakehouse):
    files = s3_lakehouse.files
    created = race(8, lambda i: files.create("x/one.json", f"writer {i}".encode()))
    assert sum(version is not None for version in created) == 1
    current = files.read("x/one.json")
    assert current.data == f"writer {created.index(current.version)}".encode()

    replaced = race(8, lambda i: files.replace("x/one.json", f"replaced by {i}".encode(), current.version))
    assert sum(version is not None for version in replaced) == 1
    assert files.replace("x/one.json", b"stale", current.version) is None
    assert files.replace("x/missing.json", b"?", current.version) is None
    assert files.list("x") == ["x/one.json"] and files.read("x/missing.json") is None


def test_the_same_file_api_on_a_local_disk(tmp_path):
    files = FileStore.at(str(tmp_path))
    created = race(8, lambda i: files.create("x/one.json", f"writer {i}".encode()))
    assert sum(version is not None for version in created) == 1
    current = files.read("x/one.json")
    replaced = race(8, lambda i: files.replace("x/one.json", f"replaced by {i}".encode(), current.version))
    assert sum(version is not None for version in replaced) == 1
    assert files.list("x") == ["x/one.json"]


def test_the_lease_on_object_storage_keeps_one_checker_and_is_taken_over_after_expiry(s3_lakehouse):
    clock = Clock()
    first = CheckerLease(s3_lakehouse, ttl_s=1.0, clock=clock).acquire()
    with pytest.raises(CheckerAlreadyRunningError, match=r"s3://lakehouse/.*_checker_lease.json"):
        CheckerLease(s3_lakehouse, ttl_s=1.0, clock=clock).acquire()
    clock.now += 0.6
    first.renew()
    clock.now += 1.1  # no renewal for longer than the lease lives: the holder stalled
    successor = CheckerLease(s3_lakehouse, ttl_s=1.0, clock=clock).acquire()
    with pytest.raises(LeaseLostError):
        first.renew()
    first.release()  # not its lease any more: the successor keeps it
    with pytest.raises(CheckerAlreadyRunningError):
        CheckerLease(s3_lakehouse, ttl_s=1.0, clock=clock).acquire()
    successor.release()
    CheckerLease(s3_lakehouse, ttl_s=1.0, clock=clock).acquire()  # released: taken at once


def test_of_checkers_racing_for_a_lapsed_lease_exactly_one_takes_it(s3_lakehouse):
    clock = Clock()
    CheckerLease(s3_lakehouse, ttl_s=1.0, clock=clock).acquire()
    clock.now += 2.0

    def take(_):
        try:
            return CheckerLease(s3_lakehouse, ttl_s=1.0, clock=clock).acquire()
        except CheckerAlreadyRunningError:
            return None

    assert sum(lease is not None for lease in race(6, take)) == 1


def test_a_stale_checker_fails_its_next_batch_announcement(s3_lakehouse):
    stale, successor = CheckerProgress(s3_lakehouse), CheckerProgress(s3_lakehouse)
    log = CommitLogRef.of_group("g").key
    epoch = Epoch(number=0, first_batch_id=0, starting_versions={log: 0}, checkpoint_id="q")
    assert stale.load() is None
    stale.save(Progress(epoch, BatchRecord(0, 0, {log: 0}, {log: 1}, 0)))
    successor.load()  # took the lease over, read the record
    successor.save(Progress(epoch, BatchRecord(1, 1, {log: 1}, {log: 2}, 0)))
    with pytest.raises(LeaseLostError, match="changed by another checker"):
        stale.save(Progress(epoch, BatchRecord(1, 1, {log: 1}, {log: 4}, 0)))
    recorded = CheckerProgress(s3_lakehouse).load()
    assert (recorded.last_batch.batch_id, recorded.next_versions) == (1, {log: 2})


def test_producers_commit_to_the_commit_log_on_object_storage(s3_server, s3_lakehouse):
    """Two writers at once: every commit lands, none is lost, each is its own version."""
    commit_log = s3_lakehouse.commit_log("g")  # group g's own log
    with CommitLogWriter(s3_lakehouse, "g") as first, CommitLogWriter(s3_lakehouse, "g") as second:
        futures = [(first if i % 2 else second).submit([half_record(f"t{i}")]) for i in range(20)]
        versions = [future.result() for future in futures]
    log = read_table(commit_log, ["transaction_id"], storage=s3_lakehouse.storage)
    assert sorted(log.column(0).to_pylist()) == sorted(f"t{i}" for i in range(20))
    committed = sorted(set(versions))  # submits of one group commit share its version
    assert committed == list(range(1, len(committed) + 1))  # each its own version, none lost
    assert open_table(commit_log, storage=s3_lakehouse.storage).version() == committed[-1]

    class Commits(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, msg):
            return LocalTransactionState.COMMIT_MESSAGE

    config = CoordinatorConfig(lakehouse=s3_lakehouse.root, storage=s3_server.storage_options)
    producer = TransactionProducer("g", Commits(), config)
    producer.start()
    try:
        result = producer.send_message_in_transaction(Message(topic="ORDERS", body=b"on S3"))
    finally:
        producer.shutdown()
    assert result.local_transaction_state == LocalTransactionState.COMMIT_MESSAGE
    records = read_table(commit_log, ["kind", "transaction_id", "body"], storage=s3_lakehouse.storage).to_pylist()
    assert {(r["kind"], r["body"]) for r in records if r["transaction_id"] == result.transaction_id} == {
        ("HALF", b"on S3"), ("END", None)}
    assert Lakehouse(s3_lakehouse.root, s3_server.storage_options).files.list("groups/g/_producers") == []  # withdrawn


def test_the_operator_tools_read_and_resolve_a_lakehouse_on_object_storage(s3_server, s3_lakehouse, tmp_path, capsys):
    """`txcoord status`, `pending`, `inspect` and `resolve`, configured by a TOML's [storage] table."""
    settings = "\n".join(f'{key} = "{value}"' for key, value in s3_server.storage_options.items())
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(f'lakehouse = "{s3_lakehouse.root}"\ntransaction_check_max = 3\n\n[storage]\n{settings}\n')
    with CommitLogWriter(s3_lakehouse, "g") as writer:
        writer.submit([half_record("stuck", body=b"held")]).result()
    stored = read_table(s3_lakehouse.commit_log("g"), ["transaction_id", "born_timestamp"],
                        storage=s3_lakehouse.storage).to_pylist()[0]["born_timestamp"]
    # What the checker's ingest step writes for it (the checker's Spark side does not run on S3 yet).
    append_rows(s3_lakehouse.path(HALF), HALF, [half_record("stuck", body=b"held", queue_offset=1 << 20,
                                                            stored_timestamp=stored, immunity_ms=6000, commit_version=1,
                                                            batch_id=0)], storage=s3_lakehouse.storage)

    assert main(["pending", "--json", "--config", str(config_file)]) == 0
    [pending] = json.loads(capsys.readouterr().out)["pending"]
    assert (pending["transaction_id"], pending["checks"], pending["next_step"]) == ("stuck", 0, "check")
    assert main(["status", "--json", "--config", str(config_file)]) == 1  # no checker holds the lease
    status = json.loads(capsys.readouterr().out)
    assert (status["lakehouse"], status["pending_transactions"], status["checker_alive"]) == (s3_lakehouse.root, 1, False)

    assert main(["resolve", "stuck", "--commit", "--reason", "paid", "--config", str(config_file)]) == 0
    capsys.readouterr()
    ends = [r for r in read_table(s3_lakehouse.operators_log, ["kind", "transaction_id", "state", "check_id"],
                                  storage=s3_lakehouse.storage).to_pylist() if r["kind"] == "END"]  # the operators' log
    assert [(r["transaction_id"], r["state"]) for r in ends] == [("stuck", "COMMIT_MESSAGE")]
    assert ends[0]["check_id"].startswith("operator-")

    assert main(["inspect", "stuck", "--json", "--config", str(config_file)]) == 0
    steps = [event["step"] for event in json.loads(capsys.readouterr().out)["events"]]
    assert steps == ["half sent", "half stored", "end request"]


def test_the_checkers_batches_decide_and_deliver_on_object_storage(s3_server, s3_lakehouse):
    """The batch steps (ingest, resolve, promote, check) over a commit log on S3, writing their tables
    there; a replayed batch writes nothing twice, and a restarted state (rebuilt from S3) goes on."""
    from coordinator.checker.batch import run_batch
    from coordinator.checker.segment import Segment, grown_to
    from coordinator.checker.batch import BatchRunner

    config = CoordinatorConfig(lakehouse=s3_lakehouse.root, storage=s3_server.storage_options)
    commit_log = CommitLogRef.of_group("g").key
    with CommitLogWriter(s3_lakehouse, "g") as writer:
        writer.submit([half_record("paid", body=b"order 1"), half_record("unsure")]).result()
        writer.submit([end_record("paid")]).result()
    starts = {commit_log: 1}
    ends = grown_to(s3_lakehouse, starts)
    assert ends == {commit_log: 3, CommitLogRef.operators().key: 1}  # each log found on the bucket, and how far it grew
    now_us = time.time_ns() // 1000
    records = Segment(starts, ends, now_us).records(s3_lakehouse)

    runner = BatchRunner()
    first = run_batch(config, records, batch_id=0, runner=runner)
    assert (first.halves, first.commits, first.delivered, first.checks) == (2, 1, 1, 0)
    replayed = run_batch(config, records, batch_id=0, runner=BatchRunner())  # Spark replaying it after a crash
    assert replayed.delivered == 1
    topic = s3_lakehouse.read("topics/T", ["transaction_id", "body"]).to_pylist()
    assert topic == [{"transaction_id": "paid", "body": b"order 1"}]  # once

    later = Segment(ends, ends, now_us + 7_000_000).records(s3_lakehouse)  # past the immunity time
    checked = run_batch(config, later, batch_id=1, runner=BatchRunner())  # a restarted checker's first batch
    assert (checked.checks, checked.pending) == (1, 1)
    [request] = s3_lakehouse.read(CHECK_REQUESTS, ["transaction_id", "check_times", "body"]).to_pylist()
    assert request == {"transaction_id": "unsure", "check_times": 1, "body": None}  # the checker's record: no content
    [sent] = read_table(s3_lakehouse.check_requests("g"), ["transaction_id", "check_times", "body"],
                        storage=s3_lakehouse.storage).to_pylist()
    assert sent == {"transaction_id": "unsure", "check_times": 1, "body": b"hello"}  # the group's, with the message


def test_a_checkpoint_file_is_one_put_that_the_store_refuses_over_an_existing_file(spark, s3_server, s3_lakehouse):
    """txcoord's checkpoint file manager writes a Spark checkpoint file with one conditional PUT, no checks
    before it; a second writer of the same file fails and leaves the first's; a cancelled write leaves nothing;
    a write whose reply was lost, sent again and refused by its own first attempt's file, is done."""
    from py4j.protocol import Py4JJavaError

    from coordinator.conformance.faults import FaultProxyProcess
    from coordinator.spark import object_store_conf

    jvm = spark.sparkContext._jvm
    with FaultProxyProcess(s3_server.endpoint) as proxy:
        hadoop = jvm.org.apache.hadoop.conf.Configuration(spark.sparkContext._jsc.hadoopConfiguration())
        for key, value in object_store_conf(proxy.storage_options(s3_server.storage_options)).items():
            hadoop.set(key.removeprefix("spark.hadoop."), value)
        hadoop.set("fs.s3.impl.disable.cache", "true")  # this proxy's filesystem, not one cached for the bucket
        checkpoint = f"{s3_lakehouse.root}/_checkpoints/q"
        manager = jvm.io.txcoord.spark.ConditionalPutCheckpointFileManager(jvm.org.apache.hadoop.fs.Path(checkpoint), hadoop)

        def write(name: str, content: bytes, overwrite: bool = False, cancel: bool = False) -> None:
            stream = manager.createAtomic(jvm.org.apache.hadoop.fs.Path(f"{checkpoint}/{name}"), overwrite)
            stream.write(bytearray(content))
            stream.cancel() if cancel else stream.close()

        before = proxy.counts()
        write("offsets/0", b"first")
        after = proxy.counts()
        with pytest.raises(Py4JJavaError):
            write("offsets/0", b"second")
        refused = proxy.counts()
        write("offsets/1", b"cancelled", cancel=True)
        write("commits/0", b"once")
        write("commits/0", b"again", overwrite=True)  # Spark's overwriting writes stay possible
        proxy.inject_next("drop_reply", method="PUT", path_contains="/_checkpoints/q/offsets/2")
        write("offsets/2", b"landed, its reply lost")
        retried = proxy.counts()
    assert {kind: after["by_kind"][kind] - before["by_kind"][kind] for kind in after["by_kind"]
            if after["by_kind"][kind] != before["by_kind"][kind]} == {"PUT": 1}
    assert refused["by_status"].get("412", 0) - after["by_status"].get("412", 0) == 1
    files = s3_lakehouse.files
    assert files.read("_checkpoints/q/offsets/0").data == b"first"
    assert files.read("_checkpoints/q/offsets/1") is None
    assert files.read("_checkpoints/q/commits/0").data == b"again"
    assert retried["by_status"].get("412", 0) - refused["by_status"].get("412", 0) == 1  # the retry, refused
    assert files.read("_checkpoints/q/offsets/2").data == b"landed, its reply lost"


def test_the_streaming_checker_runs_on_object_storage(spark, s3_server, s3_lakehouse):
    """The checker's streaming query, its checkpoint on the bucket through S3A, delivers a commit."""
    from coordinator.checker.query import CheckerQuery
    from coordinator.spark import object_store_conf
    from coordinator.spark.own_classes import CONDITIONAL_PUT_CHECKPOINT_MANAGER
    from coordinator.spark.session import CHECKPOINT_MANAGER_SETTING

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in object_store_conf(s3_server.storage_options).items():  # what the checker job starts with
        hadoop.set(key.removeprefix("spark.hadoop."), value)
    config = CoordinatorConfig(lakehouse=s3_lakehouse.root, storage=s3_server.storage_options, trigger_interval_ms=200)
    checker = CheckerQuery(spark, config).start()
    try:
        # Its checkpoint files written in place (one conditional PUT each), not renamed: a copy and a delete each.
        assert spark.conf.get(CHECKPOINT_MANAGER_SETTING) == CONDITIONAL_PUT_CHECKPOINT_MANAGER
        with CommitLogWriter(s3_lakehouse, "g") as writer:
            writer.submit([half_record("paid", body=b"order 1"), half_record("refused")]).result()
            writer.submit([end_record("paid"), end_record("refused", "ROLLBACK_MESSAGE")]).result()
        deadline = time.monotonic() + 120
        while not s3_lakehouse.exists("topics/T") or s3_lakehouse.read("topics/T").num_rows == 0:
            assert time.monotonic() < deadline, "nothing delivered within 120 s"
            time.sleep(0.2)
    finally:
        checker.stop()
    assert s3_lakehouse.read("topics/T", ["transaction_id", "body"]).to_pylist() == [
        {"transaction_id": "paid", "body": b"order 1"}]
    assert sorted(s3_lakehouse.read(OP, ["transaction_id", "outcome"]).to_pylist(), key=str) == [
        {"transaction_id": "paid", "outcome": "COMMIT"}, {"transaction_id": "refused", "outcome": "ROLLBACK"}]
    assert s3_lakehouse.files.read("system/_checkpoints/checker/metadata") is not None  # the checkpoint is on S3
    assert s3_lakehouse.files.list("system/_checkpoints/checker/commits")  # a batch's commit, written in place
    assert spark.conf.get(CHECKPOINT_MANAGER_SETTING, None) is None  # later queries of the session, local ones too
    assert CheckerProgress(s3_lakehouse).load().last_batch is not None


def test_the_producer_benchmark_runs_on_object_storage(s3_server, tmp_path):
    """`python -m bench.producer --object-store`, at a tiny scale: every figure comes from a bucket on its own server."""
    results = tmp_path / "producer-s3.json"
    run = subprocess.run([sys.executable, "-m", "bench.producer", "--object-store", "--seconds", "1", "--threads", "2",
                          "--processes", "--batch", "2", "--floor-appends", "5", "--results", str(results)],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(results.read_text())
    assert report["args"]["object_store"] is True
    assert [r["threads"] for r in report["runs"]] == [2, 2] and all(r["transactions"] > 0 for r in report["runs"])


@pytest.mark.usefixtures("commit_logs_compacted_eagerly")
def test_maintenance_beside_writers_on_object_storage_loses_and_duplicates_nothing(s3_lakehouse):
    """`maintain` (delta-rs: compaction, checkpoint, vacuum, log cleanup) commits with the same
    conditional PUT as the producers' appender, so the two never overwrite each other's commits."""
    from coordinator.ops.maintenance import maintain

    with SteadyProducer(s3_lakehouse) as producer:
        producer.wait_for(20)
        runs = [maintain(s3_lakehouse, tables=[CommitLogRef.of_group("g").key], retention_hours=1) for _ in range(3)]
    compacted = sum(result.files_compacted for [result] in runs)
    assert compacted >= 20, runs  # at least one compaction committed between the producer's commits
    log = read_table(s3_lakehouse.commit_log("g"), ["transaction_id"], storage=s3_lakehouse.storage)
    assert sorted(log.column(0).to_pylist()) == sorted(producer.sent)  # every send once: none lost, none doubled


@pytest.mark.slow
def test_the_demo_runs_on_object_storage_and_every_notebook_reads_it(s3_server, tmp_path, monkeypatch):
    """The whole story on the bucket: producers, ``spark-submit`` of the checker job (S3A), the credits service (a
    consumer group, killed -9 once), check-back, then the three notebooks (Spark SQL, time travel, a stream; delta-rs reads)."""
    for variable, value in s3_server.environment.items():  # how the demo, its jobs and the notebooks reach it
        monkeypatch.setenv(variable, value)
    location = f"s3://lakehouse/demo-{uuid.uuid4().hex}"
    directory = tmp_path / "demo"
    demo = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", "--lakehouse", str(directory), "--orders", str(DEMO_ORDERS),
         "--object-store", location, "--timeout", "240", "--json"],
        capture_output=True, text=True, cwd=REPO_ROOT, env=without_txcoord_settings(), timeout=420)

    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-6000:]
    outcome = json.loads(demo.stdout)
    assert outcome["invariant_holds"] and outcome["committed_by_check_back"] >= 1 and outcome["discarded"] >= 1
    lakehouse = Lakehouse(location)
    assert lakehouse.read("topics/ORDER_TOPIC").num_rows == outcome["confirmed_orders"] == outcome["credits_granted"]
    assert len(CreditStore(str(directory / "credits.db")).credits()) == outcome["credits_granted"]
    assert outcome["credits_service_killed"] == 1 and lakehouse.files.list("consumers/credits/progress/ORDER_TOPIC")
    assert sorted(path.name for path in directory.iterdir()) == [  # nothing of the lakehouse on the local disk
        "checker.log", "credits.db", "credits.log", "demo.toml", "orders.db", "producer.log"]
    for name in sorted(PLOTS):
        run_notebook(name, directory / "demo.toml", monkeypatch)

    again = subprocess.run([sys.executable, "-m", "coordinator", "demo", "--lakehouse", str(tmp_path / "again"),
                            "--object-store", location], capture_output=True, text=True, cwd=REPO_ROOT,
                           env=without_txcoord_settings(), timeout=60)
    assert again.returncode == 2 and "already holds a lakehouse" in again.stderr  # never wiped
