"""A lakehouse: where each of its tables and files lives (:class:`Lakehouse`), creating its
system tables from their definitions in ``tables/``, and reading them.

Runs through delta-rs, so ``txcoord init`` and producers start no JVM. Each table is
created with an explicit, minimal protocol that Spark and delta-rs both read and write.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Mapping, Optional, TypeVar, Union
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.schema import Field

from coordinator.exceptions import InvalidArgumentError, LakehouseNotFoundError, OutdatedLakehouseError
from coordinator.retries import RetryPolicy, retrying
from coordinator.storage import FileStore, denied_as_error, is_object_store
from coordinator.tables import COMMIT_LOG, GROUP_CHECK_REQUESTS, HALF, SYSTEM_TABLES, TableDef

__all__ = ["GROUPS_KEY", "LAYOUT_KEY", "LEASE_KEY", "Lakehouse", "OPERATORS_LOG_KEY", "PROGRESS_KEY", "SHARED_LOG_KEY", "STANDBYS_KEY",
           "create_group_tables", "create_table", "group_key", "group_of_key", "init_lakehouse", "listing_retried", "open_table", "read_table",
           "require_lakehouse", "table_dataset", "topic_names", "transaction_ids_in"]


#: The checker's lease (:mod:`coordinator.control.lease`), its progress record
#: (:mod:`coordinator.control.progress`) and the lakehouse's layout (:mod:`coordinator.commit_logs`):
#: keys under the lakehouse's root.
LEASE_KEY = "system/_checker_lease.json"
#: Where each checker standing by for the lease announces itself (``<owner>.json``), for operators to see.
STANDBYS_KEY = "system/_checker_standbys"
PROGRESS_KEY = "system/_checker_progress.json"
LAYOUT_KEY = "system/_layout.json"
#: Each producer group's own prefix: its commit log, its check requests and its instances' announcements.
GROUPS_KEY = "groups"
#: The operators' decisions (``txcoord resolve``): a commit log only operators may write.
OPERATORS_LOG_KEY = "operators/commit_log"
#: The one commit log every group shared before each had its own (:mod:`coordinator.commit_logs`).
SHARED_LOG_KEY = "system/commit_log"


def group_key(group: str) -> str:
    """The directory name of ``group`` under ``groups/``.

    A group name may hold any character (``/`` and ``..`` too): quoted, it stays one directory.

    Example::

        group_key("order_group")   # 'order_group'
        group_key("a/b")           # 'a%2Fb'
    """
    return quote(group, safe="").replace(".", "%2E")


def group_of_key(name: str) -> str:
    """The group whose directory under ``groups/`` is ``name``: :func:`group_key` undone."""
    return unquote(name)


class Lakehouse:
    """The locations of one lakehouse: its tables, topics, and the checker's files. Every path
    under a lakehouse is built here.

    ``root`` is a local directory or an object-storage location (``s3://bucket/prefix``);
    ``storage`` holds the settings to reach it (the coordinator TOML's ``[storage]`` table,
    ``object_store``'s keys; ``AWS_*`` environment variables fill in the rest).

    Example::

        lakehouse = Lakehouse("/data/lakehouse")
        lakehouse.path(HALF)             # '/data/lakehouse/system/half'
        lakehouse.path("topics/ORDER")   # '/data/lakehouse/topics/ORDER'
        lakehouse.topic("ORDER")         # '/data/lakehouse/topics/ORDER'
        lakehouse.commit_log("order_group")  # '/data/lakehouse/groups/order_group/commit_log'
        lakehouse.operators_log          # '/data/lakehouse/operators/commit_log'
        lakehouse.lease_file             # '/data/lakehouse/system/_checker_lease.json'
        Lakehouse("s3://bucket/lh").path(HALF)  # 's3://bucket/lh/system/half'
    """

    def __init__(self, root: Union[str, os.PathLike], storage: Optional[Mapping[str, str]] = None):
        root = os.fspath(root)
        self.root = root.rstrip("/") if is_object_store(root) else os.path.abspath(root)
        self.storage = dict(storage or {})
        self._files: Optional[FileStore] = None

    @classmethod
    def of(cls, config) -> "Lakehouse":
        """The lakehouse a :class:`~coordinator.config.CoordinatorConfig` names, with its storage settings."""
        return cls(config.lakehouse, config.storage)

    @classmethod
    def at(cls, lakehouse: Union[str, os.PathLike, "Lakehouse"]) -> "Lakehouse":
        """``lakehouse`` itself if it is one, else the lakehouse at that location (settings from the environment)."""
        return lakehouse if isinstance(lakehouse, Lakehouse) else cls(lakehouse)

    def __repr__(self) -> str:
        return f"Lakehouse({self.root!r})"

    @property
    def is_local(self) -> bool:
        """Whether the lakehouse is a local directory (not object storage)."""
        return not is_object_store(self.root)

    @property
    def files(self) -> FileStore:
        """Its small files (lease, progress, producer instances), written conditionally."""
        if self._files is None:
            self._files = FileStore.at(self.root, self.storage)
        return self._files

    def path(self, table: Union[TableDef, str]) -> str:
        """The directory of ``table``: a definition from ``tables/``, or a name like ``system/half``.
        A table each group has (its commit log, its check requests) is at :meth:`commit_log` or
        :meth:`check_requests` instead."""
        name = table.name if isinstance(table, TableDef) else table
        if "<" in name:
            raise InvalidArgumentError(f"{name} is one table per producer group: ask for a group's "
                                       "(Lakehouse.commit_log, Lakehouse.check_requests)")
        return self._join(*name.split("/"))

    def topic(self, topic: str) -> str:
        """The table of ``topic``.

        The topic must already be valid (:func:`coordinator.validation.validate_topic`): a valid
        name holds no path separator and no dot, so it cannot leave ``topics/``.
        """
        return self._join("topics", topic)

    def group_dir(self, group: str) -> str:
        """The key (relative to the root) of everything ``group`` owns: ``groups/<group>``."""
        return f"{GROUPS_KEY}/{group_key(group)}"

    def commit_log(self, group: str) -> str:
        """The commit log ``group`` writes and only it may write (see :mod:`coordinator.commit_logs`)."""
        return self._join(*self.group_dir(group).split("/"), "commit_log")

    def check_requests(self, group: str) -> str:
        """The check requests the checker sends ``group``: only that group reads them (they carry bodies)."""
        return self._join(*self.group_dir(group).split("/"), "check_requests")

    @property
    def operators_log(self) -> str:
        """The commit log of operators' decisions: only operators may write it."""
        return self._join(*OPERATORS_LOG_KEY.split("/"))

    def key_path(self, key: str) -> str:
        """The location of ``key``, a path relative to the root (``groups/g/commit_log``)."""
        return self._join(*key.split("/"))

    @property
    def lease_file(self) -> str:
        """The checker's lease (:mod:`coordinator.control.lease`)."""
        return self._join(*LEASE_KEY.split("/"))

    @property
    def progress_file(self) -> str:
        """The checker's progress record (:mod:`coordinator.control.progress`)."""
        return self._join(*PROGRESS_KEY.split("/"))

    @property
    def checker_checkpoint(self) -> str:
        """The checker's streaming checkpoint: inside the lakehouse it serves."""
        return self._join("system", "_checkpoints", "checker")

    def service_checkpoint(self, service: str) -> str:
        """The streaming checkpoint of a consuming service's query (the demo's ``credits``)."""
        return self._join("services", "_checkpoints", service)

    def table(self, table: Union[TableDef, str], version: Optional[int] = None) -> DeltaTable:
        """The Delta table ``table`` (see :meth:`path`), opened with this lakehouse's storage settings."""
        return open_table(self.path(table), version=version, storage=self.storage)

    def exists(self, table: Union[TableDef, str]) -> bool:
        """Whether ``table`` (see :meth:`path`) is a Delta table yet."""
        path = self.path(table)
        with denied_as_error(path):
            return DeltaTable.is_deltatable(path, storage_options=self.storage or None)

    def read(self, table: Union[TableDef, str], columns: Optional[list[str]] = None,
             filter: Optional[pc.Expression] = None, files: Optional[str] = None) -> pa.Table:
        """``columns`` of the rows of ``table`` (see :meth:`path`) that match ``filter``, from the
        files whose statistics may match ``files`` (if given): :func:`read_table`.

        Example::

            Lakehouse("lakehouse").read(OP, ["transaction_id", "outcome"]).num_rows
        """
        return read_table(self.path(table), columns, filter, storage=self.storage, files=files)

    def _join(self, *parts: str) -> str:
        return "/".join((self.root, *parts)) if not self.is_local else os.path.join(self.root, *parts)


#: How often a table is opened again when its log listing caught a commit being written.
_LISTING_ATTEMPTS = 6
_T = TypeVar("_T")


def open_table(path: str, version: Optional[int] = None, storage: Optional[Mapping[str, str]] = None) -> DeltaTable:
    """The Delta table at ``path`` (at ``version``, or its latest).

    A directory listed while writers add commits to it may show a newer commit and miss the one
    before (a listing is not a snapshot); delta-rs then refuses the log as having a gap. The table
    is opened again, a few times, a moment later.

    Example::

        open_table(Lakehouse("lakehouse").commit_log("order_group")).version()
    """
    with denied_as_error(path):
        return listing_retried(lambda: DeltaTable(path, version=version, storage_options=dict(storage) if storage else None))


def listing_retried(action: Callable[[], _T]) -> _T:
    """``action``, a delta-rs call that lists a table's log, made again a few times, a moment apart, while
    the listing catches a commit being written (see :func:`open_table`).

    Example::

        listing_retried(lambda: open_table(path).cleanup_metadata())
    """
    attempts = 0
    while True:
        try:
            return action()
        except DeltaError as error:
            attempts += 1
            if "Expected contiguous commit files" not in str(error) or attempts == _LISTING_ATTEMPTS:
                raise
            time.sleep(0.01 * 2 ** attempts)


def create_table(table: TableDef, path: str, storage: Optional[Mapping[str, str]] = None) -> bool:
    """Create ``table`` at ``path`` unless it exists; return whether it was created.

    A table created by an earlier version of the coordinator gains the columns its definition
    has added since (every column is nullable: its older rows read null). Safe to call from
    several processes at once: a lost creation race is not an error.

    Example::

        create_table(HALF, Lakehouse("lakehouse").path(HALF))  # True the first time, then False
    """
    options = dict(storage) if storage else None

    def attempt() -> bool:
        if DeltaTable.is_deltatable(path, storage_options=options):
            _add_missing_columns(table, path, storage)
            return False
        if not is_object_store(path):
            os.makedirs(path, exist_ok=True)
        try:
            DeltaTable.create(path, schema=table.arrow_schema(), mode="error", configuration=table.properties or None,
                              storage_options=options)
        except DeltaError:
            if DeltaTable.is_deltatable(path, storage_options=options):
                return False
            raise
        return True

    # A creation whose reply was lost is found made by the next attempt, and taken as a lost race.
    with denied_as_error(path):
        return retrying(RetryPolicy.of(storage or {}), "create table", path, attempt, conditional_write=True)


def _add_missing_columns(table: TableDef, path: str, storage: Optional[Mapping[str, str]]) -> None:
    existing = open_table(path, storage=storage)
    present = set(existing.schema().to_arrow().names)
    missing = [Field.from_arrow(field) for field in table.arrow_schema() if field.name not in present]
    if not missing:
        return
    try:
        existing.alter.add_columns(missing)
    except DeltaError:
        if not {f.name for f in missing} <= set(open_table(path, storage=storage).schema().to_arrow().names):
            raise  # not a race with another process adding the same columns


def init_lakehouse(lakehouse: Union[str, Lakehouse]) -> list[str]:
    """Create every missing system table under ``lakehouse``, and the operators' commit log; return
    the names created.

    Idempotent: a second call creates nothing.

    Example::

        init_lakehouse("lakehouse")  # ['system/half', ..., 'operators/commit_log']
    """
    lakehouse = Lakehouse.at(lakehouse)
    created = [table.name for table in SYSTEM_TABLES if create_table(table, lakehouse.path(table), lakehouse.storage)]
    if create_table(COMMIT_LOG, lakehouse.operators_log, lakehouse.storage):
        created.append(OPERATORS_LOG_KEY)
    return created


def create_group_tables(lakehouse: Union[str, Lakehouse], group: str) -> list[str]:
    """Create ``group``'s commit log and check-request table under ``lakehouse`` if missing; return
    the paths created.

    Example::

        create_group_tables("lakehouse", "order_group")  # [.../groups/order_group/commit_log, ...]
    """
    lakehouse = Lakehouse.at(lakehouse)
    wanted = ((COMMIT_LOG, lakehouse.commit_log(group)), (GROUP_CHECK_REQUESTS, lakehouse.check_requests(group)))
    return [path for table, path in wanted if create_table(table, path, lakehouse.storage)]


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
    # without an active exception" (exit 134; deltalake 1.6.6, cf. delta-rs#2184).
    dataset = table_dataset(path, storage, files)[1]
    missing = [name for name in columns or () if name not in dataset.schema.names]
    if missing:
        raise OutdatedLakehouseError(f"{path} has no column {', '.join(missing)}: an older txcoord made it; "
                                     "`txcoord init` (or starting the checker) adds it")
    with denied_as_error(path):
        return dataset.to_table(columns=columns, filter=filter)


def table_dataset(path: str, storage: Optional[Mapping[str, str]] = None,
                  files: Optional[str] = None) -> tuple[DeltaTable, ds.Dataset]:
    """The Delta table at ``path`` and its current snapshot as a pyarrow dataset, whose fragments
    carry each file's statistics (a filter leaves out the files it cannot match); only the files
    whose statistics may satisfy the SQL predicate ``files``, if given (see :func:`read_table`).

    Example::

        table, dataset = table_dataset(Lakehouse("lh").path(HALF))
    """
    table = open_table(path, storage=storage)
    filesystem = None if is_object_store(path) else pafs.SubTreeFileSystem(os.path.abspath(path), pafs.LocalFileSystem())
    with denied_as_error(path):
        return table, table.to_pyarrow_dataset(filesystem=filesystem, file_pruning_predicate=files)


def transaction_ids_in(transaction_ids: Iterable[str]) -> pc.Expression:
    """A filter for the rows of ``transaction_ids`` (at least one). Their range comes first: ids are
    time-ordered, so the files' statistics leave out every file of other times.

    Example::

        Lakehouse("lakehouse").read(OP, ["outcome"], transaction_ids_in(["01a2…", "01a3…"]))
    """
    ids = sorted(set(transaction_ids))
    field = pc.field("transaction_id")
    return (field >= ids[0]) & (field <= ids[-1]) & field.isin(ids)


def require_lakehouse(lakehouse: Union[str, Lakehouse]) -> Lakehouse:
    """The lakehouse at ``lakehouse`` if it holds the checker's tables; else raise :class:`LakehouseNotFoundError`.

    Example::

        require_lakehouse("lakehouse")  # Lakehouse('/…/lakehouse')
    """
    lakehouse = Lakehouse.at(lakehouse)
    if not lakehouse.exists(HALF):
        raise LakehouseNotFoundError(f"no lakehouse at {lakehouse.root} (run `txcoord init` to create one)")
    return lakehouse


def topic_names(lakehouse: Union[str, Lakehouse]) -> list[str]:
    """The topics that have a table in ``lakehouse`` (one appears on its first delivery), sorted.

    Example::

        topic_names("demo-lakehouse")  # ['ORDER_TOPIC']
    """
    lakehouse = Lakehouse.at(lakehouse)
    return [name for name in lakehouse.files.directories("topics") if lakehouse.exists(f"topics/{name}")]
