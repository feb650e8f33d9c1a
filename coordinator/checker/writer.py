"""The checker's writes: one idempotent append per table per batch, from the driver.

Each append carries the Delta application transaction ``(app_id, batch_id)``, as Spark's
``txnAppId``/``txnVersion`` would, and is committed by a
:class:`~coordinator.appender.DeltaAppender` kept open per table. Only the lease holder
writes these tables, so which batch each table last received is read from the table once
(the first write after a start or a rebuild) and then kept. A replayed batch finds its
earlier writes recorded and skips them. Appends to different tables may run at once
(:meth:`TableWriter.submit`): on object storage each costs a few round trips in sequence.

An append costs a few milliseconds where a Spark append costs a job and, for an idempotent
one, a rebuild of the table's state (delta-spark 4.4).

Example::

    writer = TableWriter(app_id="txcoord-checker")
    writer.append(Lakehouse("lakehouse").path(OP), ops, batch_id=12)   # the version written, or None on a replay
    writer.close()
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Mapping, Optional

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from coordinator.appender import DeltaAppender
from coordinator.lakehouse import create_table, created_unless_exists, delta_log_file, open_table
from coordinator.lakehouse.deltalog import commit_actions
from coordinator.storage import FileStore
from coordinator.tables import TableDef


#: Appends a writer runs at once (:meth:`TableWriter.submit`): a batch writes about ten tables.
CONCURRENT_APPENDS = 8


class TableWriter:
    """Idempotent appends to the checker's tables (see the module's docstring)."""

    def __init__(self, app_id: str, storage: Optional[Mapping[str, str]] = None):
        self.app_id = app_id
        self.storage = dict(storage or {})
        self._appenders: dict[str, DeltaAppender] = {}
        self._threads: Optional[ThreadPoolExecutor] = None

    def submit(self, path: str, data: pa.Table, batch_id: int, create_as: Optional[TableDef] = None,
               created_with: Optional[TableDef] = None) -> Future:
        """Start :meth:`append` in the writer's threads; the future holds what it returns or raises. Appends
        to different tables run at once; one table takes one append at a time (never two at once).

        Example::

            landed = all_done([writer.submit(lakehouse.path(HALF), halves, 12), writer.submit(lakehouse.path(REJECTED), refused, 12)])
        """
        if self._threads is None:
            self._threads = ThreadPoolExecutor(CONCURRENT_APPENDS, thread_name_prefix="table-writer")
        return self._threads.submit(self.append, path, data, batch_id, create_as=create_as, created_with=created_with)

    def append(self, path: str, data: pa.Table, batch_id: int, create_as: Optional[TableDef] = None,
               created_with: Optional[TableDef] = None) -> Optional[int]:
        """Append ``data`` to the table at ``path`` as batch ``batch_id``'s write; return the
        version written, or ``None`` if this batch's write is there already. A table that does
        not exist yet is created: as ``create_as`` says, if given (a group's check requests, whose
        readers need its change feed), else by this append, with ``data``'s schema and the properties of
        ``created_with`` (a topic's, before its first delivery).
        """
        appender = self._appenders.get(path)
        if appender is None:
            if create_as is not None:
                create_table(create_as, path, self.storage)
            created = self._created_by(path, data, batch_id, created_with.properties if created_with else {})
            appender = self._appenders[path] = DeltaAppender(
                path, storage=self.storage, by_slot=created_with is not None and created_with.by_slot)
            if created:
                return 0
        return appender.append(data, app_transaction=(self.app_id, batch_id))

    def recorded(self, path: str) -> int:
        """The newest batch of this writer's application that the table at ``path`` records, read from the
        table as it is now (-1: none, or no table yet)."""
        if not DeltaTable.is_deltatable(path, storage_options=self.storage or None):
            return -1
        recorded = open_table(path, storage=self.storage).transaction_version(self.app_id)
        return -1 if recorded is None else recorded

    def forget(self, path: str) -> None:
        """Drop what is kept of the table at ``path`` (after a failed append): the next use reads it afresh."""
        appender = self._appenders.pop(path, None)
        if appender is not None:
            appender.close()

    def _created_by(self, path: str, data: pa.Table, batch_id: int, properties: Mapping[str, str]) -> bool:
        """Create the table at ``path`` by writing ``data`` as its version 0, so that time travel to it
        shows rows, unless it exists; whether this call created it. Tried again as a table's creation is
        (a storage fault here failed the whole checker): an attempt whose reply was lost finds the table
        made, and the append that follows finds this batch's transaction in it and writes nothing."""
        return created_unless_exists(path, self.storage, lambda: write_deltalake(
            path, data, mode="append", storage_options=self.storage or None, configuration=dict(properties) or None,
            commit_properties=CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)])))

    def close(self) -> None:
        """Finish the appends and the appenders' checkpoints in progress, and stop them."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        for appender in self._appenders.values():
            appender.close()
        self._appenders.clear()


def all_done(appends: list[Future]) -> list[Optional[int]]:
    """What each of ``appends`` (:meth:`TableWriter.submit`'s) returned, once every one has finished; the first
    failure, in their order, raised then. Waiting for all before raising: a batch that fails must leave no
    append of its own in flight behind it (its retry would race it).

    Example::

        versions = all_done([writer.submit(path, data, 12) for path, data in appends])
    """
    wait(appends)
    return [append.result() for append in appends]


def files_written_at_us(path: str, version: int, storage: Optional[Mapping[str, str]] = None) -> int:
    """When the data files that version ``version`` of the table at ``path`` added were written
    (their ``modificationTime``, which Spark reads as ``_metadata.file_modification_time``)."""
    commit = FileStore.at(path, storage).read(delta_log_file(version))
    actions = commit_actions(commit.data)
    times = [action["add"]["modificationTime"] for action in actions if "add" in action]
    return max(times) * 1000
