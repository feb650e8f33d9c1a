"""Helpers for the producer-side tests: read the lakehouse with delta-rs, record listener calls.

Also holds the entry points of the multi-process tests: ``spawn`` children import it by name, and
``python -m support.producer_side`` runs a producer process whose exit status is tested
(:func:`send_and_answer_checks`).
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Mapping, Optional, Sequence

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from coordinator import CoordinatorConfig, LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.commit_logs import CommitLogs
from coordinator.lakehouse import Lakehouse, create_table
from coordinator.producer.commit_log import CommitLogWriter, half_records
from coordinator.tables import GROUP_CHECK_REQUESTS
from support.waiting import wait_until


def commit_log_rows(lakehouse: str, group: str = "order_group",
                    storage: Optional[Mapping[str, str]] = None) -> list[dict]:
    """Every row of ``group``'s commit logs, each with the ``_commit_version`` it was written in and the
    ``commit_log`` (its key) it was written to; ``storage``: the object store's settings, if on one."""
    rows = []
    for ref in CommitLogs(Lakehouse(lakehouse, storage)).discover():
        if ref.group == group:
            table = DeltaTable(Lakehouse(lakehouse).key_path(ref.key),
                               storage_options=dict(storage) if storage else None)
            changes = pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=0)).read_all()
            rows += [{**row, "commit_log": ref.key} for row in changes.to_pylist()]
    return rows


def commit_log_version(lakehouse: str, log: str = "groups/order_group/commit_log") -> int:
    """The latest version of the commit log ``log`` (a key under the lakehouse)."""
    return DeltaTable(Lakehouse(lakehouse).key_path(log)).version()


def append_check_request(lakehouse: str, **overrides) -> dict:
    """Append one check request to its group's table, the way the checker writes it; return the row."""
    row = check_request(**overrides)
    append_check_requests(lakehouse, [row])
    return row


def append_check_requests(lakehouse: str, rows: Sequence[dict], storage: Optional[Mapping[str, str]] = None) -> None:
    """Append ``rows`` (:func:`check_request`) to the first one's group's table in one commit, as a round of the
    checker's does."""
    path = Lakehouse(lakehouse).check_requests(rows[0]["producer_group"])
    options = dict(storage) if storage else None
    create_table(GROUP_CHECK_REQUESTS, path, storage)
    write_deltalake(path, pa.Table.from_pylist(list(rows), schema=GROUP_CHECK_REQUESTS.arrow_schema()), mode="append",
                    storage_options=options)


def check_request(**overrides) -> dict:
    """A check request as the checker writes it (of a made-up transaction of ``order_group``), with ``overrides``."""
    now = datetime.now(timezone.utc)
    return {
        "check_id": uuid.uuid4().hex,
        "transaction_id": uuid.uuid4().hex,
        "producer_group": "order_group",
        "check_times": 1,
        "requested_at": now,
        "half_offset": 7,
        "msg_id": uuid.uuid4().hex,
        "topic": "ORDER_TOPIC",
        "keys": "order-42",
        "tags": "created",
        "properties": {"CHECK_IMMUNITY_TIME_IN_SECONDS": "10", "region": "eu"},
        "body": b'{"order": 42}',
        "born_timestamp": now,
        "batch_id": 3,
        **overrides,
    }


class RecordingListener(TransactionListener):
    """Returns fixed answers (or raises them, if they are exceptions) and records every call."""

    def __init__(self, execute_answer=LocalTransactionState.COMMIT_MESSAGE,
                 check_answer=LocalTransactionState.COMMIT_MESSAGE) -> None:
        self.execute_answer = execute_answer
        self.check_answer = check_answer
        self.executed: list[tuple[object, object]] = []
        self.checked: list[Message] = []
        self._lock = threading.Lock()

    def execute_local_transaction(self, msg, arg):
        with self._lock:
            self.executed.append((msg, arg))
        return _answer(self.execute_answer)

    def check_local_transaction(self, msg):
        with self._lock:
            self.checked.append(msg)
        return _answer(self.check_answer)


def _answer(answer):
    if isinstance(answer, BaseException):
        raise answer
    return answer


