"""Where each of a lakehouse's tables and files lives: :class:`Lakehouse`, and the keys of the
checker's small files under its root. Every path under a lakehouse is built here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping, Optional, Union
from urllib.parse import quote, unquote

from coordinator.exceptions import InvalidArgumentError, LakehouseNotFoundError
from coordinator.storage import FileStore, denied_as_error, is_object_store
from coordinator.tables import HALF, TableDef

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

__all__ = ["CONSUMERS_KEY", "GROUPS_KEY", "LAYOUT_KEY", "LEASE_KEY", "Lakehouse", "OPERATORS_LOG_KEY", "PROGRESS_KEY",
           "SHARED_LOG_KEY", "STANDBYS_KEY", "group_key", "group_of_key", "require_lakehouse", "topic_names"]


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
#: Each consumer group's own prefix (:mod:`coordinator.consumer`): its grant, instances, share claims,
#: progress, dead letters, and the operators' actions on it.
CONSUMERS_KEY = "consumers"
#: The operators' decisions (``txcoord resolve``): a commit log only operators may write.
OPERATORS_LOG_KEY = "operators/commit_log"
#: The one commit log every group shared before each had its own (:mod:`coordinator.commit_logs`).
SHARED_LOG_KEY = "system/commit_log"


def delta_log_file(version: int) -> str:
    """Where a Delta table's commit ``version`` is, relative to the table.

    Example::

        delta_log_file(42)  # '_delta_log/00000000000000000042.json'
    """
    return f"_delta_log/{version:020d}.json"


def delta_checkpoint_file(version: int) -> str:
    """Where a Delta table's single-file checkpoint of ``version`` is, relative to the table."""
    return f"_delta_log/{version:020d}.checkpoint.parquet"


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

    def consumer_dir(self, group: str) -> str:
        """The key (relative to the root) of everything consumer group ``group`` owns: ``consumers/<group>``.

        Example::

            Lakehouse("lh").consumer_dir("credits")  # 'consumers/credits'
        """
        return f"{CONSUMERS_KEY}/{group_key(group)}"

    def consumer_table(self, group: str, name: str) -> str:
        """The Delta table ``name`` (``dead_letters``, ``operator_actions``, ``redrive``) of consumer group ``group``.

        Example::

            Lakehouse("/lh").consumer_table("credits", "dead_letters")  # '/lh/consumers/credits/dead_letters'
        """
        return self._join(*self.consumer_dir(group).split("/"), name)

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

    def table(self, table: Union[TableDef, str], version: Optional[int] = None) -> DeltaTable:
        """The Delta table ``table`` (see :meth:`path`), opened with this lakehouse's storage settings."""
        from coordinator.lakehouse.delta import open_table

        return open_table(self.path(table), version=version, storage=self.storage)

    def exists(self, table: Union[TableDef, str]) -> bool:
        """Whether ``table`` (see :meth:`path`) is a Delta table yet."""
        from deltalake import DeltaTable

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
        from coordinator.lakehouse.reads import read_table

        return read_table(self.path(table), columns, filter, storage=self.storage, files=files)

    def _join(self, *parts: str) -> str:
        return "/".join((self.root, *parts)) if not self.is_local else os.path.join(self.root, *parts)


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
