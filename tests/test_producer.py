"""The producer against a real delta-rs lakehouse: ordering, atomicity, failures, group commit."""

import logging
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timezone

import pytest
from support import wait_until
from support.producer_side import RecordingListener, append_check_request, commit_log_rows, commit_log_version

from coordinator import (CoordinatorConfig, LocalTransactionState, Message, SendStatus, TransactionListener,
                         TransactionProducer)
from coordinator.control.instances import ProducerInstances
from coordinator.exceptions import (AccessDeniedError, CoordinatorError, HalfNotStoredError, HalfOutcomeUnknownError,
                                    IncompleteListenerError, MessageValidationError, ProducerStateError,
                                    StorageUnavailableError, WriteOutcomeUnknownError)
from coordinator.lakehouse import Lakehouse


@pytest.fixture
def lakehouse(tmp_path):
    return str(tmp_path / "lakehouse")


def producer_for(lakehouse, listener, group="order_group"):
    return TransactionProducer(group, listener, CoordinatorConfig(lakehouse=lakehouse))


def rows_of(lakehouse, transaction_id, kind):
    return [row for row in commit_log_rows(lakehouse) if row["transaction_id"] == transaction_id and row["kind"] == kind]


def test_half_is_durable_before_the_local_transaction_runs(lakehouse):
    seen_in_execute = {}

    class Listener(RecordingListener):
        def execute_local_transaction(self, msg, arg):
            rows = commit_log_rows(lakehouse)
            seen_in_execute["halves"] = [r for r in rows if r["kind"] == "HALF" and r["msg_id"] == msg.msg_id]
            seen_in_execute["ends"] = [r for r in rows if r["kind"] == "END"]
            return super().execute_local_transaction(msg, arg)

    with producer_for(lakehouse, Listener()) as producer:
        msg = Message("ORDER_TOPIC", b'{"order": 42}', keys="order-42", tags="created",
                      properties={"region": "eu", "DELAY": "3"})
        result = producer.send_message_in_transaction(msg, "the order")

    assert [h["transaction_id"] for h in seen_in_execute["halves"]] == [result.transaction_id]
    assert seen_in_execute["ends"] == []
    assert result.send_status is SendStatus.SEND_OK
    assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
    assert (msg.transaction_id, msg.msg_id) == (result.transaction_id, result.msg_id)
    assert result.msg_ids == (result.msg_id,)

    [half] = rows_of(lakehouse, result.transaction_id, "HALF")
    assert half["producer_group"] == "order_group"
    assert (half["msg_id"], half["message_index"], half["message_count"]) == (result.msg_id, 0, 1)
    assert (half["topic"], half["keys"], half["tags"], half["body"]) == ("ORDER_TOPIC", "order-42", "created", b'{"order": 42}')
    assert dict(half["properties"]) == {"region": "eu"}
    assert half["born_timestamp"].utcoffset() == timezone.utc.utcoffset(None)
    assert (half["state"], half["check_id"]) == (None, None)
    assert len(half["record_id"]) == 32

    [end] = rows_of(lakehouse, result.transaction_id, "END")
    assert (end["state"], end["check_id"], end["producer_group"]) == ("COMMIT_MESSAGE", None, "order_group")
    assert (end["msg_id"], end["topic"], end["body"], end["properties"]) == (None, None, None, None)
    assert end["record_id"] != half["record_id"]


def test_listener_receives_the_message_and_arg(lakehouse):
    listener = RecordingListener(execute_answer=LocalTransactionState.ROLLBACK_MESSAGE)
    with producer_for(lakehouse, listener) as producer:
        msg = Message("ORDER_TOPIC", b"x")
        result = producer.send_message_in_transaction(msg, {"order": 42})
    assert listener.executed == [(msg, {"order": 42})]
    assert result.local_transaction_state is LocalTransactionState.ROLLBACK_MESSAGE
    assert rows_of(lakehouse, result.transaction_id, "END")[0]["state"] == "ROLLBACK_MESSAGE"