def send_from_process(lakehouse: str, process_index: int, transactions: int, all_started) -> list[str]:
    """Multi-process test child: send ``transactions`` transactions from 4 threads; return their ids.
    ``all_started`` (a barrier of every process) is passed once this producer has started, so that every
    process holds its commit log at once (one that closed first would free its log to a later one)."""
    config = CoordinatorConfig(lakehouse=lakehouse)
    ids: list[str] = []
    errors: list[BaseException] = []
    with TransactionProducer("order_group", RecordingListener(), config) as producer:
        all_started.wait(120)
        def send_share(first: int) -> None:
            try:
                for index in range(first, transactions, 4):
                    body = f"process {process_index} transaction {index}".encode()
                    ids.append(producer.send_message_in_transaction(Message("ORDER_TOPIC", body)).transaction_id)
            except Exception as error:
                errors.append(error)

        threads = [threading.Thread(target=send_share, args=(first,)) for first in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return ids


def append_from_process(lakehouse: str, process_index: int, transactions: int) -> list[str]:
    """Multi-process test child: append ``transactions`` halves from 4 threads to ``order_group``'s first
    commit log, whoever else writes it (as instances sharing a log do); return their transaction ids."""
    ids = [f"p{process_index}-t{index}" for index in range(transactions)]
    with CommitLogWriter(lakehouse, "order_group") as writer, ThreadPoolExecutor(4) as senders:
        list(senders.map(lambda transaction_id: writer.submit(half_records(
            "order_group", transaction_id, [Message("ORDER_TOPIC", transaction_id.encode())])).result(), ids))
    return ids


class EveryFourthUnknown(TransactionListener):
    """Leaves every fourth transaction (by its message's ``keys``, a number) ``UNKNOW``; answers every check
    with a commit."""

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW if int(msg.keys) % 4 == 0 else LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def send_and_answer_checks(lakehouse: str, storage: Mapping[str, str], transactions: int, senders: int,
                           ask: bool, timeout_s: float) -> None:
    """Process-exit test child: send ``transactions`` from ``senders`` threads, every fourth left ``UNKNOW``,
    then wait until a check of each of those is answered in the commit log, read with delta-rs beside the
    producer, close it, and count the answers in a last read of the log with ``DeltaTable.to_pyarrow_table()``.
    The checks are asked here, in one round written as the checker writes its, if ``ask``; else a checker
    running beside asks them. The caller tests how the process exits."""
    config = CoordinatorConfig(lakehouse=lakehouse, storage=storage)
    with TransactionProducer("order_group", EveryFourthUnknown(), config) as producer:
        with ThreadPoolExecutor(senders) as threads:
            sent = list(threads.map(lambda index: producer.send_message_in_transaction(
                Message("ORDER_TOPIC", b"order %d" % index, keys=str(index))), range(transactions)))
        unknown = {result.transaction_id for result in sent
                   if result.local_transaction_state is LocalTransactionState.UNKNOW}
        print(f"{len(sent)} sent, {len(unknown)} UNKNOW", flush=True)
        if ask:
            append_check_requests(lakehouse, [check_request(transaction_id=transaction_id)
                                              for transaction_id in unknown], storage)

        def answered() -> bool:
            rows = commit_log_rows(lakehouse, storage=storage)
            return unknown <= {row["transaction_id"] for row in rows if row["check_id"] is not None}

        wait_until(answered, timeout_s, "a check-back of every UNKNOW transaction")
        log = Lakehouse(lakehouse).key_path(producer.commit_log.key)
    # The last thing before exit, as a user's own check may be: a pyarrow scan through delta-rs's filesystem.
    ends = DeltaTable(log, storage_options=dict(storage) or None).to_pyarrow_table(columns=["transaction_id", "check_id"])
    checked_back = {row["transaction_id"] for row in ends.to_pylist() if row["check_id"] is not None}
    print(f"{len(unknown & checked_back)} checked back", flush=True)


if __name__ == "__main__":
    _lakehouse, _storage, _transactions, _senders, _asked_by, _timeout_s = sys.argv[1:]
    send_and_answer_checks(_lakehouse, json.loads(_storage), int(_transactions), int(_senders), _asked_by == "here",
                           float(_timeout_s))
