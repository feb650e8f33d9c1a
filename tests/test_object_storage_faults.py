"""When S3 errs, stalls or loses a reply: the product against the real loopback S3 server, through the
fault proxy (coordinator/conformance/faults.py) that answers 503/500, resets a connection, or makes the write
and drops its reply, exactly where each test asks. Nothing is committed twice, a send never reports a
false result, retries are counted, and everything keeps working once the faults stop."""

from __future__ import annotations

import logging
import uuid

import pyarrow as pa
import pytest

from coordinator import LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.config import CoordinatorConfig
from coordinator.checker.writer import TableWriter
from coordinator.control.lease import CheckerLease
from coordinator.control.progress import BatchRecord, CheckerProgress, Epoch, Progress
from coordinator.exceptions import HalfNotStoredError, HalfOutcomeUnknownError, WriteOutcomeUnknownError
from coordinator.lakehouse import Lakehouse, init_lakehouse, open_table, read_table
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.retries import storage_request_counts
from coordinator.tables import OP
from support import end_record, half_record, wait_until

from coordinator.conformance.faults import FaultProxyProcess

#: Few retries, so that a request failing every time gives up in a second or two; the time bound is never the
#: one that ends the retries, however long a loaded machine stalls them (the tests count the attempts).
QUICK_RETRIES = {"max_retries": "3", "retry_timeout": "120s"}
COMMIT_PUT = {"method": "PUT", "path_contains": "commit_log/_delta_log/0"}