def test_half_write_failure_raises_and_skips_the_local_transaction(lakehouse):
    listener = RecordingListener()
    with producer_for(lakehouse, listener) as producer:
        path = Lakehouse(lakehouse).commit_log("order_group")
        shutil.rmtree(path)
        with open(path, "w") as blocker:  # a file where the table's directory should be
            blocker.write("not a table")
        with pytest.raises(HalfNotStoredError) as raised:
            producer.send_message_in_transaction(Message("ORDER_TOPIC", b"x"))
    assert raised.value.__cause__ is not None
    assert "local transaction was not run" in str(raised.value)
    assert (raised.value.retriable, raised.value.outcome_unknown) == (False, False)  # a file is no table, again
    assert listener.executed == []


@pytest.mark.parametrize("failure, raised, retriable, outcome_unknown", [
    (StorageUnavailableError("503 Service Unavailable on every attempt"), HalfNotStoredError, True, False),
    (AccessDeniedError("403 Forbidden"), HalfNotStoredError, False, False),
    (WriteOutcomeUnknownError("the commit's reply lost on every attempt"), HalfOutcomeUnknownError, True, True),
])
def test_a_failed_half_says_whether_to_send_again_and_whether_it_may_be_stored(lakehouse, failure, raised, retriable,
                                                                              outcome_unknown):
    """The storage's own failures are provoked in tests/test_object_storage_faults.py; here, each cause's answer."""
    listener = RecordingListener()
    with producer_for(lakehouse, listener) as producer:
        writer_submit = producer._writer.submit

        def failing_submit(records):
            if records[0]["kind"] != "HALF":
                return writer_submit(records)
            failed = Future()
            failed.set_exception(failure)
            return failed

        producer._writer.submit = failing_submit
        with pytest.raises(raised) as error:
            producer.send_message_in_transaction(Message("ORDER_TOPIC", b"x"))
    assert (error.value.retriable, error.value.outcome_unknown) == (retriable, outcome_unknown)
    assert error.value.__cause__ is failure
    assert listener.executed == []


@pytest.mark.parametrize("answer", [RuntimeError("database down"), None, "garbage"])
def test_exception_or_no_answer_from_the_listener_counts_as_unknow(lakehouse, answer, caplog):
    with caplog.at_level(logging.INFO, logger="coordinator.producer.transaction_producer"):
        with producer_for(lakehouse, RecordingListener(execute_answer=answer)) as producer:
            result = producer.send_message_in_transaction(Message("ORDER_TOPIC", b"x"))
    assert result.local_transaction_state is LocalTransactionState.UNKNOW
    assert rows_of(lakehouse, result.transaction_id, "END")[0]["state"] == "UNKNOW"
    about_it = [r for r in caplog.records if getattr(r, "transaction_id", None) == result.transaction_id]
    assert any(r.levelno >= logging.WARNING for r in about_it)
    assert all(result.transaction_id in r.getMessage() for r in about_it)
    if isinstance(answer, Exception):
        assert any(r.exc_info and r.exc_info[1] is answer for r in about_it)


@pytest.mark.parametrize(
    "messages",
    [
        [Message("../x", b"x")],
        [Message("ORDER_TOPIC", b"")],
        [Message("ORDER_TOPIC", b"x"), Message("a/b", b"x")],
        [Message("ORDER_TOPIC", b"x", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "-1"})],
        [],
        ["not a message"],
    ],
)
def test_a_bad_message_writes_nothing(lakehouse, messages):
    listener = RecordingListener()
    with producer_for(lakehouse, listener) as producer:
        with pytest.raises(MessageValidationError):
            producer.send_messages_in_transaction(messages)
        if len(messages) == 1 and isinstance(messages[0], Message):
            with pytest.raises(MessageValidationError):
                producer.send_message_in_transaction(messages[0])
    assert commit_log_version(lakehouse) == 0
    assert listener.executed == []


