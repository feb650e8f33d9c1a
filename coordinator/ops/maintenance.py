"""Table maintenance: compact small files, checkpoint the Delta log, vacuum removed files.

Every producer commit and every checker batch adds a small file, so tables need
compacting, and their logs a checkpoint, to stay fast to read. Runs through
delta-rs (no JVM) and is safe while producers and the checker are running:

* compaction commits change no data (``dataChange=false``), so streaming readers
  skip it and the checker's commit-log offsets stay valid;
* the commit log's vacuum keeps every file the checker may still read: a file that
  a compaction removed after the oldest version the checker may still read (its
  progress record says which) stays on disk until the checker has moved past it;
* a commit log is vacuumed by listing its files (delta-rs's full vacuum): its
  checkpoints keep a removed file's tombstone for two minutes only (see
  :data:`~coordinator.tables.COMMIT_LOG`), after which the lite vacuum would never
  find the file. A commit log made by an earlier version gains its definition's
  properties here;
* a commit log, which producers commit to many times a second, is compacted by
  :meth:`DeltaAppender.compact <coordinator.appender.DeltaAppender.compact>` (delta-rs's
  compaction never commits there: it gives up after 15 attempts), every other table
  by delta-rs;
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

The Delta logs (``_delta_log/*.json``, one file per commit) are cleaned of commits
older than each table's ``delta.logRetentionDuration`` (Delta's default: 30 days);
``log_retention_hours`` sets that property, which bounds the logs. The checker reads
each commit log from its commits, so a commit log's log is cleaned only when no commit
from the oldest version the checker may still read on is old enough to be deleted;
otherwise the cleanup is skipped and said so (producers never clean it: see
:class:`~coordinator.producer.commit_log.CommitLogWriter`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, Optional, Union

from deltalake import DeltaTable, PostCommitHookProperties
from deltalake.exceptions import CommitFailedError, DeltaError

from coordinator.appender import CommitBackoff, DeltaAppender
from coordinator.commit_logs import CommitLogRef, CommitLogs, versions_written
from coordinator.control.progress import CheckerProgress
from coordinator.exceptions import InvalidArgumentError, one_line
from coordinator.lakehouse import Lakehouse, listing_retried
from coordinator.lakehouse.checkpoints import last_delta_checkpoint, write_delta_checkpoint
from coordinator.lakehouse.deltalog import check_commits
from coordinator.lakehouse.delta import DEFAULT_DELETED_FILE_RETENTION, parse_interval
from coordinator.storage import CONCURRENT_READS, FileStore
from coordinator.tables import CHECK_REQUESTS, COMMIT_LOG, SYSTEM_TABLES, TOPIC

__all__ = ["COMMIT_LOG_COMPACTION_AGE", "COMMIT_LOG_COMPACTION_MIN_FILES", "DEFAULT_RETENTION_HOURS",
           "LOG_RETENTION_PROPERTY", "MIN_RETENTION_HOURS", "TableMaintenance", "log_retention_interval", "maintain",
           "maintained_tables"]

#: Delta's own default for ``delta.deletedFileRetentionDuration``, in hours.
DEFAULT_RETENTION_HOURS = int(DEFAULT_DELETED_FILE_RETENTION / timedelta(hours=1))
#: The shortest retention while writers may be running (delta-rs counts retention in whole hours).
MIN_RETENTION_HOURS = 1
NOT_COMPACTED = {CHECK_REQUESTS.name}
#: A commit log's small files are compacted here once this old, and only this many or more at once (see
#: :func:`_compact_commit_log`).
COMMIT_LOG_COMPACTION_AGE = timedelta(minutes=10)
COMMIT_LOG_COMPACTION_MIN_FILES = 100
#: The longest wait of maintenance's commits to a commit log after a race lost to its writer (see _commit_log_appender).
RACE_BACKOFF_MAX_S = 0.1
#: The table property that says how long the log keeps a commit, and Delta's default for it.
LOG_RETENTION_PROPERTY = "delta.logRetentionDuration"
DEFAULT_LOG_RETENTION = timedelta(days=30)
# cleanup_metadata reads the clock after the commit log's guard does: a commit this close to expiring (or
# half the retention, if that is shorter) counts as expired.
_CLOCK_MARGIN = timedelta(minutes=1)


@dataclass
class TableMaintenance:
    """What maintenance did to one table.

    ``skipped`` says why a step was left out (``None`` if nothing was); ``failed``, why the table could
    not be maintained at all (its other fields then say nothing); ``seconds``, how long it took.
    """

    table: str
    files_before: int = 0
    files_after: int = 0
    files_compacted: int = 0
    files_vacuumed: int = 0
    version: int = -1
    skipped: list[str] = field(default_factory=list)
    failed: Optional[str] = None
    seconds: float = 0.0


def maintained_tables(lakehouse: Union[str, Lakehouse]) -> list[str]:
    """Names of every table maintenance looks after: the system tables, every commit log, every group's
    check requests and every topic.

    Example::

        maintained_tables("lakehouse")  # ['system/half', ..., 'groups/g/commit_log', ..., 'topics/ORDER_TOPIC']
    """
    lakehouse = Lakehouse.at(lakehouse)
    logs = CommitLogs(lakehouse)
    candidates = ([ref.key for ref in logs.discover()]
                  + [f"{lakehouse.group_dir(group)}/check_requests" for group in logs.groups()])
    return ([table.name for table in SYSTEM_TABLES] + sorted(name for name in candidates if lakehouse.exists(name))
            + [f"topics/{name}" for name in lakehouse.files.directories("topics")])


def _is_commit_log(name: str) -> bool:
    ref = CommitLogRef(name)
    return ref.group is not None or ref.is_operators or ref.is_shared


def maintain(
    lakehouse: Union[str, Lakehouse],
    *,
    tables: Optional[list[str]] = None,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    on_table: Optional[Callable[[TableMaintenance], None]] = None,
    quiesced: bool = False,
    log_retention_hours: Optional[float] = None,
) -> list[TableMaintenance]:
    """Vacuum, compact, checkpoint and clean the logs of ``tables`` (default: :func:`maintained_tables`).

    Vacuum runs first, so files a compaction removes stay on disk until at least the
    next run. A step that loses a race with a concurrent writer is skipped and said so;
    running maintenance again retries it. ``on_table`` is called after each table
    (for progress display). A table that cannot be maintained (a log a group filled with bytes that are
    no Delta commit, say) is reported with the reason (``failed``) and the others are still maintained.

    ``log_retention_hours`` (fractions allowed) sets each table's
    ``delta.logRetentionDuration`` where it differs, so that the log cleanup removes
    commits older than that; without it, each table keeps the retention it has. The
    commit log's cleanup is skipped while it would remove a commit the checker still
    needs. Raises ``ValueError`` for a retention that is not positive.

    Example::

        for result in maintain("lakehouse", retention_hours=24, log_retention_hours=1.5):
            print(result.table, result.files_before, "->", result.files_after, result.skipped)
    """
    floor = 0 if quiesced else MIN_RETENTION_HOURS
    if retention_hours < floor:
        raise InvalidArgumentError(f"retention_hours must be at least {floor}: a shorter vacuum deletes files that writers "
                         "commit while it runs (quiesced=True only when nothing writes to the tables)")
    log_retention = None if log_retention_hours is None else log_retention_interval(log_retention_hours)
    lakehouse = Lakehouse.at(lakehouse)
    results = []
    for name in tables if tables is not None else maintained_tables(lakehouse):
        started = time.monotonic()
        try:
            result = _maintain_table(lakehouse, name, retention_hours, log_retention)
        except Exception as error:  # this table's failure, whatever it is, must not cost the others theirs
            result = TableMaintenance(name, failed=one_line(error, limit=500))
        result.seconds = round(time.monotonic() - started, 3)
        results.append(result)
        if on_table is not None:
            on_table(result)
    return results


def log_retention_interval(hours: float) -> str:
    """``hours`` in Delta's interval syntax, for ``delta.logRetentionDuration``: a whole number of the largest unit that fits.

    Raises ``ValueError`` unless ``hours`` is positive (rounded to the millisecond).

    Example::

        log_retention_interval(1.5)    # 'interval 90 minutes'
        log_retention_interval(0.001)  # 'interval 3600 milliseconds'
    """
    milliseconds = round(hours * 3_600_000) if math.isfinite(hours) else 0
    if not hours > 0 or milliseconds < 1:
        raise InvalidArgumentError(f"log_retention_hours must be a positive, finite number of hours (at least a millisecond), "
                         f"got {hours!r}")
    for unit, size in (("hour", 3_600_000), ("minute", 60_000), ("second", 1_000), ("millisecond", 1)):
        if milliseconds % size == 0:
            count = milliseconds // size
            return f"interval {count} {unit}{'' if count == 1 else 's'}"


def _maintain_table(lakehouse: Lakehouse, name: str, retention_hours: int, log_retention: Optional[str]) -> TableMaintenance:
    result = TableMaintenance(name)
    if not lakehouse.exists(name):
        result.skipped.append("not a Delta table")
        return result
    # A group writes its own log: whatever delta-rs would choke on is refused first.
    checked = check_commits(lakehouse.files, name) if _is_commit_log(name) else {}
    # A checkpoint at the head first, from the commits just checked: each load of the table below (the guards,
    # vacuum, compaction) then reads the commits after it, not all of those since the last one (a busy commit
    # log's, once for each load).
    _attempt(result, "first checkpoint", lambda: write_delta_checkpoint(lakehouse.path(name), _head(lakehouse, name),
                                                                   lakehouse.storage, commits=checked), None)
    table = lakehouse.table(name)
    result.files_before = len(table.file_uris())
    unset = _attempt(result, "properties", lambda: _set_properties(lakehouse, table, name, log_retention), None)
    if unset is not None:
        result.skipped.append(f"properties: {unset}")
    keep_versions = _versions_still_read(lakehouse, name, table)
    # A commit log's checkpoints keep a removed file's tombstone for minutes only (see COMMIT_LOG), and
    # delta-rs's lite vacuum deletes only the files of tombstones it still has: the full one lists the files.
    result.files_vacuumed = _attempt(result, "vacuum", lambda: len(table.vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False,
        keep_versions=keep_versions or None, full=_is_commit_log(name))), 0)
    if name in NOT_COMPACTED:
        result.skipped.append("compaction: the check interval is timed from each request's file")
    elif _is_commit_log(name):  # producers commit to it many times a second: see DeltaAppender.compact
        result.files_compacted = _attempt(result, "compaction", lambda: _compact_commit_log(lakehouse, name), 0)
    else:
        metrics = _attempt(result, "compaction", lambda: lakehouse.table(name).optimize.compact(
            max_concurrent_tasks=None if lakehouse.is_local else CONCURRENT_READS), {})
        result.files_compacted = metrics.get("numFilesRemoved", 0)
    # Carried forward from the previous checkpoint where it can be: delta-rs rebuilds a commit log's state
    # from every commit since, costly on a busy log (see lakehouse.checkpoints). The version it is
    # at is found by existence checks past the one read before the compaction, not by loading the table again.
    _attempt(result, "checkpoint", lambda: write_delta_checkpoint(
        lakehouse.path(name), versions_written(lakehouse.files, name, table.version() + 1) - 1, lakehouse.storage), None)
    still_needed = _commit_still_needed(lakehouse, name) if _is_commit_log(name) else None
    final = lakehouse.table(name)
    if still_needed is not None:
        result.skipped.append(f"log cleanup: {still_needed}")
    else:
        _attempt(result, "log cleanup", final.cleanup_metadata, None)
    result.files_after, result.version = len(final.file_uris()), final.version()
    return result


def _head(lakehouse: Lakehouse, name: str) -> int:
    """Table ``name``'s latest version, found by existence checks past its newest checkpoint."""
    newest = last_delta_checkpoint(FileStore.at(lakehouse.path(name), lakehouse.storage))
    return versions_written(lakehouse.files, name, newest or 0) - 1


