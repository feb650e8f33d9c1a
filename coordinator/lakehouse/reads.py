"""Reading a Delta table's current snapshot as Arrow, leaving out the files its statistics rule out."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable, Mapping, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from deltalake import DeltaTable, QueryBuilder

from coordinator.exceptions import OutdatedLakehouseError
from coordinator.lakehouse.delta import open_table
from coordinator.storage import denied_as_error, is_object_store

if TYPE_CHECKING:  # importing pyarrow.dataset imports pandas: a second of every checker worker's start
    import pyarrow.dataset as ds

__all__ = ["query_snapshot", "read_table", "table_dataset", "transaction_ids_in"]


def read_table(path: str, columns: Optional[list[str]] = None, filter: Optional[pc.Expression] = None,
               storage: Optional[Mapping[str, str]] = None, files: Optional[str] = None) -> pa.Table:
    """The current snapshot of the Delta table at ``path``: ``columns`` and rows matching ``filter``, if given.

    ``files`` is a SQL predicate on columns (``"queue_offset >= 42"``): only the files whose
    statistics may satisfy it are looked at, chosen by delta-rs from the log before any dataset is
    built. A ``filter`` alone also leaves unmatched files unread, but only after a fragment with its
    statistics has been built for every file of the table, which costs about half a millisecond a
    file: for a range of a table with thousands of files, give both.

    Example::

        read_table(Lakehouse("lh").path(OP), ["transaction_id", "outcome"]).num_rows
        read_table(Lakehouse("lh").path(HALF), filter=pc.field("queue_offset") >= 42, files="queue_offset >= 42")
    """
    # Files are read through pyarrow's own filesystem, not delta-rs's default handler: with that one,
    # a process that has read Spark-written tables often aborts at exit with "terminate called
    # without an active exception" (exit 134; deltalake 1.6.6, cf. delta-rs#2184). On object storage
    # that handler is still used: a process that must exit cleanly right after reads query_snapshot.
    dataset = table_dataset(path, storage, files, columns)[1]
    with denied_as_error(path):
        return dataset.to_table(columns=columns, filter=filter)


def query_snapshot(table: DeltaTable, schema: pa.Schema, where: Optional[str] = None) -> pa.Table:
    """The rows of ``table``'s snapshot that match the SQL predicate ``where`` (every row without one), in
    ``schema`` (its columns, in its order), read by delta-rs's own engine.

    Unlike :func:`read_table` on object storage, no pyarrow thread is handed a buffer Python owns: a
    pyarrow scan through delta-rs's Python filesystem handler goes on releasing such buffers on pyarrow's
    threads after it returned, and one released while the interpreter exits takes the GIL and aborts
    the process (``terminate called without an active exception``, exit 134).

    Example::

        query_snapshot(open_table(path), GROUP_CHECK_REQUESTS.arrow_schema(), "requested_at >= '2026-11-28T10:00Z'")
    """
    sql = f"SELECT * FROM snapshot WHERE {where}" if where else "SELECT * FROM snapshot"
    with denied_as_error(table.table_uri):
        rows = pa.table(QueryBuilder().register("snapshot", table).execute(sql))
    # delta-rs hands out view types, which arrow compute cannot compare with plain strings.
    return rows.select(schema.names).cast(schema)


def table_dataset(path: str, storage: Optional[Mapping[str, str]] = None, files: Optional[str] = None,
                  columns: Optional[Iterable[str]] = None) -> tuple[DeltaTable, ds.Dataset]:
    """The Delta table at ``path`` and its current snapshot as a pyarrow dataset, whose fragments
    carry each file's statistics (a filter leaves out the files it cannot match); only the files
    whose statistics may satisfy the SQL predicate ``files``, if given (see :func:`read_table`).

    Raises :class:`~coordinator.exceptions.OutdatedLakehouseError` if the table lacks any of
    ``columns`` (the ones the caller will read).

    Example::

        table, dataset = table_dataset(Lakehouse("lh").path(HALF))
    """
    table = open_table(path, storage=storage)
    filesystem = None if is_object_store(path) else pafs.SubTreeFileSystem(os.path.abspath(path), pafs.LocalFileSystem())
    with denied_as_error(path):
        dataset = table.to_pyarrow_dataset(filesystem=filesystem, file_pruning_predicate=files)
    missing = [name for name in columns or () if name not in dataset.schema.names]
    if missing:
        raise OutdatedLakehouseError(f"{path} has no column {', '.join(missing)}: an older txcoord made it; "
                                     "`txcoord init` (or starting the checker) adds it")
    return table, dataset


def transaction_ids_in(transaction_ids: Iterable[str]) -> pc.Expression:
    """A filter for the rows of ``transaction_ids`` (at least one). Their range comes first: ids are
    time-ordered, so the files' statistics leave out every file of other times.

    Example::

        Lakehouse("lakehouse").read(OP, ["outcome"], transaction_ids_in(["01a2…", "01a3…"]))
    """
    ids = sorted(set(transaction_ids))
    field = pc.field("transaction_id")
    return (field >= ids[0]) & (field <= ids[-1]) & field.isin(ids)