def test_a_message_for_a_topic_the_group_is_not_granted_writes_nothing_and_runs_no_local_transaction(lakehouse):
    listener = RecordingListener()
    config = CoordinatorConfig(lakehouse=lakehouse, topic_grants={"order_group": ["ORDER_*"]})
    with TransactionProducer("order_group", listener, config) as producer:
        with pytest.raises(MessageValidationError, match="may not publish to topic 'PAYMENTS'.*not run"):
            producer.send_messages_in_transaction([Message("ORDER_EU", b"x"), Message("PAYMENTS", b"x")])
        assert commit_log_version(lakehouse) == 0 and listener.executed == []
        assert producer.send_message_in_transaction(Message("ORDER_EU", b"x")).send_status.value == "SEND_OK"


def test_the_same_message_object_twice_is_refused(lakehouse):
    msg = Message("ORDER_TOPIC", b"x")
    with producer_for(lakehouse, RecordingListener()) as producer:
        with pytest.raises(MessageValidationError):
            producer.send_messages_in_transaction([msg, msg])
    assert commit_log_version(lakehouse) == 0


@pytest.mark.parametrize("group", ["", "   ", None, 42])
def test_a_bad_group_is_refused(lakehouse, group):
    with pytest.raises(MessageValidationError):
        producer_for(lakehouse, RecordingListener(), group=group)


def test_several_messages_share_one_transaction_and_one_commit(lakehouse):
    listener = RecordingListener()
    msgs = [Message("ORDER_TOPIC", b"order"), Message("AUDIT_TOPIC", b"audit"), Message("ORDER_TOPIC", b"line")]
    with producer_for(lakehouse, listener) as producer:
        result = producer.send_messages_in_transaction(msgs, "arg")

    assert listener.executed == [(msgs, "arg")]
    assert result.msg_ids == tuple(m.msg_id for m in msgs) and result.msg_id == msgs[0].msg_id
    assert len(set(result.msg_ids)) == 3
    assert {m.transaction_id for m in msgs} == {result.transaction_id}
    halves = sorted(rows_of(lakehouse, result.transaction_id, "HALF"), key=lambda r: r["message_index"])
    assert [(h["message_index"], h["message_count"], h["msg_id"], h["topic"], h["body"]) for h in halves] == [
        (0, 3, msgs[0].msg_id, "ORDER_TOPIC", b"order"),
        (1, 3, msgs[1].msg_id, "AUDIT_TOPIC", b"audit"),
        (2, 3, msgs[2].msg_id, "ORDER_TOPIC", b"line"),
    ]
    assert len({h["_commit_version"] for h in halves}) == 1
    [end] = rows_of(lakehouse, result.transaction_id, "END")
    assert end["_commit_version"] > halves[0]["_commit_version"]


