"""The check-back worker: follows check_requests, asks the listener, appends the answer."""

import logging
import threading
from datetime import datetime, timedelta, timezone

import pytest

from coordinator import CoordinatorConfig, LocalTransactionState, TransactionProducer
from coordinator.lakehouse import Lakehouse, init_lakehouse
from coordinator.producer.checkback import CheckBackWorker
from coordinator.producer.commit_log import CommitLogWriter
from support import wait_until
from support.producer_side import (RecordingListener, append_check_request, append_check_requests, check_request,
                                         commit_log_rows)


@pytest.fixture
def lakehouse(tmp_path):
    return str(tmp_path / "lakehouse")


def answers(lakehouse, check_id, storage=None):
    return [r for r in commit_log_rows(lakehouse, storage=storage) if r["kind"] == "END" and r["check_id"] == check_id]


def checkback_threads(started_after: set[threading.Thread]) -> list[str]:
    """The check-back worker threads alive now that were not alive in ``started_after``."""
    return [t.name for t in set(threading.enumerate()) - started_after if t.name.startswith("checkback-")]


def producer_for(lakehouse, listener):
    return TransactionProducer("order_group", listener, CoordinatorConfig(lakehouse=lakehouse))


def test_a_check_request_is_answered_with_an_end_record(lakehouse):
    listener = RecordingListener(check_answer=LocalTransactionState.ROLLBACK_MESSAGE)
    before = set(threading.enumerate())
    with producer_for(lakehouse, listener):
        request = append_check_request(lakehouse)
        [end] = wait_until(lambda: answers(lakehouse, request["check_id"]))
    assert checkback_threads(before) == []  # shutdown stopped the worker: nothing is left to ask the listener

    [msg] = listener.checked
    assert (msg.topic, msg.body, msg.keys, msg.tags) == ("ORDER_TOPIC", b'{"order": 42}', "order-42", "created")
    assert msg.properties == request["properties"]
    assert (msg.transaction_id, msg.msg_id) == (request["transaction_id"], request["msg_id"])
    assert (end["transaction_id"], end["producer_group"], end["state"]) == (request["transaction_id"], "order_group", "ROLLBACK_MESSAGE")
    assert (end["msg_id"], end["topic"], end["body"]) == (None, None, None)
    assert listener.executed == []


def test_other_groups_are_ignored_and_each_request_is_answered_once(lakehouse):
    listener = RecordingListener()
    with producer_for(lakehouse, listener):
        others = append_check_request(lakehouse, producer_group="payment_group")
        ours = append_check_request(lakehouse)
        append_check_request(lakehouse, **{k: ours[k] for k in ("check_id", "transaction_id", "msg_id")})  # a replayed write
        wait_until(lambda: answers(lakehouse, ours["check_id"]))
        next_round = append_check_request(lakehouse, transaction_id=ours["transaction_id"], check_times=2)
        wait_until(lambda: answers(lakehouse, next_round["check_id"]))

    assert [m.transaction_id for m in listener.checked] == [ours["transaction_id"]] * 2
    assert len(answers(lakehouse, ours["check_id"])) == 1
    assert answers(lakehouse, others["check_id"]) == []


@pytest.mark.parametrize("answer", [RuntimeError("database down"), None, "garbage"])
def test_a_failing_or_silent_check_answers_unknow(lakehouse, answer, caplog):
    with caplog.at_level(logging.WARNING, logger="coordinator.producer.checkback"):
        with producer_for(lakehouse, RecordingListener(check_answer=answer)):
            request = append_check_request(lakehouse)
            [end] = wait_until(lambda: answers(lakehouse, request["check_id"]))
    assert end["state"] == "UNKNOW"
    assert any(getattr(r, "transaction_id", None) == request["transaction_id"] and request["transaction_id"] in r.getMessage()
               for r in caplog.records)


def test_a_restarted_producer_answers_recent_requests_only(lakehouse):
    init_lakehouse(lakehouse)
    now = datetime.now(timezone.utc)
    recent = append_check_request(lakehouse, requested_at=now - timedelta(seconds=30))
    stale = append_check_request(lakehouse, requested_at=now - timedelta(minutes=5))
    listener = RecordingListener()
    with producer_for(lakehouse, listener):  # transaction_check_interval_ms: the default 60 s
        wait_until(lambda: answers(lakehouse, recent["check_id"]))
        fresh = append_check_request(lakehouse)  # a later poll: the stale request is long passed over
        wait_until(lambda: answers(lakehouse, fresh["check_id"]))
    assert sorted(m.transaction_id for m in listener.checked) == sorted([recent["transaction_id"], fresh["transaction_id"]])
    assert answers(lakehouse, stale["check_id"]) == []


def test_the_worker_waits_for_a_missing_table_and_stops_cleanly(tmp_path, monkeypatch):
    from coordinator.storage import LocalFileStore

    followed, answered_into = str(tmp_path / "not_yet"), str(tmp_path / "answers")
    looked_for = []
    exists = LocalFileStore.exists
    monkeypatch.setattr(LocalFileStore, "exists", lambda files, key: looked_for.append(key) or exists(files, key))
    listener = RecordingListener()
    before = set(threading.enumerate())
    with CommitLogWriter(answered_into, "order_group") as writer:
        worker = CheckBackWorker(followed, "order_group", listener, writer, CoordinatorConfig(lakehouse=followed),
                                 poll_interval_s=0.05, max_workers=2)
        worker.start()
        worker.start()
        first_commit = "groups/order_group/check_requests/_delta_log/00000000000000000000.json"
        wait_until(lambda: looked_for.count(first_commit) >= 3)  # polls of a table that does not exist: a probe each
        init_lakehouse(followed)
        first = append_check_request(followed)
        wait_until(lambda: answers(answered_into, first["check_id"]))
        worker.stop()
        worker.stop()
        assert checkback_threads(before) == []
    assert len(listener.checked) == 1
    assert len([r for r in commit_log_rows(answered_into) if r["kind"] == "END"]) == 1


