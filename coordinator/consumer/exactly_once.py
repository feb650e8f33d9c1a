"""Listeners that apply their effect exactly once: the mirror of the producer's local transaction.

Delivery is at least once: a crash delivers again what was handled since the share's last save. A listener
applies its effect once by recording the message's id in the same atomic write as the effect and skipping a
message whose id is recorded already:

- :class:`TransactionalListener`: the effect in a database reached by a DB-API 2 connection (sqlite3,
  psycopg, ...). The id is inserted into a record table (created if absent) first, in the transaction of the
  effect; a duplicate id is the database's own unique-key violation, so two overlapping deliveries of one
  message cannot both commit.
- :class:`DeltaTableListener`: the effect as rows appended to a Delta table, the id as the commit's
  application transaction (``txn`` action), which delta-rs writes in the same log entry as the rows.

Example::

    class Credits(TransactionalListener):
        def apply(self, message, cursor):
            cursor.execute("INSERT INTO credits VALUES (?, ?)", (message.keys, 10))

    listener = Credits(lambda: sqlite3.connect("credits.db"), group="credits")
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import threading
from typing import Any, Callable, Optional

import pyarrow as pa

from coordinator.consumer.listener import ConsumeResult, MessageListener
from coordinator.consumer.message import ConsumedMessage
from coordinator.exceptions import IncompleteListenerError, InvalidArgumentError

__all__ = ["DeltaTableListener", "TransactionalListener", "delta_app_id"]

_log = logging.getLogger("coordinator.consumer")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

#: Placeholders of the record insert in each DB-API ``paramstyle``, and whether its parameters are a mapping.
_PLACEHOLDERS = {
    "qmark": (lambda name, n: "?", False),
    "format": (lambda name, n: "%s", False),
    "numeric": (lambda name, n: f":{n}", False),
    "named": (lambda name, n: f":{name}", True),
    "pyformat": (lambda name, n: f"%({name})s", True),
}
_RECORD_COLUMNS = ("consumer_group", "msg_id", "topic", "topic_version", "queue_offset")


def _driver(connection: Any):
    """The DB-API module of ``connection``: the first package on its class's module path with a ``paramstyle``
    (``sqlite3``, ``psycopg``, ``psycopg2``...)."""
    parts = type(connection).__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = importlib.import_module(".".join(parts[:end]))
        if hasattr(module, "paramstyle") and hasattr(module, "IntegrityError"):
            return module
    raise InvalidArgumentError(f"cannot tell the DB-API module of {type(connection).__name__}: pass paramstyle= "
                               f"and integrity_error=")


class TransactionalListener(MessageListener):
    """A listener whose effect, in a database reached by DB-API 2 connections, is applied exactly once.

    Subclasses implement :meth:`apply`. ``consume`` takes the calling thread's connection (``connect()`` is
    called once per listener thread: a DB-API connection is not shared between threads), inserts
    ``(group, msg_id, topic, topic_version, queue_offset)`` into ``table`` (created if absent, its key the
    group and the message id), calls ``apply(message, cursor)`` and commits: the record and the effect in one
    local transaction. A message whose id is recorded already was applied: the insert's unique-key violation
    says so, the transaction is rolled back and the message counts as handled. Inserting the record first
    makes a second delivery running at the same time (a share handed over mid-call) wait for the first's
    commit and then see the duplicate, rather than apply the effect twice. Anything ``apply`` raises rolls
    back both and fails the message (it is delivered again later).

    The connection must not be in autocommit mode. ``paramstyle`` and ``integrity_error`` are the driver's
    unless given (``sqlite3``: ``qmark``; ``psycopg``: ``pyformat``). Write ``apply``'s own SQL in the
    driver's paramstyle.

    Example::

        class Credits(TransactionalListener):
            def apply(self, message, cursor):
                order = json.loads(message.body)
                cursor.execute("INSERT INTO credits (order_id, points) VALUES (%s, %s)", (order["id"], 10))

        listener = Credits(lambda: psycopg.connect(dsn), group="credits")
        with TopicConsumer("credits", ["ORDER_TOPIC"], listener, config):
            ...
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls.apply is TransactionalListener.apply:
            raise IncompleteListenerError(f"{cls.__name__} must implement apply")
        return super().__new__(cls)

    def __init__(self, connect: Callable[[], Any], group: str, *, table: str = "txcoord_consumed",
                 paramstyle: Optional[str] = None, integrity_error: Optional[type] = None):
        if not _IDENTIFIER.match(table):
            raise InvalidArgumentError(f"table must be an SQL identifier (letters, digits, _), got {table!r}")
        if paramstyle is not None and paramstyle not in _PLACEHOLDERS:
            raise InvalidArgumentError(f"paramstyle must be one of {sorted(_PLACEHOLDERS)}, got {paramstyle!r}")
        self.connect, self.group, self.table = connect, group, table
        self.paramstyle, self.integrity_error = paramstyle, integrity_error
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[Any] = []
        self._created = False

    def apply(self, message: ConsumedMessage, cursor: Any) -> None:
        """Apply ``message``'s effect with ``cursor``, inside the transaction that records it; do not commit.

        Example::

            def apply(self, message, cursor):
                cursor.execute("UPDATE accounts SET points = points + ? WHERE id = ?", (10, message.keys))
        """
        raise NotImplementedError

    def consume(self, message: ConsumedMessage) -> ConsumeResult:
        """Record ``message`` and apply it in one transaction, or skip it if recorded already; ``SUCCESS``
        either way (an error raised by ``apply`` or the database fails the message, nothing applied).

        Example::

            listener.consume(message)   # ConsumeResult.SUCCESS; again: SUCCESS, nothing applied twice
        """
        connection = self._connection()
        try:
            cursor = connection.cursor()
            try:
                if not self._record(cursor, message):
                    connection.rollback()
                    _log.info("message %s of %s was applied for group %s already: skipped", message.msg_id,
                              message.topic, self.group)
                    return ConsumeResult.SUCCESS
                self.apply(message, cursor)
            finally:
                cursor.close()
            connection.commit()
        except BaseException:
            self._roll_back(connection)
            raise
        return ConsumeResult.SUCCESS

    def applied(self, msg_id: str) -> bool:
        """Whether the message ``msg_id`` is recorded as applied for this group.

        Example::

            listener.applied(message.msg_id)   # True once consume() committed it
        """
        connection = self._connection()
        cursor = connection.cursor()
        try:
            cursor.execute(*self._sql(f"SELECT 1 FROM {self.table} WHERE consumer_group = {{}} AND msg_id = {{}}",
                                      {"consumer_group": self.group, "msg_id": msg_id}))
            return cursor.fetchone() is not None
        finally:
            cursor.close()
            connection.rollback()

    def close(self) -> None:
        """Close the connections this listener opened (after its consumer is closed).

        Example::

            consumer.close(); listener.close()
        """
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - sqlite3 refuses another thread's connection; the GC closes it
                pass

    def _connection(self) -> Any:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            return connection
        connection = self.connect()
        if getattr(connection, "autocommit", False) is True or (
                type(connection).__module__ == "sqlite3" and connection.isolation_level is None):
            raise InvalidArgumentError("the connection is in autocommit mode: the record and the effect would "
                                       "not be one transaction")
        driver = None
        if self.paramstyle is None or self.integrity_error is None:
            driver = _driver(connection)
        self.paramstyle = self.paramstyle or driver.paramstyle
        self.integrity_error = self.integrity_error or driver.IntegrityError
        with self._lock:
            if not self._created:
                self._create_table(connection)
                self._created = True
            self._connections.append(connection)
        self._local.connection = connection
        return connection

    def _create_table(self, connection: Any) -> None:
        cursor = connection.cursor()
        try:
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (consumer_group VARCHAR(255) NOT NULL, "
                           f"msg_id VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, topic_version BIGINT NOT NULL, "
                           f"queue_offset BIGINT NOT NULL, PRIMARY KEY (consumer_group, msg_id))")
            connection.commit()
        except BaseException:
            self._roll_back(connection)
            raise
        finally:
            cursor.close()

    def _record(self, cursor: Any, message: ConsumedMessage) -> bool:
        """Insert the message's record; False if it is there already (applied before)."""
        values = {"consumer_group": self.group, "msg_id": message.msg_id, "topic": message.topic,
                  "topic_version": message.topic_version, "queue_offset": message.queue_offset}
        marks = ", ".join("{}" for _ in _RECORD_COLUMNS)
        try:
            cursor.execute(*self._sql(f"INSERT INTO {self.table} ({', '.join(_RECORD_COLUMNS)}) VALUES ({marks})",
                                      values))
        except self.integrity_error:
            return False
        return True

    def _sql(self, template: str, values: dict) -> tuple[str, Any]:
        """``template`` with its ``{}`` marks as the driver's placeholders for ``values`` (in their order)."""
        placeholder, by_name = _PLACEHOLDERS[self.paramstyle]
        marks = [placeholder(name, n) for n, name in enumerate(values, start=1)]
        return template.format(*marks), (values if by_name else tuple(values.values()))

    def _roll_back(self, connection: Any) -> None:
        try:
            connection.rollback()
        except Exception:  # noqa: BLE001 - a broken connection: the next call opens another
            self._local.connection = None


