"""Opening and creating a Delta table at a path, through delta-rs (no JVM).

Each table is created with an explicit, minimal protocol that Spark and delta-rs both read and write.
"""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from typing import Callable, Mapping, Optional, TypeVar

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.schema import Field

from coordinator.retries import RetryPolicy, retrying
from coordinator.storage import denied_as_error, is_object_store
from coordinator.tables import TableDef

__all__ = ["DEFAULT_DELETED_FILE_RETENTION", "create_table", "created_unless_exists", "listing_retried", "open_table",
           "parse_interval"]


#: How often a table is opened again when its log listing caught a commit being written.
_LISTING_ATTEMPTS = 6
_T = TypeVar("_T")
#: Delta's default for ``delta.deletedFileRetentionDuration``: how long a removed file stays in checkpoints
#: (and out of vacuum's reach).
DEFAULT_DELETED_FILE_RETENTION = timedelta(days=7)
# The units Delta's interval syntax accepts (delta-kernel parses whole numbers only: "interval 1.5 hours" is ignored).
_INTERVAL_UNITS = {"week": 604_800, "day": 86_400, "hour": 3_600, "minute": 60, "second": 1,
                   "millisecond": 1e-3, "microsecond": 1e-6, "nanosecond": 1e-9}


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
    def create() -> None:
        if not is_object_store(path):
            os.makedirs(path, exist_ok=True)
        DeltaTable.create(path, schema=table.arrow_schema(), mode="error", configuration=table.properties or None,
                          storage_options=dict(storage) if storage else None)

    return created_unless_exists(path, storage, create, found=lambda: _add_missing_columns(table, path, storage))


def created_unless_exists(path: str, storage: Optional[Mapping[str, str]], create: Callable[[], None],
                          found: Callable[[], None] = lambda: None) -> bool:
    """``create()`` the Delta table at ``path`` unless one is there (then ``found()``); whether this call made it.

    Retried as a conditional write is: an attempt whose reply was lost finds the table made and takes it as a
    creation race lost, which is not an error either (``create`` failing while a table appears).

    Example::

        created_unless_exists(path, None, lambda: write_deltalake(path, rows))  # True, then False
    """
    options = dict(storage) if storage else None

    def attempt() -> bool:
        if DeltaTable.is_deltatable(path, storage_options=options):
            found()
            return False
        try:
            create()
        except DeltaError:
            if DeltaTable.is_deltatable(path, storage_options=options):
                return False
            raise
        return True

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


def parse_interval(text: str) -> Optional[timedelta]:
    """Delta's ``interval <whole number> <unit>`` (a table property's duration), as delta-kernel reads it;
    ``None`` for anything else.

    Example::

        parse_interval("interval 10 minutes")  # timedelta(seconds=600)
    """
    match = re.fullmatch(r"interval\s+(\d+)\s+([a-z]+?)s?", text.strip())
    if match is None or match.group(2) not in _INTERVAL_UNITS:
        return None
    return timedelta(seconds=int(match.group(1)) * _INTERVAL_UNITS[match.group(2)])
