"""A lakehouse: where each of its tables and files lives (:class:`Lakehouse`), creating its
system tables from their definitions in ``tables/``, and reading them.

Runs through delta-rs, so ``txcoord init`` and producers start no JVM. Each table is
created with an explicit, minimal protocol that Spark and delta-rs both read and write.
"""

from __future__ import annotations

import os
from typing import Optional, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.schema import Field

from coordinator.exceptions import LakehouseNotFoundError, OutdatedLakehouseError
from coordinator.tables import COMMIT_LOG, HALF, OP, SYSTEM_TABLES, TableDef


class Lakehouse:
    """The locations of one lakehouse: its tables, topics, and the checker's files. Every path
    under a lakehouse is built here.

    Example::

        lakehouse = Lakehouse("/data/lakehouse")
        lakehouse.path(HALF)             # '/data/lakehouse/system/half'
        lakehouse.path("topics/ORDER")   # '/data/lakehouse/topics/ORDER'
        lakehouse.topic("ORDER")         # '/data/lakehouse/topics/ORDER'
        lakehouse.lease_file             # '/data/lakehouse/system/_checker_lease.json'
    """

    def __init__(self, root: Union[str, os.PathLike]):
        self.root = os.path.abspath(os.fspath(root))

    def __repr__(self) -> str:
        return f"Lakehouse({self.root!r})"

    def path(self, table: Union[TableDef, str]) -> str:
        """The directory of ``table``: a definition from ``tables/``, or a name like ``system/half``."""
        name = table.name if isinstance(table, TableDef) else table
        return os.path.join(self.root, *name.split("/"))

    def topic(self, topic: str) -> str:
        """The table of ``topic``.

        The topic must already be valid (:func:`coordinator.protocol.validate_topic`): a valid
        name holds no path separator and no dot, so it cannot leave ``topics/``.
        """
        return os.path.join(self.topics_dir, topic)

    @property
    def topics_dir(self) -> str:
        """The directory that holds one table per topic."""
        return os.path.join(self.root, "topics")

    @property
    def lease_file(self) -> str:
        """The checker's lease (:mod:`coordinator.control.lease`)."""
        return os.path.join(self.root, "system", "_checker_lease.json")

    @property
    def progress_file(self) -> str:
        """The checker's progress record (:mod:`coordinator.control.progress`)."""
        return os.path.join(self.root, "system", "_checker_progress.json")

    @property
    def producers_dir(self) -> str:
        """Where producer instances announce themselves (:mod:`coordinator.control.instances`)."""
        return os.path.join(self.root, "system", "_producers")

    @property
    def checker_checkpoint(self) -> str:
        """The checker's streaming checkpoint: inside the lakehouse it serves."""
        return os.path.join(self.root, "system", "_checkpoints", "checker")

    def service_checkpoint(self, service: str) -> str:
        """The streaming checkpoint of a consuming service's query (the demo's ``credits``)."""
        return os.path.join(self.root, "services", "_checkpoints", service)


def create_table(table: TableDef, path: str) -> bool:
    """Create ``table`` at ``path`` unless it exists; return whether it was created.

    A table created by an earlier version of the coordinator gains the columns its definition
    has added since (every column is nullable: its older rows read null). Safe to call from
    several processes at once: a lost creation race is not an error.

    Example::

        create_table(HALF, Lakehouse("lakehouse").path(HALF))  # True the first time, then False
    """
    if DeltaTable.is_deltatable(path):
        _add_missing_columns(table, path)
        return False
    os.makedirs(path, exist_ok=True)
    try:
        DeltaTable.create(path, schema=table.arrow_schema(), mode="error", configuration=table.properties or None)
    except DeltaError:
        if DeltaTable.is_deltatable(path):
            return False
        raise
    return True


def _add_missing_columns(table: TableDef, path: str) -> None:
    existing = DeltaTable(path)
    present = set(existing.schema().to_arrow().names)
    missing = [Field.from_arrow(field) for field in table.arrow_schema() if field.name not in present]
    if not missing:
        return
    try:
        existing.alter.add_columns(missing)
    except DeltaError:
        if not {f.name for f in missing} <= set(DeltaTable(path).schema().to_arrow().names):
            raise  # not a race with another process adding the same columns


def init_lakehouse(lakehouse: str) -> list[str]:
    """Create every missing system table under ``lakehouse``; return the names created.

    Idempotent: a second call creates nothing.

    Example::

        init_lakehouse("lakehouse")  # ['system/commit_log', 'system/half', ...]
    """
    return [table.name for table in SYSTEM_TABLES if create_table(table, Lakehouse(lakehouse).path(table))]


def read_table(path: str, columns: Optional[list[str]] = None, filter: Optional[pc.Expression] = None) -> pa.Table:
    """The current snapshot of the local Delta table at ``path``: ``columns`` and rows matching ``filter``, if given.

    Example::

        read_table(Lakehouse("lh").path(OP), ["transaction_id", "outcome"]).num_rows
    """
    # Files are read through pyarrow's own filesystem, not delta-rs's default handler: with that one,
    # a process that has read Spark-written tables often aborts at exit with "terminate called
    # without an active exception" (exit 134; deltalake 1.6.6, cf. delta-rs#2184).
    local = pafs.SubTreeFileSystem(os.path.abspath(path), pafs.LocalFileSystem())
    dataset = DeltaTable(path).to_pyarrow_dataset(filesystem=local)
    missing = [name for name in columns or () if name not in dataset.schema.names]
    if missing:
        raise OutdatedLakehouseError(f"{path} has no column {', '.join(missing)}: an older txcoord made it; "
                                     "`txcoord init` (or starting the checker) adds it")
    return dataset.to_table(columns=columns, filter=filter)


def read_pending(lakehouse: str, columns: Optional[list[str]] = None) -> pa.Table:
    """The halves of ``lakehouse`` that have no op row yet (unresolved), with ``columns`` of ``system/half``.

    Reads both queues in full with delta-rs: meant for operators (``txcoord status``), not for a batch.

    Example::

        read_pending("lakehouse", ["transaction_id", "stored_timestamp"]).num_rows
    """
    columns = columns or HALF.column_names
    halves = read_table(Lakehouse(lakehouse).path(HALF), list(dict.fromkeys(columns + ["queue_offset"])))
    resolved = read_table(Lakehouse(lakehouse).path(OP), ["half_offset"]).column("half_offset")
    return halves.filter(pc.invert(pc.is_in(halves.column("queue_offset"), value_set=resolved))).select(columns)


def require_lakehouse(lakehouse: str) -> str:
    """``lakehouse`` itself if it holds a commit log; else raise :class:`LakehouseNotFoundError`.

    Example::

        require_lakehouse("lakehouse")  # 'lakehouse'
    """
    if not DeltaTable.is_deltatable(Lakehouse(lakehouse).path(COMMIT_LOG)):
        raise LakehouseNotFoundError(f"no lakehouse at {Lakehouse(lakehouse).root} (run `txcoord init` to create one)")
    return lakehouse


def topic_names(lakehouse: str) -> list[str]:
    """The topics that have a table in ``lakehouse`` (one appears on its first delivery), sorted.

    Example::

        topic_names("demo-lakehouse")  # ['ORDER_TOPIC']
    """
    where = Lakehouse(lakehouse)
    names = sorted(os.listdir(where.topics_dir)) if os.path.isdir(where.topics_dir) else []
    return [name for name in names if DeltaTable.is_deltatable(where.topic(name))]