def test_concurrent_sends_are_group_committed(lakehouse):
    threads, sends_per_thread = 64, 20
    results, errors = [], []
    with producer_for(lakehouse, RecordingListener()) as producer:
        def send_many(thread_index):
            try:
                for i in range(sends_per_thread):
                    msg = Message("ORDER_TOPIC", f"{thread_index}-{i}".encode())
                    results.append(producer.send_message_in_transaction(msg))
            except Exception as error:  # surfaced by the assertion below
                errors.append(error)

        workers = [threading.Thread(target=send_many, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    sends = threads * sends_per_thread
    assert errors == [] and len(results) == sends
    rows = commit_log_rows(lakehouse)
    halves = [r for r in rows if r["kind"] == "HALF"]
    ends = [r for r in rows if r["kind"] == "END"]
    assert sorted(r["transaction_id"] for r in halves) == sorted(r.transaction_id for r in results)
    assert sorted(r["transaction_id"] for r in ends) == sorted(r.transaction_id for r in results)
    assert sorted(r["body"] for r in halves) == sorted(f"{t}-{i}".encode() for t in range(threads) for i in range(sends_per_thread))
    assert commit_log_version(lakehouse) < sends / 2


def test_context_manager_and_lifecycle(lakehouse):
    producer = producer_for(lakehouse, RecordingListener())
    with pytest.raises(ProducerStateError):
        producer.send_message_in_transaction(Message("ORDER_TOPIC", b"x"))
    producer.shutdown()  # never started: nothing to do
    with producer as entered:
        assert entered is producer
        assert producer.start() is producer  # idempotent
        result = producer.send_message_in_transaction(Message("ORDER_TOPIC", b"x"))
    producer.shutdown()  # idempotent
    with pytest.raises(ProducerStateError):
        producer.send_message_in_transaction(Message("ORDER_TOPIC", b"x"))
    with pytest.raises(ProducerStateError):
        producer.start()
    assert len(rows_of(lakehouse, result.transaction_id, "END")) == 1


def started_since(before: set[threading.Thread]) -> list[str]:
    """The threads alive now that were not in ``before``, by name."""
    return sorted(thread.name for thread in threading.enumerate() if thread not in before)


def send_and_answer_a_check(lakehouse: str, producer: TransactionProducer) -> None:
    """Sends from 8 threads and a check-back answered, so that every kind of thread the producer has runs."""
    with ThreadPoolExecutor(8) as senders:
        list(senders.map(lambda i: producer.send_message_in_transaction(Message("ORDER_TOPIC", b"%d" % i)), range(40)))
    request = append_check_request(lakehouse)
    wait_until(lambda: [r for r in commit_log_rows(lakehouse) if r["check_id"] == request["check_id"]])


def test_shutdown_ends_every_thread_the_producer_started(lakehouse):
    before = set(threading.enumerate())
    with producer_for(lakehouse, RecordingListener()) as producer:
        send_and_answer_a_check(lakehouse, producer)
        running = started_since(before)
    assert {"commit-log-writer", "commit-log-committer", "delta-chores", "checkback-follower-order_group",
            "checkback-heartbeat-order_group"} <= set(running)
    assert any(name.startswith("checkback-order_group_") for name in running)  # the check's pool
    assert started_since(before) == []


def test_a_step_of_shutdown_that_fails_leaves_no_thread_running_and_no_record_unwritten(lakehouse, monkeypatch):
    def refused(*args):
        raise PermissionError("the storage refuses the withdrawal")

    def claims():
        return [key for key in Lakehouse(lakehouse).files.list("groups/order_group/_producers") if key.endswith(".claim")]

    monkeypatch.setattr(ProducerInstances, "withdraw", refused)
    before = set(threading.enumerate())
    producer = producer_for(lakehouse, RecordingListener()).start()
    send_and_answer_a_check(lakehouse, producer)
    result = producer.send_message_in_transaction(Message("ORDER_TOPIC", b"last"))  # its END is sent one-way
    assert len(claims()) == 1
    with pytest.raises(PermissionError, match="refuses the withdrawal"):
        producer.shutdown()
    assert started_since(before) == []
    assert len(rows_of(lakehouse, result.transaction_id, "END")) == 1
    assert claims() == []  # its commit log released for the group's next instance


def test_start_creates_the_lakehouse(lakehouse):
    with producer_for(lakehouse, RecordingListener()):
        assert commit_log_version(lakehouse) == 0


@pytest.mark.parametrize("implemented", [("execute_local_transaction",), ("check_local_transaction",), ()])
def test_a_listener_missing_a_method_fails_when_created(implemented):
    methods = {name: (lambda self, *args: LocalTransactionState.COMMIT_MESSAGE) for name in implemented}
    Incomplete = type("Incomplete", (TransactionListener,), methods)
    missing = {"execute_local_transaction", "check_local_transaction"} - set(implemented)
    with pytest.raises(IncompleteListenerError, match="Incomplete must implement") as raised:
        Incomplete()
    assert all(name in str(raised.value) for name in missing)
    assert isinstance(raised.value, CoordinatorError) and isinstance(raised.value, TypeError)


def test_a_complete_listener_is_created_with_its_own_arguments():
    class Complete(RecordingListener):
        def __init__(self, answer):
            super().__init__()
            self.answer = answer

    assert Complete("yes").answer == "yes"