def _compact_commit_log(lakehouse: Lakehouse, name: str) -> int:
    """Compact a commit log through :meth:`DeltaAppender.compact`; the files it removed.

    Its writer compacts its own appends (every :data:`~coordinator.producer.commit_log.COMPACT_OWN_APPENDS_EVERY`):
    only files older than :data:`COMMIT_LOG_COMPACTION_AGE` are compacted here (a log nobody writes, or
    a writer of an earlier version's), and only many of them at once, for each commit made here races the writer's.
    """
    with _commit_log_appender(lakehouse, name) as appender:
        return appender.compact(older_than_s=COMMIT_LOG_COMPACTION_AGE.total_seconds(),
                                at_least=COMMIT_LOG_COMPACTION_MIN_FILES)


def _commit_log_appender(lakehouse: Lakehouse, name: str) -> DeltaAppender:
    """An appender for maintenance's own commits to commit log ``name``. It waits at most
    :data:`RACE_BACKOFF_MAX_S` after a race lost to the log's writer: a writer that always has its next commit
    in flight wins every round it is in, and a longer wait only gives it more versions to be read through
    (docs/performance-log.md#the-checkers-own-maintenance-is-each-commit-logs-_delta_log-bounded)."""
    return DeltaAppender(lakehouse.key_path(name), checkpoints=False, storage=lakehouse.storage,
                         backoff=CommitBackoff(max_s=RACE_BACKOFF_MAX_S))