def delta_app_id(group: str, msg_id: str) -> str:
    """The application id under which a :class:`DeltaTableListener` of ``group`` records message ``msg_id``.

    Example::

        delta_app_id("credits", "9f2c")   # 'txcoord-consumer.credits.9f2c'
    """
    return f"txcoord-consumer.{group}.{msg_id}"


class DeltaTableListener(MessageListener):
    """A listener whose effect, rows appended to the Delta table at ``table_uri``, is applied exactly once.

    Subclasses implement :meth:`rows`. ``consume`` skips a message whose application transaction
    (:func:`delta_app_id`: the group and the message id) the table's latest version holds; otherwise it appends
    the message's rows with that application transaction in the same commit (delta-rs's ``write_deltalake``
    with ``CommitProperties(app_transactions=...)``), creating the table at the first write. The commit is
    atomic: after a crash either the rows and the id are in the table or neither is. The check and the write
    share one snapshot: a delivery of the same message committing in between makes this commit conflict, and
    it then finds the id and appends nothing.

    Why one application id per message and not the share's position as the version: messages of one share
    finish out of order (other keys run at once, a failed one is retried after later ones succeeded, a dead
    letter is redriven long after), so a position already recorded says nothing of a lower one: skipping
    by position would lose messages. Each id costs a ``txn`` action in the table's log; the table property
    ``delta.setTransactionRetentionDuration`` lets checkpoints drop old ones (where the checkpointing writer
    honours it), and is then how long a duplicate is recognised.

    Example::

        class Ledger(DeltaTableListener):
            def rows(self, message):
                return pa.table({"order_id": [message.keys], "points": [10]})

        listener = Ledger("s3://bucket/ledger", group="credits", storage_options=options)
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls.rows is DeltaTableListener.rows:
            raise IncompleteListenerError(f"{cls.__name__} must implement rows")
        return super().__new__(cls)

    def __init__(self, table_uri: str, group: str, *, storage_options: Optional[dict] = None):
        self.table_uri, self.group, self.storage_options = table_uri, group, storage_options
        self._create_lock = threading.Lock()

    def rows(self, message: ConsumedMessage) -> pa.Table:
        """The rows ``message`` appends to the table (an Arrow table, or anything ``write_deltalake`` takes).

        Example::

            def rows(self, message):
                return pa.table({"msg_id": [message.msg_id], "body": [message.body]})
        """
        raise NotImplementedError

    def applied(self, msg_id: str) -> bool:
        """Whether the table records message ``msg_id`` as applied for this group.

        Example::

            listener.applied(message.msg_id)   # True once consume() committed it
        """
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(self.table_uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return False
        return table.transaction_version(delta_app_id(self.group, msg_id)) is not None

    def consume(self, message: ConsumedMessage) -> ConsumeResult:
        """Append ``message``'s rows with its application transaction, unless the table holds it already;
        ``SUCCESS`` either way.

        Example::

            listener.consume(message)   # ConsumeResult.SUCCESS; again: SUCCESS, no second row
        """
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        app_id = delta_app_id(self.group, message.msg_id)
        # The check and the write share one snapshot: a delivery committing the same id after it makes this
        # commit conflict (delta-rs compares the app ids of commits since the snapshot), never append twice.
        table = DeltaTable(self.table_uri, storage_options=self.storage_options) if self._exists() else None
        if table is not None and table.transaction_version(app_id) is not None:
            _log.info("message %s of %s was applied for group %s already: skipped", message.msg_id, message.topic,
                      self.group)
            return ConsumeResult.SUCCESS
        data = self.rows(message)
        properties = CommitProperties(app_transactions=[Transaction(app_id, 0)])
        # The table's first commit is made by one thread of this process: others would fail to create it.
        with self._create_lock if table is None else contextlib.nullcontext():
            try:
                if table is None:
                    write_deltalake(self.table_uri, data, mode="append", commit_properties=properties,
                                    storage_options=self.storage_options)
                else:
                    write_deltalake(table, data, mode="append", commit_properties=properties)
            except CommitFailedError:
                if not self.applied(message.msg_id):
                    raise  # another conflict than the same message committed by another delivery
        return ConsumeResult.SUCCESS

    def _exists(self) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.table_uri, storage_options=self.storage_options)
