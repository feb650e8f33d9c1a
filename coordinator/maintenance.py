"""Table maintenance: compact small files, checkpoint the Delta log, vacuum removed files.

Every producer commit and every checker batch adds a small file, so tables need
compacting, and their logs a checkpoint, to stay fast to read. Runs through
delta-rs (no JVM) and is safe while producers and the checker are running:

* compaction commits change no data (``dataChange=false``), so streaming readers
  skip it and the checker's change-feed offsets stay valid;
* the commit log's vacuum keeps every file the checker may still read: a file that
  a compaction removed after the oldest version the checker may still read (its
  progress record says which) stays on disk until the checker has moved past it;
* ``system/check_requests`` is not compacted: the check interval is measured from
  when each request's file was written, which compaction would reset (delaying
  the next check, never hastening it).

A ``retention_hours`` below Delta's default of 168 frees space sooner but may fail
a reader in flight that still uses an older snapshot (for the checker: one batch,
which is then replayed; nothing is lost). Keep it above your longest query.

It is never below one hour while anything may write: vacuum deletes every file its
snapshot does not know that is older than the retention, and a file a producer
commits after vacuum loaded its snapshot is one of those. (The chaos harness saw a
zero-hour vacuum delete a commit-log file committed a moment before, which the
checker then could never read.) ``quiesced=True`` lifts the floor for tables
nothing writes to, such as a test's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from coordinator.checker.progress import CheckerProgress
from coordinator.tables import CHECK_REQUESTS, COMMIT_LOG, SYSTEM_TABLES

#: Delta's own default for ``delta.deletedFileRetentionDuration``.
DEFAULT_RETENTION_HOURS = 168
#: The shortest retention while writers may be running (delta-rs counts retention in whole hours).
MIN_RETENTION_HOURS = 1
NOT_COMPACTED = {CHECK_REQUESTS.name}


@dataclass
class TableMaintenance:
    """What maintenance did to one table.

    ``skipped`` says why a step was left out (``None`` if nothing was).
    """

    table: str
    files_before: int = 0
    files_after: int = 0
    files_compacted: int = 0
    files_vacuumed: int = 0
    version: int = -1
    skipped: list[str] = field(default_factory=list)


def maintained_tables(lakehouse: str) -> list[str]:
    """Names of every table maintenance looks after: the system tables and every topic.

    Example::

        maintained_tables("lakehouse")  # ['system/commit_log', ..., 'topics/ORDER_TOPIC']
    """
    topics_dir = os.path.join(os.path.abspath(lakehouse), "topics")
    topics = sorted(f"topics/{name}" for name in os.listdir(topics_dir)) if os.path.isdir(topics_dir) else []
    return [table.name for table in SYSTEM_TABLES] + topics


def maintain(
    lakehouse: str,
    *,
    tables: Optional[list[str]] = None,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    on_table: Optional[Callable[[TableMaintenance], None]] = None,
    quiesced: bool = False,
) -> list[TableMaintenance]:
    """Vacuum, compact and checkpoint ``tables`` (default: :func:`maintained_tables`).

    Vacuum runs first, so files a compaction removes stay on disk until at least the
    next run. A step that loses a race with a concurrent writer is skipped and said so;
    running maintenance again retries it. ``on_table`` is called after each table
    (for progress display).

    Example::

        for result in maintain("lakehouse", retention_hours=24):
            print(result.table, result.files_before, "->", result.files_after)
    """
    floor = 0 if quiesced else MIN_RETENTION_HOURS
    if retention_hours < floor:
        raise ValueError(f"retention_hours must be at least {floor}: a shorter vacuum deletes files that writers "
                         "commit while it runs (quiesced=True only when nothing writes to the tables)")
    results = []
    for name in tables if tables is not None else maintained_tables(lakehouse):
        result = _maintain_table(lakehouse, name, retention_hours)
        results.append(result)
        if on_table is not None:
            on_table(result)
    return results


def _maintain_table(lakehouse: str, name: str, retention_hours: int) -> TableMaintenance:
    path = os.path.join(os.path.abspath(lakehouse), *name.split("/"))
    result = TableMaintenance(name)
    if not DeltaTable.is_deltatable(path):
        result.skipped.append("not a Delta table")
        return result
    table = DeltaTable(path)
    result.files_before = len(table.file_uris())
    keep_versions = _versions_still_read(lakehouse, name, table)
    result.files_vacuumed = _attempt(result, "vacuum", lambda: len(table.vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False,
        keep_versions=keep_versions or None)), 0)
    if name in NOT_COMPACTED:
        result.skipped.append("compaction: the check interval is timed from each request's file")
    else:
        metrics = _attempt(result, "compaction", lambda: DeltaTable(path).optimize.compact(), {})
        result.files_compacted = metrics.get("numFilesRemoved", 0)
    _attempt(result, "checkpoint", lambda: DeltaTable(path).create_checkpoint(), None)
    _attempt(result, "log cleanup", lambda: DeltaTable(path).cleanup_metadata(), None)
    final = DeltaTable(path)
    result.files_after, result.version = len(final.file_uris()), final.version()
    return result


def _attempt(result: TableMaintenance, step: str, action: Callable, fallback):
    try:
        return action()
    except (CommitFailedError, DeltaError) as error:
        result.skipped.append(f"{step}: {error.__class__.__name__}: {str(error).splitlines()[0]}")
        return fallback


def _versions_still_read(lakehouse: str, name: str, table: DeltaTable) -> list[int]:
    """Versions whose files vacuum must keep because the checker may still read them.

    A compaction at version ``c`` removed files added at versions below ``c``. If the
    checker may still read from a version below ``c``, some of those files are still
    needed, and all of them are in the snapshot just before the compaction.
    """
    if name != COMMIT_LOG.name:
        return []
    progress = CheckerProgress(lakehouse).load()
    still_read = progress.oldest_needed_version if progress is not None else 0
    return [entry["version"] - 1 for entry in table.history()
            if entry.get("operation") == "OPTIMIZE" and entry["version"] > still_read]
