"""The commit log, producer side: record formats and the group-committing writer.

Every record a producer sends (a HALF for each prepared message, an END for each
outcome) is appended to the commit log its instance claimed among its group's own,
``groups/<group>/commit_log[.<n>]`` (:mod:`coordinator.commit_logs`), as a Delta commit of its own making
(:class:`~coordinator.appender.DeltaAppender`), so a producer starts no JVM. Sends
from many threads are gathered into few commits.

Example::

    writer = CommitLogWriter("lakehouse", "order_group")
    writer.submit([end_record("order_group", "3f2a...", LocalTransactionState.COMMIT_MESSAGE)])
    writer.close()
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from datetime import datetime, timezone
from typing import Optional, Sequence, Union

import pyarrow as pa
from coordinator.appender import DeltaAppender
from coordinator.commit_logs import CommitLogRef
from coordinator.doorbells import Doorbell
from coordinator.exceptions import InvalidArgumentError, ProducerStateError
from coordinator.lakehouse import Lakehouse, create_table
from coordinator.producer.message import Message
from coordinator.protocol import MAX_COMMIT_BODY_BYTES, PROTOCOL, PROTOCOL_FIELD, LocalTransactionState, RecordKind
from coordinator.storage import read_all
from coordinator.tables import COMMIT_LOG

__all__ = ["CommitLogWriter", "end_record", "half_records", "records_to_arrow"]

_log = logging.getLogger("coordinator.producer.commit_log")
_SCHEMA = COMMIT_LOG.arrow_schema()
_ROW_TYPE = pa.struct(list(_SCHEMA))
_COLUMNS = frozenset(COMMIT_LOG.column_names)
_CLOSE = object()
#: The default shortest time between two commits of one writer (``CoordinatorConfig.commit_interval_ms``).
DEFAULT_COMMIT_INTERVAL_MS = 10
#: Batches of one writer between being taken and committed on object storage: the one committing, and the
#: next one, whose data file is written meanwhile. More would make more, smaller commits for no more throughput.
BATCHES_IN_FLIGHT = 2
#: The same on a local disk, where a commit takes a fraction of a millisecond: a second batch buys no throughput
#: there, and takes the first senders back while the rest are still resolving, in more and smaller commits that
#: every reader of the log pays for (docs/performance-log.md#backlog-drain).
LOCAL_BATCHES_IN_FLIGHT = 1
#: A writer compacts the files of its own appends every this many of them (as often as the log is checkpointed:
#: each checkpoint then lists about this many small files, not every one since the last maintenance run).
COMPACT_OWN_APPENDS_EVERY = 1000


def half_records(group: str, transaction_id: str, messages: Sequence[Message]) -> list[dict]:
    """The HALF records of one transaction: one per message, numbered in order.

    Each message must already be validated and carry its ``msg_id``.

    Example::

        half_records("order_group", "3f2a...", [msg])[0]["kind"]  # 'HALF'
    """
    born = datetime.now(timezone.utc)
    return [
        {
            "record_id": uuid.uuid4().hex,
            "kind": RecordKind.HALF,
            "transaction_id": transaction_id,
            "producer_group": group,
            "msg_id": msg.msg_id,
            "message_index": index,
            "message_count": len(messages),
            "topic": msg.topic,
            "keys": msg.keys,
            "tags": msg.tags,
            "properties": dict(msg.properties or {}),
            "body": msg.body,
            "born_timestamp": born,
        }
        for index, msg in enumerate(messages)
    ]


def end_record(group: str, transaction_id: str, state: LocalTransactionState, check_id: Optional[str] = None,
               properties: Optional[dict[str, str]] = None) -> dict:
    """The END record reporting ``state``; ``check_id`` names the check it answers, if any, and
    ``properties`` say more about it (an operator's name and reason).

    Example::

        end_record("order_group", "3f2a...", LocalTransactionState.ROLLBACK_MESSAGE)["state"]
        # 'ROLLBACK_MESSAGE'
    """
    return {
        "record_id": uuid.uuid4().hex,
        "kind": RecordKind.END,
        "transaction_id": transaction_id,
        "producer_group": group,
        "state": state.value,
        "check_id": check_id,
        "properties": properties,
        "born_timestamp": datetime.now(timezone.utc),
    }


def records_to_arrow(records: Sequence[dict]) -> pa.Table:
    """Records as a pyarrow table with the exact commit-log schema; missing columns are null.

    Raises ``ValueError`` on a key that is not a commit-log column (it would
    otherwise be dropped without a word).

    Example::

        records_to_arrow([end_record("g", "t", LocalTransactionState.UNKNOW)]).num_rows  # 1
    """
    return _rows_to_arrow(_rows(records))


def _rows(records: Sequence[dict]) -> list[tuple]:
    """Each record as a tuple in column order (missing columns ``None``); ``ValueError`` on a key that is not a column."""
    rows = []
    for record in records:
        unknown = record.keys() - _COLUMNS
        if unknown:
            raise InvalidArgumentError(f"not commit-log columns: {', '.join(sorted(unknown))}")
        rows.append(tuple(map(record.get, _SCHEMA.names)))
    return rows


def _rows_to_arrow(rows: Sequence[tuple]) -> pa.Table:
    # One conversion call for the whole batch. It runs on the writer thread for every commit, and each
    # pyarrow call lets go of the GIL, which under many sender threads takes long to win back.
    return pa.Table.from_struct_array(pa.array(rows, type=_ROW_TYPE))


class CommitLogWriter:
    """Appends records to one commit log, many submits per Delta commit: producer group ``log``'s own
    (a name), or the one a :class:`~coordinator.commit_logs.CommitLogRef` names (the operators').

    One background thread takes everything waiting (up to ``max_batch_rows`` and
    bodies of :data:`~coordinator.validation.MAX_COMMIT_BODY_BYTES` in all, never
    splitting a submit) and writes it as one data file; a second one commits those
    files in the order they were taken, then resolves the submitters' futures. So on
    object storage the next batch's data file is written while a commit is in flight (at
    most one batch waits behind the commit in flight: a version costs two requests in
    sequence there, and the log takes one every request's round trip); on a local disk
    one batch is in flight at a time (``batches_in_flight`` overrides either). The records of one
    :meth:`submit` always land in the same commit. A commit starts at least ``commit_interval_ms`` after the one
    before (as Kafka's ``linger.ms``): under load commits take longer than
    that anyway, and a lightly loaded producer makes few, larger commits instead
    of one per send, which every reader of the log (the checker first) pays for. Several processes may append to the same table at once: an
    append that lost the race for a version takes the next one. The writer
    checkpoints the log every ``delta.checkpointInterval`` commits and compacts the files of its
    own appends every :data:`COMPACT_OWN_APPENDS_EVERY`, both off the senders' path, and never deletes expired commits from it:
    :func:`coordinator.ops.maintenance.maintain` does, once the checker no longer
    needs them.

    Creates the commit log if it is missing (a group's principal may: the log is in its own prefix),
    and a group's logs numbered below it too (a reader finds a group's logs by looking for the next one).

    Example::

        with CommitLogWriter("lakehouse", "order_group") as writer:
            writer.submit(half_records("order_group", txid, [msg])).result()  # durable now
    """

    def __init__(self, lakehouse: Union[str, Lakehouse], log: Union[str, CommitLogRef], max_batch_rows: int = 5000,
                 commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS, batches_in_flight: Optional[int] = None) -> None:
        if max_batch_rows < 1:
            raise InvalidArgumentError(f"max_batch_rows must be at least 1, got {max_batch_rows}")
        if commit_interval_ms < 0:
            raise InvalidArgumentError(f"commit_interval_ms must not be negative, got {commit_interval_ms}")
        if batches_in_flight is not None and batches_in_flight < 1:
            raise InvalidArgumentError(f"batches_in_flight must be at least 1, got {batches_in_flight}")
        lakehouse = Lakehouse.at(lakehouse)
        if batches_in_flight is None:
            batches_in_flight = LOCAL_BATCHES_IN_FLIGHT if lakehouse.is_local else BATCHES_IN_FLIGHT
        self.log = log if isinstance(log, CommitLogRef) else CommitLogRef.of_group(log)
        self.path = lakehouse.key_path(self.log.key)
        below = [CommitLogRef.of_group(self.log.group, number) for number in range(self.log.number or 0)]
        read_all(lambda ref: create_table(COMMIT_LOG, lakehouse.key_path(ref.key), lakehouse.storage),
                 [*below, self.log], remote=not lakehouse.is_local)
        self.max_batch_rows = max_batch_rows
        self.commit_interval_s = commit_interval_ms / 1000
        self._next_commit_at = 0.0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # Held while enqueueing, so nothing can be queued behind the close marker and never resolve.
        self._lock = threading.Lock()
        self._closed = False
        # It compacts its own appends: another process's compaction commit would race its commits, and lose
        # nearly every race to a writer that always has the next commit in flight.
        # Each commit says the client protocol it was written under (docs/protocol.md#versioning).
        self._appender = DeltaAppender(self.path, storage=lakehouse.storage, compact_every=COMPACT_OWN_APPENDS_EVERY,
                                       commit_info={PROTOCOL_FIELD: PROTOCOL})
        # On object storage the checker probes a quiet group's logs only when the group rings (coordinator.doorbells).
        self._doorbell = (Doorbell(lakehouse.files, self.log.group)
                          if self.log.group is not None and not lakehouse.is_local else None)
        self._in_flight = threading.Semaphore(batches_in_flight)
        self._prepared: queue.SimpleQueue = queue.SimpleQueue()  # (PreparedAppend, futures), in commit order
        self._thread = threading.Thread(target=self._run, name="commit-log-writer", daemon=True)
        self._committer = threading.Thread(target=self._commit_prepared, name="commit-log-committer", daemon=True)
        self._thread.start()
        self._committer.start()

    def submit(self, records: Sequence[dict]) -> Future:
        """Queue ``records`` for the next commit; the future resolves to the commit's table version.

        The records are never split between commits, even beyond ``max_batch_rows``;
        records whose bodies are larger than ``MAX_COMMIT_BODY_BYTES`` together are
        refused (:class:`InvalidArgumentError`), as the checker would. The future holds the write's exception if the commit failed, or if a value
        does not fit its column's type (the other submits of that commit are still
        written). Raises at once (``ValueError``) for a key that is not a commit-log
        column, and :class:`ProducerStateError` after :meth:`close`.

        Example::

            version = writer.submit(records).result()  # blocks until durable
        """
        if not records:
            raise InvalidArgumentError("nothing to submit")
        rows = _rows(records)  # in the sender's thread: the writer's own work stays small
        size = sum(len(record.get("body") or b"") for record in records)
        if size > MAX_COMMIT_BODY_BYTES:
            raise InvalidArgumentError(f"the records' bodies are {size} bytes together; one commit holds at most "
                                       f"{MAX_COMMIT_BODY_BYTES}")
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise ProducerStateError("the commit-log writer is closed")
            self._queue.put((rows, future, size))
        return future

    def close(self) -> None:
        """Write everything already submitted, then stop the writer thread. Idempotent.

        Example::

            writer.close()
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_CLOSE)
        self._thread.join()
        self._committer.join()
        self._appender.close()

    def __enter__(self) -> "CommitLogWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self) -> None:
        carried = None
        while True:
            self._in_flight.acquire()  # released once this batch is committed (or given up)
            item = carried if carried is not None else self._queue.get()
            carried = None
            if item is _CLOSE:
                self._prepared.put(_CLOSE)
                return
            time.sleep(max(0.0, self._next_commit_at - time.monotonic()))
            batch = [item[:2]]
            rows, size = len(item[0]), item[2]
            while rows < self.max_batch_rows:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _CLOSE or rows + len(item[0]) > self.max_batch_rows or size + item[2] > MAX_COMMIT_BODY_BYTES:
                    carried = item
                    break
                batch.append(item[:2])
                rows, size = rows + len(item[0]), size + item[2]
            self._next_commit_at = time.monotonic() + self.commit_interval_s
            if not self._prepare(batch):
                self._in_flight.release()

    def _prepare(self, batch: list[tuple[list[tuple], Future]]) -> bool:
        """Write ``batch``'s data file and queue its commit; whether anything was queued (a batch whose
        submits were all cancelled or refused, or whose file failed, has its futures resolved here)."""
        # A submit whose future was cancelled while it waited is not written.
        batch = [(records, future) for records, future in batch if future.set_running_or_notify_cancel()]
        if not batch:
            return False
        # Converted here, all at once: one conversion per submit, in each sender's thread, cost
        # more than the commit itself under many senders. A record that does not convert fails
        # its own submit only.
        try:
            data = _rows_to_arrow([row for rows, _ in batch for row in rows])
        except (TypeError, ValueError, pa.ArrowException):
            data, batch = self._convert_each(batch)
            if not batch:
                return False
        futures = [future for _, future in batch]
        try:
            prepared = self._appender.prepare(data)
        except Exception as error:
            _fail(futures, error)
            return False
        self._prepared.put((prepared, futures))
        return True

    def _commit_prepared(self) -> None:
        while (item := self._prepared.get()) is not _CLOSE:
            prepared, futures = item
            try:
                version = self._appender.commit(prepared)
            except Exception as error:
                _fail(futures, error)
            else:
                for future in futures:
                    future.set_result(version)
                if self._doorbell is not None:
                    self._doorbell.landed()
            finally:
                self._in_flight.release()

    @staticmethod
    def _convert_each(batch: list[tuple[list[tuple], Future]]) -> tuple[Optional[pa.Table], list[tuple[list[tuple], Future]]]:
        converted, kept = [], []
        for rows, future in batch:
            try:
                converted.append(_rows_to_arrow(rows))
                kept.append((rows, future))
            except (TypeError, ValueError, pa.ArrowException) as error:
                future.set_exception(error)
        return (pa.concat_tables(converted).combine_chunks() if converted else None), kept


def _fail(futures: list[Future], error: Exception) -> None:
    _log.error("commit-log append failed for %d submits: %s", len(futures), error)
    for future in futures:
        future.set_exception(error)