class Commits(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.ROLLBACK_MESSAGE  # a half whose send failed: its local transaction never ran


@pytest.fixture
def proxy(s3_server):
    with FaultProxyProcess(s3_server.endpoint) as running:
        yield running


@pytest.fixture
def lakehouses(s3_server, proxy) -> tuple[Lakehouse, Lakehouse]:
    """A fresh lakehouse, ``(through the proxy, straight to the server)``."""
    root = f"s3://lakehouse/{uuid.uuid4().hex}"
    faulty = Lakehouse(root, proxy.storage_options(s3_server.storage_options) | QUICK_RETRIES)
    init_lakehouse(faulty)
    return faulty, Lakehouse(root, s3_server.storage_options)


def log_rows(lakehouse: Lakehouse, group: str = "g") -> list[dict]:
    return read_table(lakehouse.commit_log(group), ["transaction_id", "kind"], storage=lakehouse.storage).to_pylist()


def test_a_commit_whose_reply_was_lost_is_made_once_and_reported_made(lakehouses, proxy):
    faulty, direct = lakehouses
    recognised = storage_request_counts().own_writes_recognised.get("create", 0)
    with CommitLogWriter(faulty, "g") as writer:
        first = writer.submit([half_record("t1")]).result()
        proxy.inject_next("drop_reply", **COMMIT_PUT)
        second = writer.submit([half_record("t2")]).result()
        third = writer.submit([half_record("t3")]).result()

    assert proxy.counts()["injected"]["drop_reply"] == 1
    assert (second, third) == (first + 1, first + 2)  # the lost reply's version is the writer's, not skipped
    assert sorted(row["transaction_id"] for row in log_rows(direct)) == ["t1", "t2", "t3"]  # t2 once
    assert open_table(direct.commit_log("g"), storage=direct.storage).version() == third
    assert storage_request_counts().own_writes_recognised["create"] == recognised + 1


def test_throttling_and_resets_are_retried_and_counted(lakehouses, proxy):
    faulty, direct = lakehouses
    before = storage_request_counts().retries
    with CommitLogWriter(faulty, "g") as writer:
        for kind in ("slowdown", "error", "reset"):
            proxy.inject_next(kind, **COMMIT_PUT)
        proxy.inject_next("slowdown", method="PUT", path_contains="/part-")  # the data file
        writer.submit([half_record("t1")]).result()

    assert [row["transaction_id"] for row in log_rows(direct)] == ["t1"]
    after = storage_request_counts().retries
    for (operation, cause), times in {("create", "throttled"): 1, ("create", "server_error"): 1,
                                      ("create", "connection"): 1, ("put", "throttled"): 1}.items():
        assert after[(operation, cause)] == before.get((operation, cause), 0) + times


def test_a_send_the_storage_never_confirms_says_so_and_the_producer_goes_on(s3_server, lakehouses, proxy):
    """The commit's PUT is made, and its reply lost on every attempt: the send cannot know, and says so.
    Once the faults stop, the same producer sends again, without a restart."""
    faulty, direct = lakehouses
    config = CoordinatorConfig(lakehouse=faulty.root, storage=faulty.storage)
    with TransactionProducer("g", Commits(), config) as producer:
        for _ in range(4):  # the first attempt and max_retries = 3
            proxy.inject_next("drop_reply", **COMMIT_PUT)
        with pytest.raises(HalfOutcomeUnknownError, match="never confirmed whether") as unknown:
            producer.send_message_in_transaction(Message("ORDERS", b"first"))
        assert isinstance(unknown.value.__cause__, WriteOutcomeUnknownError)
        assert unknown.value.outcome_unknown and unknown.value.__cause__.outcome_unknown
        assert unknown.value.retriable  # and the next send below succeeds
        assert proxy.counts()["queued"] == 0
        sent = producer.send_message_in_transaction(Message("ORDERS", b"second"))

    rows = log_rows(direct)
    # The unknown one was in fact stored, once, with no END (the check-back rolls it back); the next one whole.
    assert [(r["transaction_id"], r["kind"]) for r in rows if r["transaction_id"] == unknown.value.transaction_id] == [
        (unknown.value.transaction_id, "HALF")]
    assert sorted(r["kind"] for r in rows if r["transaction_id"] == sent.transaction_id) == ["END", "HALF"]


def test_a_send_the_storage_refuses_past_the_bound_says_nothing_was_stored(s3_server, lakehouses, proxy):
    faulty, direct = lakehouses
    config = CoordinatorConfig(lakehouse=faulty.root, storage=faulty.storage)
    with TransactionProducer("g", Commits(), config) as producer:
        for _ in range(4):
            proxy.inject_next("slowdown", method="PUT", path_contains="/part-")  # the data file, never written
        with pytest.raises(HalfNotStoredError, match="could not be stored") as not_stored:
            producer.send_message_in_transaction(Message("ORDERS", b"refused"))
        assert not_stored.value.retriable and not not_stored.value.outcome_unknown  # the storage failed a while
        sent = producer.send_message_in_transaction(Message("ORDERS", b"after"))

    assert {r["transaction_id"] for r in log_rows(direct)} == {sent.transaction_id}


def test_the_lease_and_the_progress_record_stay_their_writers_when_replies_are_lost(lakehouses, proxy):
    faulty, direct = lakehouses
    lease = CheckerLease(faulty, ttl_s=30)
    lease.acquire(wait=False)
    proxy.inject_next("drop_reply", method="PUT", path_contains="_checker_lease")
    lease.renew()  # no LeaseLostError: the renewal was made, its reply lost
    assert direct.files.read("system/_checker_lease.json").data == faulty.files.read("system/_checker_lease.json").data

    progress = CheckerProgress(faulty)
    epoch = Epoch(number=0, first_batch_id=0, starting_versions={})
    progress.save(Progress(epoch))
    proxy.inject_next("drop_reply", method="PUT", path_contains="_checker_progress")
    progress.save(Progress(epoch, BatchRecord(batch_id=0, stream_batch_id=0, starts={}, ends={"g": 1}, now_us=1,
                                              pending_from=0)))
    progress.save(Progress(epoch, BatchRecord(batch_id=1, stream_batch_id=1, starts={"g": 1}, ends={"g": 2}, now_us=2,
                                              pending_from=0)))
    assert CheckerProgress(direct).load().last_batch.batch_id == 1
    lease.release()


def test_the_checker_outlives_an_outage_past_its_retry_bound_and_delivers_once(spark, s3_server, proxy, caplog):
    """Every PUT of the op table refused, past max_retries, for three runs of one batch: the batch runs
    again every few seconds, whole, until the storage answers; the query is never restarted, and the
    transaction is delivered once."""
    from coordinator.checker.query import CheckerQuery
    from coordinator.spark import object_store_conf

    direct = Lakehouse(f"s3://lakehouse/{uuid.uuid4().hex}", s3_server.storage_options)
    init_lakehouse(direct)
    # Two attempts per run, however long a loaded machine stalls one: the time bound is never what ends a run.
    storage = proxy.storage_options(s3_server.storage_options) | {"max_retries": "1", "retry_timeout": "120s"}
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in object_store_conf(s3_server.storage_options).items():  # the checkpoint straight to the server
        hadoop.set(key.removeprefix("spark.hadoop."), value)
    checker = CheckerQuery(spark, CoordinatorConfig(lakehouse=direct.root, storage=storage, trigger_interval_ms=200))
    checker.start()
    try:
        for _ in range(6):  # three runs of the batch, two attempts each
            proxy.inject_next("slowdown", method="PUT", path_contains="system/op/")
        with caplog.at_level(logging.ERROR, logger="coordinator.checker"), CommitLogWriter(direct, "g") as writer:
            writer.submit([half_record("paid", body=b"order 1")]).result()
            writer.submit([end_record("paid")]).result()
            # The op row is the batch's last write to land: its topic row lands before it, on the first run.
            wait_until(lambda: direct.read(OP, ["transaction_id"]).num_rows >= 1, 120)
        assert proxy.counts()["queued"] == 0 and checker.query.isActive
    finally:
        checker.stop()
    assert direct.read("topics/T", ["transaction_id"]).column(0).to_pylist() == ["paid"]
    assert direct.read(OP, ["transaction_id"]).column(0).to_pylist() == ["paid"]
    outages = [r.getMessage() for r in caplog.records if "the storage is unavailable" in r.getMessage()]
    assert len(outages) == 3 and "running it again" in outages[0]


def test_a_commit_log_created_through_a_reset_connection_is_created(lakehouses, proxy):
    """A new group's first send creates its commit log; a reset connection there is tried again (the
    chaos run's forged group once failed on one)."""
    faulty, direct = lakehouses
    before = storage_request_counts().retries.get(("create table", "connection"), 0)
    proxy.inject_next("reset", method="PUT", path_contains="groups/g/commit_log/_delta_log/00000000000000000000.json")
    with CommitLogWriter(faulty, "g") as writer:
        version = writer.submit([half_record("t1")]).result()

    assert proxy.counts()["injected"]["reset"] == 1
    assert version == 1  # version 0 is the creation
    assert [row["transaction_id"] for row in log_rows(direct)] == ["t1"]
    assert storage_request_counts().retries[("create table", "connection")] == before + 1


@pytest.mark.parametrize("fault", ["reset", "drop_reply"])
def test_a_topic_created_by_its_first_delivery_through_a_fault_holds_it_once(lakehouses, proxy, fault):
    """A topic's table is created by the checker's first write to it; a reset there is tried again, and a
    creation whose reply was lost is not written twice (the chaos run's checker once exited on the reset)."""
    faulty, direct = lakehouses
    topic = faulty.key_path("topics/T")
    rows = pa.table({"msg_id": ["m1", "m2"]})
    proxy.inject_next(fault, method="PUT", path_contains="topics/T/_delta_log/00000000000000000000.json")
    writer = TableWriter("txcoord-checker", faulty.storage)
    try:
        first = writer.append(topic, rows, batch_id=7)
        replay = writer.append(topic, rows, batch_id=7)
    finally:
        writer.close()

    assert proxy.counts()["injected"][fault] == 1
    assert first in (0, None) and replay is None  # None: the lost reply's creation was this batch's write
    table = open_table(direct.key_path("topics/T"), storage=direct.storage)
    assert sorted(table.to_pyarrow_table()["msg_id"].to_pylist()) == ["m1", "m2"]
    assert table.transaction_version("txcoord-checker") == 7  # (delta-rs may repeat the creation's metadata at v1)