def test_a_table_that_appears_while_the_worker_waits_is_answered_whole(lakehouse, monkeypatch):
    """The checker creates a new group's table with its first round of requests, stamped with its batch clock, which
    may be older than a check interval by then: none of them is passed over (the round would be lost)."""
    from coordinator.storage import LocalFileStore

    looked_for = []
    exists = LocalFileStore.exists
    monkeypatch.setattr(LocalFileStore, "exists", lambda files, key: looked_for.append(key) or exists(files, key))
    listener = RecordingListener()
    config = CoordinatorConfig(lakehouse=lakehouse, transaction_check_interval_ms=2000)
    with TransactionProducer("order_group", listener, config):
        first_commit = "groups/order_group/check_requests/_delta_log/00000000000000000000.json"
        wait_until(lambda: looked_for.count(first_commit) >= 1)  # it found no table
        first_round = append_check_request(lakehouse, requested_at=datetime.now(timezone.utc) - timedelta(minutes=5))
        wait_until(lambda: answers(lakehouse, first_round["check_id"]))
    assert [m.transaction_id for m in listener.checked] == [first_round["transaction_id"]]


def test_a_worker_whose_unread_log_was_cleaned_up_starts_again_from_recent_requests(lakehouse):
    import glob
    import os

    from deltalake import DeltaTable

    listener = RecordingListener()
    with producer_for(lakehouse, listener) as producer:
        first = append_check_request(lakehouse)
        wait_until(lambda: answers(lakehouse, first["check_id"]))
        worker = producer._checkback
        worker._stopping.set()  # the worker stalls: log cleanup overtakes it
        worker._thread.join()
        missed = append_check_request(lakehouse)
        append_check_request(lakehouse, producer_instance="another-instance")  # a later version, not ours to answer
        path = Lakehouse(lakehouse).check_requests("order_group")
        DeltaTable(path).create_checkpoint()
        checkpoint = DeltaTable(path).version()
        for commit in glob.glob(os.path.join(path, "_delta_log", "*.json")):
            if int(os.path.basename(commit).split(".")[0]) < checkpoint:
                os.remove(commit)
        worker._stopping.clear()
        worker._thread = None
        worker.start()  # the stalled worker resumes
        [end] = wait_until(lambda: answers(lakehouse, missed["check_id"]))

    assert end["transaction_id"] == missed["transaction_id"]
    assert [m.transaction_id for m in listener.checked] == [first["transaction_id"], missed["transaction_id"]]


def test_on_object_storage_the_worker_reads_its_requests_through_no_filesystem_written_in_python(s3_lakehouse,
                                                                                                monkeypatch):
    """A pyarrow scan through a filesystem written in Python (delta-rs's default handler on object storage) leaves
    pyarrow's threads releasing Python's buffers after it returned: a process exiting then aborts (exit 134)."""
    import pyarrow.fs

    def refused(handler):
        raise AssertionError(f"a pyarrow filesystem written in Python: {handler!r}")

    monkeypatch.setattr(pyarrow.fs, "PyFileSystem", refused)
    root, storage = s3_lakehouse.root, s3_lakehouse.storage
    first = check_request()
    append_check_requests(root, [first], storage)  # read when the worker first finds the table
    listener = RecordingListener()
    with TransactionProducer("order_group", listener, CoordinatorConfig(lakehouse=root, storage=storage)):
        wait_until(lambda: answers(root, first["check_id"], storage))
        later = check_request()
        append_check_requests(root, [later], storage)  # read from the table's change feed
        wait_until(lambda: answers(root, later["check_id"], storage))
    assert [m.transaction_id for m in listener.checked] == [first["transaction_id"], later["transaction_id"]]


@pytest.mark.slow
def test_the_producer_stays_live_while_the_storage_stalls_its_reads_of_check_requests(s3_lakehouse, s3_server):
    """A read of the check-back follower's held 20 s by the fault proxy (past the liveness window of three
    heartbeats of 1 s, many times): the heartbeat, on its own thread, goes on renewing the record, and the
    instance stays live by the checker's own rule all along (as the Java client's: tests/test_java_client_storage)."""
    import time

    from coordinator.conformance.faults import FaultProxyProcess
    from coordinator.control.instances import ProducerInstances

    stall_s = 20.0
    instances = ProducerInstances(s3_lakehouse)  # straight to the server: the test's reads are not held
    with FaultProxyProcess(s3_server.endpoint, delay_s=stall_s) as proxy:  # beside delta-rs: a process of its own
        config = CoordinatorConfig(lakehouse=s3_lakehouse.root,
                                   storage=proxy.storage_options(s3_server.storage_options),
                                   producer_heartbeat_ms=1000)
        with TransactionProducer("stall_group", RecordingListener(), config) as producer:
            proxy.inject_next("delay", path_contains="stall_group/check_requests")
            wait_until(lambda: proxy.counts()["injected"]["delay"] >= 1, 60, "a read of the producer's held")
            stalled_at, renewals = time.monotonic(), set()
            # Half the stall: the read held at its start is still held at the end of this loop.
            while time.monotonic() - stalled_at < stall_s / 2:
                live = {each.instance_id: each for each in instances.live("stall_group")}
                assert producer.instance_id in live, f"looked dead {time.monotonic() - stalled_at:.1f} s into the stall"
                renewals.add(live[producer.instance_id].last_seen)
                threading.Event().wait(0.5)
            assert len(renewals) >= 3, renewals
    assert instances.live("stall_group") == []  # withdrawn at shutdown, not renewed after
