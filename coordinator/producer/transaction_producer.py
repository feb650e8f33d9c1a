"""The transaction producer: half messages, the local transaction, the end record.

Needs no JVM: records go to the commit log this instance claimed among its group's
(:meth:`~coordinator.control.instances.ProducerInstances.claim_log`), many concurrent
sends per Delta commit (see :mod:`coordinator.producer.commit_log`).

Example::

    with TransactionProducer("order_group", OrderListener(), config) as producer:
        result = producer.send_message_in_transaction(Message("ORDER_TOPIC", b"..."), order)
        result.local_transaction_state  # LocalTransactionState.COMMIT_MESSAGE
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any, Optional, Sequence

from coordinator.config import CoordinatorConfig
from coordinator.commit_logs import CommitLogRef
from coordinator.control.instances import ProducerInstances
from coordinator.exceptions import (AccessDeniedError, CoordinatorError, HalfNotStoredError, HalfOutcomeUnknownError,
                                    MessageValidationError, ProducerStateError, WriteOutcomeUnknownError)
from coordinator.grants import TopicGrants
from coordinator.lakehouse import Lakehouse
from coordinator.lakehouse.pools import wait_for_arrow_pools_at_exit
from coordinator.producer.checkback import CheckBackWorker
from coordinator.producer.commit_log import CommitLogWriter, end_record, half_records
from coordinator.producer.listener import TransactionListener
from coordinator.producer.message import Message, SendStatus, TransactionSendResult
from coordinator.protocol import LocalTransactionState, MAX_COMMIT_BODY_BYTES
from coordinator.names import validate_name

__all__ = ["TransactionProducer", "time_ordered_id"]

_log = logging.getLogger("coordinator.producer.transaction_producer")


class TransactionProducer:
    """Sends messages in transactions for one producer group, and answers check-backs.

    ``start()`` opens the commit-log writer (creating the group's commit log if
    needed) and starts the check-back worker; ``shutdown()`` stops the worker
    and writes everything still pending. Safe to share between threads.

    Example::

        producer = TransactionProducer("order_group", OrderListener(), CoordinatorConfig.load())
        producer.start()
        try:
            producer.send_message_in_transaction(Message("ORDER_TOPIC", b"..."), order)
        finally:
            producer.shutdown()
    """

    def __init__(self, group: str, listener: TransactionListener, config: CoordinatorConfig) -> None:
        self.group = validate_name("producer group", group)
        self.listener = listener
        self.config = config
        self._lock = threading.Lock()
        self._state = "created"
        #: This instance of the group, as the checker addresses it (``groups/<group>/_producers``).
        self.instance_id = uuid.uuid4().hex
        self._writer: Optional[CommitLogWriter] = None
        self._checkback: Optional[CheckBackWorker] = None

    def start(self) -> "TransactionProducer":
        """Open the commit log and start answering check-backs. Idempotent; returns ``self``.

        Raises :class:`ProducerStateError` after :meth:`shutdown`: a producer is not restarted.
        (Shutting down a producer that never started does nothing.)

        Example::

            producer = TransactionProducer("order_group", listener, config).start()
        """
        with self._lock:
            if self._state == "running":
                return self
            if self._state == "stopped":
                raise ProducerStateError(f"producer {self.group!r} was shut down; create a new one")
            writer = self._open_commit_log()
            checkback = CheckBackWorker(Lakehouse.of(self.config), self.group, self.listener, writer, self.config,
                                        instance_id=self.instance_id)
            checkback.start()
            self._writer, self._checkback, self._state = writer, checkback, "running"
        # The process's own pyarrow scans (the caller's too) must be torn down before it finalizes, or it aborts.
        wait_for_arrow_pools_at_exit()
        _log.info("producer started group=%s instance=%s lakehouse=%s commit_log=%s", self.group, self.instance_id,
                  self.config.lakehouse, self._writer.log)
        return self

    @property
    def commit_log(self) -> Optional[CommitLogRef]:
        """The commit log this instance appends to (``None`` until :meth:`start`).

        Example::

            producer.start().commit_log.key  # 'groups/order_group/commit_log.1' (the group's second instance)
        """
        return self._writer.log if self._writer is not None else None

    def _open_commit_log(self) -> CommitLogWriter:
        """The writer of a commit log this instance claims, once its record says it is live. Where
        the storage refuses that log (grants from before a group had several), the group's first."""
        lakehouse = Lakehouse.of(self.config)
        instances = ProducerInstances(lakehouse)
        instances.announce(self.group, self.instance_id, self.config.producer_heartbeat_ms / 1000)
        log = instances.claim_log(self.group, self.instance_id)
        try:
            return CommitLogWriter(lakehouse, log, commit_interval_ms=self.config.commit_interval_ms)
        except AccessDeniedError as error:
            if log.number == 0:
                raise
            _log.warning("this instance shares group %s's first commit log: %s. Grant the group %s* "
                         "(`txcoord grants`) so that its instances append side by side", self.group, error,
                         lakehouse.commit_log(self.group))
            return CommitLogWriter(lakehouse, self.group, commit_interval_ms=self.config.commit_interval_ms)

    def shutdown(self) -> None:
        """Stop answering check-backs, write every pending record, close the commit log. Idempotent.

        Every thread the producer started has ended when it returns, even if a step failed (its error
        is raised once the other steps are done).

        Example::

            producer.shutdown()
        """
        with self._lock:
            if self._state != "running":
                return
            self._state = "stopped"
        # Each step runs whatever the one before it raised: a withdrawal the storage refused must not
        # leave the writer's threads running, nor its records unwritten. Callbacks run last to first.
        with contextlib.ExitStack() as steps:
            steps.callback(ProducerInstances(Lakehouse.of(self.config)).release_log, self.group, self.instance_id,
                           self._writer.log)
            steps.callback(self._writer.close)
            steps.callback(self._checkback.stop)
        _log.info("producer shut down group=%s", self.group)

    def __enter__(self) -> "TransactionProducer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Send ``msg`` as a half, run the local transaction, report its outcome.

        The listener's ``execute_local_transaction(msg, arg)`` runs only once the
        half is durable; an exception or ``None`` from it counts as ``UNKNOW``
        (the coordinator will check back). The outcome is sent one-way, as
        RocketMQ does: if it is lost, the check-back repairs it.

        Raises :class:`MessageValidationError` (nothing written), :class:`HalfNotStoredError`
        (nothing stored, local transaction not run) or :class:`HalfOutcomeUnknownError` (the
        storage never said whether the half was stored; local transaction not run; its
        ``transaction_id`` names it). A storage that fails for a while is retried first, within
        the ``[storage]`` settings ``max_retries`` and ``retry_timeout``; each error's ``retriable``
        and ``outcome_unknown`` say what the caller may do (docs/producer.md#errors).

        Example::

            result = producer.send_message_in_transaction(Message("ORDER_TOPIC", b"..."), order)
            result.transaction_id, result.msg_id, result.local_transaction_state
        """
        return self._send([msg], msg, arg)

    def send_messages_in_transaction(self, msgs: Sequence[Message], arg: Any = None) -> TransactionSendResult:
        """Send several messages, possibly to several topics, in one local transaction.

        All are delivered or none: their halves are stored in one Delta commit,
        and one END resolves them together. The listener's
        ``execute_local_transaction`` receives the list of messages.

        Example::

            result = producer.send_messages_in_transaction(
                [Message("ORDER_TOPIC", b"..."), Message("AUDIT_TOPIC", b"...")], order)
            result.msg_ids  # one id per message, in order
        """
        if isinstance(msgs, Message) or not isinstance(msgs, Sequence):
            raise MessageValidationError(f"expected a list of messages, got {type(msgs).__name__}")
        msgs = list(msgs)
        return self._send(msgs, msgs, arg)

    def _send(self, msgs: list[Message], listener_msg: Any, arg: Any) -> TransactionSendResult:
        writer = self._running_writer()
        _validate(msgs)
        self._refuse_ungranted_topics(msgs)
        transaction_id = time_ordered_id()
        for msg in msgs:
            msg.transaction_id = transaction_id
            msg.msg_id = uuid.uuid4().hex
        extra = {"transaction_id": transaction_id, "producer_group": self.group}
        try:
            version = writer.submit(half_records(self.group, transaction_id, msgs)).result()
        except ProducerStateError:
            raise
        except WriteOutcomeUnknownError as error:
            _log.error("half outcome unknown transaction_id=%s group=%s: %s", transaction_id, self.group, error,
                       extra=extra)
            raise HalfOutcomeUnknownError(
                f"transaction {transaction_id}: the storage never confirmed whether the half message(s) were stored; "
                f"the local transaction was not run. If they were, the checker checks back once their immunity is "
                f"over and check_local_transaction answers (roll back: the local transaction never ran)",
                transaction_id) from error
        except Exception as error:
            _log.error("half not stored transaction_id=%s group=%s: %s", transaction_id, self.group, error, extra=extra)
            raise HalfNotStoredError(
                f"transaction {transaction_id}: the half message(s) could not be stored; "
                f"the local transaction was not run (state ROLLBACK_MESSAGE)",
                retriable=isinstance(error, CoordinatorError) and error.retriable,
            ) from error
        _log.debug("half stored transaction_id=%s messages=%d version=%d", transaction_id, len(msgs), version, extra=extra)

        state = self._execute_local_transaction(listener_msg, arg, transaction_id, extra)
        try:
            writer.submit([end_record(self.group, transaction_id, state)]).add_done_callback(
                lambda future: _log_lost_end(future, transaction_id, extra)
            )
        except ProducerStateError:
            _log.warning("end not sent, producer shutting down transaction_id=%s state=%s; check-back will resolve it",
                         transaction_id, state.value, extra=extra)
        _log.info("transaction sent transaction_id=%s messages=%d state=%s", transaction_id, len(msgs), state.value, extra=extra)
        return TransactionSendResult(
            send_status=SendStatus.SEND_OK,
            transaction_id=transaction_id,
            msg_id=msgs[0].msg_id,
            local_transaction_state=state,
            msg_ids=tuple(msg.msg_id for msg in msgs),
        )

    def _refuse_ungranted_topics(self, msgs: list[Message]) -> None:
        # The checker would refuse the transaction after the local one ran: say so before either happens.
        grants = TopicGrants(self.config.topic_grants)
        for msg in msgs:
            refusal = grants.refusal(self.group, msg.topic)
            if refusal:
                raise MessageValidationError(f"{refusal}: nothing was sent, the local transaction was not run")

    def _execute_local_transaction(self, listener_msg: Any, arg: Any, transaction_id: str, extra: dict) -> LocalTransactionState:
        try:
            returned = self.listener.execute_local_transaction(listener_msg, arg)
        except Exception:
            _log.exception("local transaction failed transaction_id=%s; state UNKNOW", transaction_id, extra=extra)
            return LocalTransactionState.UNKNOW
        state = LocalTransactionState.coerce(returned)
        if state is LocalTransactionState.UNKNOW and not isinstance(returned, LocalTransactionState):
            _log.warning("local transaction returned %r transaction_id=%s; state UNKNOW", returned, transaction_id, extra=extra)
        return state

    def _running_writer(self) -> CommitLogWriter:
        with self._lock:
            if self._state == "created":
                raise ProducerStateError(f"producer {self.group!r} is not started; call start() first")
            if self._state == "stopped":
                raise ProducerStateError(f"producer {self.group!r} was shut down")
            return self._writer


def _validate(msgs: list[Message]) -> None:
    if not msgs:
        raise MessageValidationError("a transaction needs at least one message")
    if len({id(msg) for msg in msgs}) != len(msgs):
        raise MessageValidationError("the same Message object appears twice; each message gets its own id")
    for msg in msgs:
        if not isinstance(msg, Message):
            raise MessageValidationError(f"expected a Message, got {type(msg).__name__}")
        msg.validate()
    size = sum(len(msg.body) for msg in msgs)
    if size > MAX_COMMIT_BODY_BYTES:
        raise MessageValidationError(f"the transaction's bodies are {size} bytes together; the maximum is "
                                     f"{MAX_COMMIT_BODY_BYTES}")


def _log_lost_end(future: Future, transaction_id: str, extra: dict) -> None:
    if future.exception() is not None:
        _log.warning("end record not stored transaction_id=%s: %s; check-back will resolve it",
                     transaction_id, future.exception(), extra=extra)


def time_ordered_id() -> str:
    """A new transaction id: 32 hex digits, the milliseconds since the epoch then 80 random bits.

    Ids sent close in time sort close together, so each Delta file of the checker's
    tables covers a narrow range of them and a lookup by id skips old files.

    Example::

        time_ordered_id()  # '019a8f3c2d1e5b0c9a7f43d2e18b6c05'
    """
    return f"{time.time_ns() // 1_000_000:012x}{secrets.randbits(80):020x}"