def _attempt(result: TableMaintenance, step: str, action: Callable, fallback):
    try:
        return listing_retried(action)
    except (CommitFailedError, DeltaError) as error:
        result.skipped.append(f"{step}: {error.__class__.__name__}: {str(error).splitlines()[0]}")
        return fallback


def _versions_still_read(lakehouse: Lakehouse, name: str, table: DeltaTable) -> list[int]:
    """Versions whose files vacuum must keep because the checker may still read them.

    A compaction at version ``c`` removed files added at versions below ``c``. If the
    checker may still read from a version below ``c``, some of those files are still
    needed, and all of them are in the snapshot just before the compaction.
    """
    if not _is_commit_log(name):
        return []
    progress = CheckerProgress(lakehouse).load()
    still_read = progress.oldest_needed_versions.get(name, 0) if progress is not None else 0
    # Only the commits after the one still read: history reads each commit it returns (a request each on object storage).
    newer = table.version() - still_read
    if newer <= 0:
        return []
    return [entry["version"] - 1 for entry in table.history(limit=newer)
            if entry.get("operation") == "OPTIMIZE" and entry["version"] > still_read]


def _set_properties(lakehouse: Lakehouse, table: DeltaTable, name: str, log_retention: Optional[str]) -> Optional[str]:
    """Give ``table`` the log retention, if one is given, and a commit log or a topic the properties of its
    definition (one made by an earlier version lacks some), in one commit, if it lacks any; why not, if it could not.

    Every commit changes what a writer must have read (a property change conflicts with appends in
    flight), so an unchanged table gets none.
    """
    configuration = table.metadata().configuration
    wanted = (dict(COMMIT_LOG.properties) if _is_commit_log(name)
              else dict(TOPIC.properties) if name.startswith("topics/") else {})
    if log_retention is not None:
        wanted[LOG_RETENTION_PROPERTY] = log_retention
    if (log_retention is None or _log_retention(table) == parse_interval(log_retention)) and \
            all(configuration.get(key) == value for key, value in wanted.items() if key != LOG_RETENTION_PROPERTY):
        return None
    if _is_commit_log(name):  # producers commit to it many times a second: see DeltaAppender.set_properties
        with _commit_log_appender(lakehouse, name) as appender:
            if appender.set_properties(wanted) is None:
                return "another metadata change came first; the next run sets them"
        return None
    # Its own post-commit hook must not clean the log with the new retention before the guard has looked.
    table.alter.set_table_properties(wanted, post_commithook_properties=PostCommitHookProperties(cleanup_expired_logs=False))
    return None


