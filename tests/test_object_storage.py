"""The lakehouse on S3-compatible object storage, against a real server on loopback (versitygw,
``scripts/s3_server.py``): conditional writes, the checker's lease and progress record, and the
producer's commit log, with the same guarantees as on a local disk."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from coordinator import LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease
from coordinator.control.progress import BatchRecord, CheckerProgress, Epoch, Progress
from coordinator.exceptions import CheckerAlreadyRunningError, LeaseLostError
from coordinator.lakehouse import Lakehouse, open_table, read_table
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.storage import FileStore
from coordinator.tables import COMMIT_LOG
from tests.conftest import Clock, half_record


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
    epoch = Epoch(number=0, first_batch_id=0, starting_version=0, checkpoint_id="q")
    assert stale.load() is None
    stale.save(Progress(epoch, BatchRecord(0, 0, 0, 0, 1, 0)))
    successor.load()  # took the lease over, read the record
    successor.save(Progress(epoch, BatchRecord(1, 1, 1, 1, 2, 0)))
    with pytest.raises(LeaseLostError, match="changed by another checker"):
        stale.save(Progress(epoch, BatchRecord(1, 1, 1, 3, 4, 0)))
    assert CheckerProgress(s3_lakehouse).load().last_batch.batch_id == 1


def test_producers_commit_to_the_commit_log_on_object_storage(s3_server, s3_lakehouse):
    """Two writers at once: every commit lands, none is lost, each is its own version."""
    with CommitLogWriter(s3_lakehouse) as first, CommitLogWriter(s3_lakehouse) as second:
        futures = [(first if i % 2 else second).submit([half_record(f"t{i}")]) for i in range(20)]
        versions = [future.result() for future in futures]
    log = read_table(s3_lakehouse.path(COMMIT_LOG), ["transaction_id"], storage=s3_lakehouse.storage)
    assert sorted(log.column(0).to_pylist()) == sorted(f"t{i}" for i in range(20))
    committed = sorted(set(versions))  # submits of one group commit share its version
    assert committed == list(range(1, len(committed) + 1))  # each its own version, none lost
    assert open_table(s3_lakehouse.path(COMMIT_LOG), storage=s3_lakehouse.storage).version() == committed[-1]

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
    records = read_table(s3_lakehouse.path(COMMIT_LOG), ["kind", "transaction_id", "body"],
                         storage=s3_lakehouse.storage).to_pylist()
    assert {(r["kind"], r["body"]) for r in records if r["transaction_id"] == result.transaction_id} == {
        ("HALF", b"on S3"), ("END", None)}
    assert Lakehouse(s3_lakehouse.root, s3_server.storage_options).files.list("system/_producers/g") == []  # withdrawn
