"""Helpers for the producer-side tests: read the lakehouse with delta-rs, record listener calls.

Also holds the entry point of the multi-process test: ``spawn`` children import it by name.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from coordinator import CoordinatorConfig, LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.commit_logs import CommitLogs
from coordinator.lakehouse import Lakehouse, create_table
from coordinator.producer.commit_log import CommitLogWriter, half_records
from coordinator.tables import GROUP_CHECK_REQUESTS


def commit_log_rows(lakehouse: str, group: str = "order_group") -> list[dict]:
    """Every row of ``group``'s commit logs, each with the ``_commit_version`` it was written in and the
    ``commit_log`` (its key) it was written to."""
    rows = []
    for ref in CommitLogs(Lakehouse(lakehouse)).discover():
        if ref.group == group:
            table = DeltaTable(Lakehouse(lakehouse).key_path(ref.key))
            changes = pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=0)).read_all()
            rows += [{**row, "commit_log": ref.key} for row in changes.to_pylist()]
    return rows


def commit_log_version(lakehouse: str, log: str = "groups/order_group/commit_log") -> int:
    """The latest version of the commit log ``log`` (a key under the lakehouse)."""
    return DeltaTable(Lakehouse(lakehouse).key_path(log)).version()


def append_check_request(lakehouse: str, **overrides) -> dict:
    """Append one check request to its group's table, the way the checker writes it; return the row."""
    now = datetime.now(timezone.utc)
    row = {
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
    path = Lakehouse(lakehouse).check_requests(row["producer_group"])
    create_table(GROUP_CHECK_REQUESTS, path)
    write_deltalake(path, pa.Table.from_pylist([row], schema=GROUP_CHECK_REQUESTS.arrow_schema()), mode="append")
    return row


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


def send_from_process(lakehouse: str, process_index: int, transactions: int) -> list[str]:
    """Multi-process test child: send ``transactions`` transactions from 4 threads; return their ids."""
    config = CoordinatorConfig(lakehouse=lakehouse)
    ids: list[str] = []
    errors: list[BaseException] = []
    with TransactionProducer("order_group", RecordingListener(), config) as producer:
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
