"""The check-back worker: answers the checker's questions about unresolved transactions.

The checker appends a row to the group's own ``groups/<group>/check_requests`` for each
transaction it wants resolved (only the group may read it: it carries the message). The worker
follows that table's change data feed, asks the listener's ``check_local_transaction`` on a
bounded thread pool, and appends an END record with the answer and the request's ``check_id``
to the group's commit log.

Example::

    worker = CheckBackWorker("lakehouse", "order_group", OrderListener(), writer, config)
    worker.start()
    ...
    worker.stop()
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Optional, Union

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from coordinator.commit_logs import committed
from coordinator.config import CoordinatorConfig
from coordinator.control.instances import ProducerInstances
from coordinator.exceptions import ProducerStateError
from coordinator.lakehouse import Lakehouse, open_table, query_snapshot
from coordinator.producer.commit_log import CommitLogWriter, end_record
from coordinator.producer.listener import TransactionListener
from coordinator.producer.message import Message
from coordinator.protocol import LocalTransactionState
from coordinator.tables import GROUP_CHECK_REQUESTS

__all__ = ["CheckBackWorker"]

#: How often a worker whose table did not grow lists its log all the same (see ``_poll``).
_RESYNC_S = 10.0
_LAST_CHECKPOINT = "_delta_log/_last_checkpoint"
_log = logging.getLogger("coordinator.producer.checkback")

#: Check ids remembered for de-duplication. A request is only ever re-read when it
#: is rewritten, long after it was answered; this covers hours of checks.
_REMEMBERED_CHECKS = 100_000

_CDF_SCHEMA = GROUP_CHECK_REQUESTS.arrow_schema().append(pa.field("_change_type", pa.string()))


class CheckBackWorker:
    """Follows one producer group's check requests and answers each request once.

    It announces its instance (``instance_id``) every ``producer_heartbeat_ms`` while it runs, on a thread of its
    own (``checkback-heartbeat-<group>``): a slow read of the check requests, retried for as long as the storage
    allows, must not make the instance look dead (its checks routed away, its log claimable), as the Java
    client's heartbeat does
    (:mod:`coordinator.control.instances`) and answers the requests addressed to it, or to no
    instance in particular; the checker addresses the others to the group's other live
    instances. On start it also answers requests issued within the last
    ``transaction_check_interval_ms`` (those a restarted producer missed while
    it was down); older ones have been superseded by the checker's next round.
    A missing table is waited for, and once it appears every request in it is
    answered, however old its batch clock says it is: the checker creates a new
    group's table with its first round of requests. Answers are sent one-way: a
    lost answer is asked again by the checker.

    Example::

        worker = CheckBackWorker("lakehouse", "order_group", listener, writer, config, poll_interval_s=0.5)
        worker.start()
        worker.stop()  # waits for checks in progress
    """

    def __init__(
        self,
        lakehouse: Union[str, Lakehouse],
        group: str,
        listener: TransactionListener,
        writer: CommitLogWriter,
        config: CoordinatorConfig,
        poll_interval_s: float = 0.2,
        max_workers: int = 4,
        instance_id: Optional[str] = None,
    ) -> None:
        lakehouse = Lakehouse.at(lakehouse)
        self.path = lakehouse.check_requests(group)
        self.storage = lakehouse.storage
        self._files = lakehouse.files
        self._key = f"{lakehouse.group_dir(group)}/check_requests"
        self.group = group
        self.listener = listener
        self.writer = writer
        self.config = config
        self.poll_interval_s = poll_interval_s
        self.max_workers = max_workers
        self.instance_id = instance_id or uuid.uuid4().hex
        self._instances = ProducerInstances(lakehouse)
        self._heartbeat_s = config.producer_heartbeat_ms / 1000
        self._answered: OrderedDict[str, None] = OrderedDict()
        self._table: Optional[DeltaTable] = None
        self._version = -1
        self._synced_at = float("-inf")
        self._waited_for_table = False  # everything in a table that appeared while this worker ran is for it
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._heartbeat: Optional[threading.Thread] = None
        self._pool: Optional[ThreadPoolExecutor] = None

    def start(self) -> None:
        """Start following check requests. Idempotent.

        Example::

            worker.start()
        """
        if self._thread is not None:
            return
        self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix=f"checkback-{self.group}")
        self._thread = threading.Thread(target=self._run, name=f"checkback-follower-{self.group}", daemon=True)
        self._heartbeat = threading.Thread(target=self._beat, name=f"checkback-heartbeat-{self.group}", daemon=True)
        self._heartbeat.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop following, and wait for the checks in progress; checks not yet begun are dropped
        (the checker asks again). Idempotent.

        Example::

            worker.stop()
        """
        if self._thread is None:
            return
        self._stopping.set()
        # The pool is shut down even if the withdrawal fails: no check may outlive stop(). Last to first.
        with contextlib.ExitStack() as steps:
            steps.callback(self._pool.shutdown, wait=True, cancel_futures=True)
            steps.callback(self._instances.withdraw, self.group, self.instance_id)
            steps.callback(self._heartbeat.join)  # no renewal after the withdrawal
            self._thread.join()

    def _beat(self) -> None:
        """Renew the instance's record every heartbeat until stopped; a failed renewal is logged and tried again
        a tenth of a heartbeat later."""
        while True:
            try:
                self._instances.announce(self.group, self.instance_id, self._heartbeat_s)
                wait = self._heartbeat_s
            except Exception as error:  # noqa: BLE001 - the storage's failure, whatever it is: renewed next time
                _log.warning("renewing the record of %s failed group=%s: %s", self.instance_id, self.group, error)
                wait = self._heartbeat_s / 10
            if self._stopping.wait(wait):
                return

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._poll()
            except Exception:
                # A read can fail transiently (a checkpoint being written, storage hiccups), or for good
                # once log cleanup has removed the versions after the last one read: the next poll
                # starts again from the recent requests, as at start (answered checks are not re-sent).
                _log.exception("reading %s failed group=%s", self.path, self.group)
                self._table = None
            self._stopping.wait(self.poll_interval_s)

    def _ours(self) -> pc.Expression:
        """Requests of this group addressed to this instance or to none in particular."""
        addressed = pc.field("producer_instance")
        return (pc.field("producer_group") == self.group) & (addressed.is_null() | (addressed == self.instance_id))

    def _poll(self) -> None:
        # A probe or two for the table's next commit file (HEADs, on object storage) instead of delta-rs's listing
        # of its log at every poll, which S3 prices 12 times higher; delta-rs lists even a table that is missing.
        # The log is listed anyway every _RESYNC_S, so a worker that log cleanup overtook (the versions after its
        # last one removed) finds out and starts again from the recent requests.
        if self._table is None:
            if not (committed(self._files, self._key, 0) or self._files.exists(f"{self._key}/{_LAST_CHECKPOINT}")):
                self._waited_for_table = True
                return
            table = open_table(self.path, storage=self.storage)
            self._dispatch(self._requests(table, every=self._waited_for_table))
            self._table, self._version, self._synced_at = table, table.version(), time.monotonic()
            return
        if (not committed(self._files, self._key, self._version + 1)
                and time.monotonic() - self._synced_at < _RESYNC_S):
            return
        self._synced_at = time.monotonic()
        self._table.update_incremental()
        latest = self._table.version()
        if latest <= self._version:
            return
        changes = pa.RecordBatchReader.from_stream(
            self._table.load_cdf(starting_version=self._version + 1, ending_version=latest)
        ).read_all()
        # delta-rs hands out view types, which arrow compute cannot compare with plain strings.
        changes = changes.select(_CDF_SCHEMA.names).cast(_CDF_SCHEMA)
        self._dispatch(changes.filter((pc.field("_change_type") == "insert") & self._ours()))
        self._version = latest

    def _requests(self, table: DeltaTable, every: bool) -> pa.Table:
        """Ours in ``table``'s snapshot: ``every`` one, or those requested within the last check interval."""
        cutoff = datetime.now(timezone.utc) - timedelta(milliseconds=self.config.transaction_check_interval_ms)
        # Read by delta-rs's engine, not a pyarrow scan: on object storage that one's threads would still hold
        # Python's buffers after close(), and abort the process if it exits then (query_snapshot).
        requests = query_snapshot(table, GROUP_CHECK_REQUESTS.arrow_schema(),
                                  None if every else f"requested_at >= '{cutoff.isoformat()}'")
        return requests.filter(self._ours())

    def _dispatch(self, requests: pa.Table) -> None:
        for request in requests.select(GROUP_CHECK_REQUESTS.column_names).to_pylist():
            check_id = request["check_id"]
            if check_id is None:
                _log.warning("check request without check_id ignored transaction_id=%s", request["transaction_id"],
                             extra={"transaction_id": request["transaction_id"]})
                continue
            if check_id in self._answered:
                continue
            self._answered[check_id] = None
            if len(self._answered) > _REMEMBERED_CHECKS:
                self._answered.popitem(last=False)
            self._pool.submit(self._answer, request)

    def _answer(self, request: dict) -> None:
        transaction_id, check_id = request["transaction_id"], request["check_id"]
        extra = {"transaction_id": transaction_id, "check_id": check_id, "producer_group": self.group}
        msg = Message(
            topic=request["topic"],
            body=request["body"],
            keys=request["keys"],
            tags=request["tags"],
            properties=dict(request["properties"] or ()),
            transaction_id=transaction_id,
            msg_id=request["msg_id"],
        )
        try:
            returned = self.listener.check_local_transaction(msg)
        except Exception:
            _log.exception("check_local_transaction failed transaction_id=%s check_id=%s; state UNKNOW",
                           transaction_id, check_id, extra=extra)
            returned = LocalTransactionState.UNKNOW
        state = LocalTransactionState.coerce(returned)
        if state is LocalTransactionState.UNKNOW and not isinstance(returned, LocalTransactionState):
            _log.warning("check_local_transaction returned %r transaction_id=%s check_id=%s; state UNKNOW",
                         returned, transaction_id, check_id, extra=extra)
        try:
            future = self.writer.submit([end_record(self.group, transaction_id, state, check_id)])
        except ProducerStateError:
            _log.warning("check answer not sent, writer closed transaction_id=%s check_id=%s", transaction_id, check_id,
                         extra=extra)
            return
        _log.info("check answered transaction_id=%s check_id=%s check_times=%s state=%s",
                  transaction_id, check_id, request["check_times"], state.value, extra=extra)
        future.add_done_callback(lambda done: _log_lost_answer(done, transaction_id, check_id, extra))


def _log_lost_answer(future: Future, transaction_id: str, check_id: str, extra: dict) -> None:
    if future.exception() is not None:
        _log.warning("check answer not stored transaction_id=%s check_id=%s: %s; the checker will ask again",
                     transaction_id, check_id, future.exception(), extra=extra)
