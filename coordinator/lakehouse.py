"""Creating the lakehouse: every system table, once, from its definition in ``tables/``.

Runs through delta-rs, so ``python -m coordinator init`` and producers start no JVM.
Each table is created with an explicit, minimal protocol that Spark and delta-rs
both read and write.
"""

from __future__ import annotations

import os
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from coordinator.exceptions import CoordinatorError
from coordinator.tables import COMMIT_LOG, HALF, OP, SYSTEM_TABLES, TableDef


class LakehouseNotFoundError(CoordinatorError):
    """The directory holds no lakehouse (``txcoord init`` creates one)."""


def create_table(table: TableDef, path: str) -> bool:
    """Create ``table`` at ``path`` unless it exists; return whether it was created.

    Safe to call from several processes at once: a lost creation race is not an error.

    Example::

        create_table(HALF, HALF.path("lakehouse"))  # True the first time, then False
    """
    if DeltaTable.is_deltatable(path):
        return False
    os.makedirs(path, exist_ok=True)
    try:
        DeltaTable.create(path, schema=table.arrow_schema(), mode="error", configuration=table.properties or None)
    except DeltaError:
        if DeltaTable.is_deltatable(path):
            return False
        raise
    return True


def init_lakehouse(lakehouse: str) -> list[str]:
    """Create every missing system table under ``lakehouse``; return the names created.

    Idempotent: a second call creates nothing.

    Example::

        init_lakehouse("lakehouse")  # ['system/commit_log', 'system/half', ...]
    """
    return [table.name for table in SYSTEM_TABLES if create_table(table, table.path(lakehouse))]


def read_table(path: str, columns: Optional[list[str]] = None, filter: Optional[pc.Expression] = None) -> pa.Table:
    """The current snapshot of the local Delta table at ``path``: ``columns`` and rows matching ``filter``, if given.

    Example::

        read_table(OP.path("lh"), ["transaction_id", "outcome"]).num_rows
    """
    # Files are read through pyarrow's own filesystem, not delta-rs's default handler: with that one,
    # a process that has read Spark-written tables often aborts at exit with "terminate called
    # without an active exception" (exit 134; deltalake 1.6.6, cf. delta-rs#2184).
    local = pafs.SubTreeFileSystem(os.path.abspath(path), pafs.LocalFileSystem())
    return DeltaTable(path).to_pyarrow_dataset(filesystem=local).to_table(columns=columns, filter=filter)


def read_pending(lakehouse: str, columns: Optional[list[str]] = None) -> pa.Table:
    """The halves of ``lakehouse`` that have no op row yet (unresolved), with ``columns`` of ``system/half``.

    Reads both queues in full with delta-rs: meant for operators (``txcoord status``), not for a batch.

    Example::

        read_pending("lakehouse", ["transaction_id", "stored_timestamp"]).num_rows
    """
    columns = columns or HALF.column_names
    halves = read_table(HALF.path(lakehouse), list(dict.fromkeys(columns + ["queue_offset"])))
    resolved = read_table(OP.path(lakehouse), ["half_offset"]).column("half_offset")
    return halves.filter(pc.invert(pc.is_in(halves.column("queue_offset"), value_set=resolved))).select(columns)


def require_lakehouse(lakehouse: str) -> str:
    """``lakehouse`` itself if it holds a commit log; else raise :class:`LakehouseNotFoundError`.

    Example::

        require_lakehouse("lakehouse")  # 'lakehouse'
    """
    if not DeltaTable.is_deltatable(COMMIT_LOG.path(lakehouse)):
        raise LakehouseNotFoundError(f"no lakehouse at {os.path.abspath(lakehouse)} (run `txcoord init` to create one)")
    return lakehouse


def topic_names(lakehouse: str) -> list[str]:
    """The topics that have a table in ``lakehouse`` (one appears on its first delivery), sorted.

    Example::

        topic_names("demo-lakehouse")  # ['ORDER_TOPIC']
    """
    root = os.path.join(os.path.abspath(lakehouse), "topics")
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    return [name for name in names if DeltaTable.is_deltatable(os.path.join(root, name))]