def _commit_still_needed(lakehouse: Lakehouse, name: str) -> Optional[str]:
    """Why cleaning the log of commit log ``name`` now could delete a commit the checker still reads
    (``None`` if it cannot).

    The cleanup deletes commit files older than the log retention, by their time on
    disk; the checker reads every commit from its oldest needed version on (all of
    them when it has no progress record yet).
    """
    progress = CheckerProgress(lakehouse).load()
    needed = progress.oldest_needed_versions.get(name, 0) if progress is not None else 0
    retention = _log_retention(lakehouse.table(name))
    cutoff_ms = (time.time() - (retention - min(_CLOCK_MARGIN, retention / 2)).total_seconds()) * 1000
    commits = {key.rsplit("/", 1)[-1].removesuffix(".json"): written_ms
               for key, written_ms in FileStore.at(lakehouse.path(name), lakehouse.storage).modified("_delta_log").items()
               if key.endswith(".json")}
    expired = min((int(version) for version, written_ms in commits.items()
                   if version.isdigit() and int(version) >= needed and written_ms < cutoff_ms), default=None)
    if expired is None:
        return None
    return f"version {expired} is older than the log retention ({retention}), and the checker still reads from version {needed}"


def _log_retention(table: DeltaTable) -> timedelta:
    """How long ``table``'s log keeps a commit; zero if the property cannot be read (so nothing counts as safe)."""
    value = table.metadata().configuration.get(LOG_RETENTION_PROPERTY)
    if value is None:
        return DEFAULT_LOG_RETENTION
    parsed = parse_interval(value)
    return timedelta(0) if parsed is None else parsed
