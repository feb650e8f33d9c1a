"""Blind appends to a Delta table, committed straight to its log.

A Delta append is two writes: a Parquet file, then the table's next commit file
``_delta_log/<version>.json``, created only if no other writer has created it
(the Delta protocol's mutual exclusion: on a local disk, a hard link, which
fails when the name exists; on object storage, a conditional ``If-None-Match: *``
PUT, as delta-rs commits there; see :mod:`coordinator.storage`).
delta-rs's ``write_deltalake`` does the same and
much more around it: it plans the write, re-reads the log and rebuilds its
snapshot after every commit, so one append costs many times the two writes, and a
``DeltaTable`` kept open gets slower with every commit it has seen
(docs/performance-log.md#the-hand-written-commit-against-delta-rss).
:class:`DeltaAppender` does only the two writes, and leaves everything else
(creating tables, checkpoints, reading) to delta-rs.

What it honours of the Delta protocol, and how a lost race or a lost reply is handled, is
:class:`DeltaAppender`'s to say.

Example::

    appender = DeltaAppender(Lakehouse("lakehouse").commit_log("order_group"))
    appender.append(records)                                   # the version committed
    appender.append(rows, app_transaction=("txcoord-checker", 12))
    prepared = appender.prepare(more_records)                  # the data file written
    appender.commit(prepared)                                  # the version committed
    appender.close()
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import queue
import random
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata as package_metadata
from typing import Callable, Mapping, Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from coordinator.exceptions import InvalidArgumentError, UnsupportedTableError
from coordinator.lakehouse import delta_log_file, open_table
from coordinator.lakehouse.checkpoints import last_delta_checkpoint, write_delta_checkpoint
from coordinator.lakehouse.deltalog import commit_actions
from coordinator.lakehouse.slots import parquet_file, write_by_slot
from coordinator.retries import note_commit_race_lost
from coordinator.storage import CONCURRENT_READS, FileStore, Versioned, is_object_store, read_all

__all__ = ["CommitBackoff", "DeltaAppender", "PreparedAppend", "check_writable", "file_stats"]

_log = logging.getLogger("coordinator.appender")

#: Writer features a blind append honours by appending, as long as no column carries an invariant,
#: a check constraint or a generation expression (:func:`check_writable` looks).
HONOURED_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "changeDataFeed",
                                      "generatedColumns"})
#: Legacy writer versions up to 4 name exactly those features.
HIGHEST_LEGACY_WRITER_VERSION = 4
#: Statistics keep strings up to this length, as delta-spark's data skipping does.
STRING_STATS_LENGTH = 32
DEFAULT_CHECKPOINT_INTERVAL = 100
#: :meth:`DeltaAppender.compact` rewrites files under this size into files of about this size.
COMPACTION_TARGET_BYTES = 128 * 1024 * 1024
_ENGINE = f"txcoord/{package_metadata.version('txcoord')}"
_STOP = object()
_COMPACT = object()
#: How often, at most, the lost races of one appender are summed up in the log at INFO (each is at DEBUG).
RACES_REPORT_INTERVAL_S = 60.0


@dataclass
class CommitBackoff:
    """How long an appender waits after losing the race for a version before it tries the next one.

    About one round trip of the conditional write that lost (the time the winner's next commit
    takes to land), doubled for each race lost in a row up to ``max_s``, and jittered: uniformly
    between half and all of that, so that writers that lost together do not come back together.
    Never at once: retried at once, a loser arrives behind the winner's next commit every time.
    ``random`` is injectable for tests.

    Example::

        CommitBackoff(random.Random(7)).delay(races_lost_in_a_row=2, round_trip_s=0.025)  # 0.025..0.05
    """

    random: random.Random = field(default_factory=random.Random)
    max_s: float = 1.0
    #: The floor of the round trip the delay starts from: a local disk answers in microseconds.
    min_round_trip_s: float = 0.001

    def delay(self, races_lost_in_a_row: int, round_trip_s: float) -> float:
        """The wait after the ``races_lost_in_a_row``-th race lost in a row (from 1), whose write took ``round_trip_s``."""
        ceiling = min(self.max_s, max(round_trip_s, self.min_round_trip_s) * 2 ** (races_lost_in_a_row - 1))
        return self.random.uniform(ceiling / 2, ceiling)


@dataclass(frozen=True)
class PreparedAppend:
    """An append whose data file is written and whose commit is not made yet (:meth:`DeltaAppender.prepare`)."""

    commit: bytes  # the log entry
    data_file: str
    schema: pa.Schema
    app_transactions: tuple[tuple[str, int], ...]
    #: ``_last_checkpoint``'s version, read while the data file was written.
    checkpoint_read: "Future[Optional[int]]"
    size_bytes: int = 0
    written_ms: int = 0


def check_writable(protocol: dict, metadata: dict) -> None:
    """Raise :class:`UnsupportedTableError` unless a blind append honours every writer rule of a table with
    this ``protocol`` and ``metadata`` action (as dicts, the way they stand in the log).

    Example::

        check_writable({"minReaderVersion": 1, "minWriterVersion": 4}, {"schemaString": "...", "configuration": {}})
    """
    writer_version = protocol.get("minWriterVersion", 1)
    if writer_version == 7:
        unknown = set(protocol.get("writerFeatures") or ()) - HONOURED_WRITER_FEATURES
        if unknown:
            raise UnsupportedTableError(f"the table needs writer feature(s) {', '.join(sorted(unknown))}, "
                                        f"which a blind append cannot honour")
    elif writer_version > HIGHEST_LEGACY_WRITER_VERSION:
        raise UnsupportedTableError(f"the table needs Delta writer version {writer_version}; a blind append "
                                    f"honours up to {HIGHEST_LEGACY_WRITER_VERSION}")
    constraints = sorted(key for key in metadata.get("configuration") or {} if key.startswith("delta.constraints."))
    if constraints:
        raise UnsupportedTableError(f"the table has check constraint(s) {', '.join(constraints)}")
    for column in json.loads(metadata["schemaString"])["fields"]:
        rules = {"delta.invariants", "delta.generationExpression"} & set(column.get("metadata") or {})
        if rules:
            raise UnsupportedTableError(f"column {column['name']!r} has {', '.join(sorted(rules))}")


def file_stats(data: pa.Table) -> str:
    """The ``stats`` of an add action for a file holding ``data``: row count, and per top-level column
    its null count and, for strings, numbers and timestamps, its minimum and maximum.

    Example::

        json.loads(file_stats(pa.table({"n": [3, 1]})))  # {'numRecords': 2, 'minValues': {'n': 1}, ...}
    """
    bounded = [field.name for field in data.schema if (
        pa.types.is_string(field.type) or pa.types.is_integer(field.type) or pa.types.is_timestamp(field.type))]
    # One aggregation for every column: each pyarrow call lets go of the GIL, and under many busy threads
    # winning it back costs more than the work. On one thread, as Acero's threads cost more than they
    # gain at any file's size (docs/performance-log.md#figures-quoted-elsewhere-before).
    bounds = data.group_by([], use_threads=False).aggregate([(name, "min_max") for name in bounded]).to_pylist()[0] \
        if bounded else {}
    minimums, maximums = {}, {}
    for name in bounded:
        low, high = bounds[f"{name}_min_max"]["min"], bounds[f"{name}_min_max"]["max"]
        if low is None:
            continue  # every value is null
        kind = data.schema.field(name).type
        if pa.types.is_string(kind):
            minimums[name] = low[:STRING_STATS_LENGTH]
            if len(high) <= STRING_STATS_LENGTH:
                maximums[name] = high
        elif pa.types.is_timestamp(kind):
            minimums[name] = _timestamp_stat(low, round_up=False)
            maximums[name] = _timestamp_stat(high, round_up=True)
        else:
            minimums[name], maximums[name] = low, high
    nulls = {field.name: column.null_count for field, column in zip(data.schema, data.columns)
             if not pa.types.is_nested(field.type)}
    return json.dumps({"numRecords": data.num_rows, "minValues": minimums, "maxValues": maximums,
                       "nullCount": nulls}, separators=(",", ":"))


def _encoded(actions: list[dict]) -> bytes:
    """A commit's log entry: one JSON action per line."""
    return "".join(json.dumps(action, separators=(",", ":")) + "\n" for action in actions).encode()


def _compaction_groups(files: list[dict], target_bytes: int) -> list[list[dict]]:
    """The files under ``target_bytes`` (add actions, flattened), oldest first, in groups of about
    ``target_bytes`` of at least two files each."""
    small = sorted((f for f in files if f["size_bytes"] < target_bytes), key=lambda f: (f["modification_time"], f["path"]))
    groups: list[list[dict]] = [[]]
    for f in small:
        if groups[-1] and sum(g["size_bytes"] for g in groups[-1]) + f["size_bytes"] > target_bytes:
            groups.append([])
        groups[-1].append(f)
    return [group for group in groups if len(group) > 1]


def _timestamp_stat(value: dt.datetime, round_up: bool) -> str:
    # Delta keeps timestamp statistics in milliseconds; a maximum cut down to them would skip its own row.
    if round_up and value.microsecond % 1000:
        value += dt.timedelta(microseconds=1000 - value.microsecond % 1000)
    value = value.astimezone(dt.timezone.utc) if value.tzinfo else value
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


class DeltaAppender:
    """Appends Arrow tables to the Delta table at ``path``, one commit per call.

    Safe to share between threads; several processes may append to one table at once.
    Raises :class:`UnsupportedTableError` if the table's protocol asks more of a writer
    than appending. ``checkpoints=False`` leaves checkpoints to another writer; ``storage`` holds
    the object store's settings (``[storage]``) when ``path`` is on one; ``commit_info``, fields every commit's
    ``commitInfo`` action carries (a commit log's writers name their client protocol there); ``by_slot`` writes
    each append's file by slot (a topic's: :mod:`coordinator.lakehouse.slots`); ``backoff``, ``clock``
    and ``sleep`` are injectable for tests.

    It stays a correct Delta writer:

    * it writes only to tables whose protocol it honours by doing nothing more than
      appending (see :func:`check_writable`), and re-checks whenever a commit by
      someone else changed the table's protocol or metadata;
    * a commit that lost the race for a version is tried at the next one, after a
      backoff of about the storage's round trip, doubling and jittered (:class:`CommitBackoff`),
      and after reading the winner's commit, and nothing else (a blind append conflicts with
      nothing else); each lost race is counted (``txcoord_storage_commit_races_lost``) and logged;
    * a commit whose reply the storage lost is not committed twice: retried, it
      finds the version taken by exactly its own content (a commit names its data
      file by UUID), which :mod:`coordinator.storage` recognises as its own; if the
      storage never answers within the retry bound,
      :class:`~coordinator.exceptions.WriteOutcomeUnknownError` says the outcome is
      unknown, never that the append failed;
    * it never creates a version a log cleanup may have deleted: it commits at
      ``v`` only once ``v - 1`` is known to exist and the newest checkpoint is
      older than ``v`` (``_delta_log/_last_checkpoint``, read while the data file is
      written, off the commit's path);
    * the statistics it records for data skipping are exact or wider (a string
      longer than 32 characters has no maximum, a timestamp's maximum is rounded
      up to the millisecond);
    * it writes a checkpoint every ``delta.checkpointInterval`` commits, on a thread of
      its own, off the caller's path: carried forward from the previous checkpoint
      (:mod:`coordinator.lakehouse.checkpoints`), through delta-rs where it cannot be.

    An append is two steps a caller may pipeline (:meth:`DeltaAppender.prepare` writes the data file,
    :meth:`DeltaAppender.commit` makes the commit): on object storage each is a request of tens of
    milliseconds, and the next append's data file can be written while a commit is in flight
    (:class:`~coordinator.producer.commit_log.CommitLogWriter` does).

    Example::

        with DeltaAppender(Lakehouse("lakehouse").commit_log("order_group")) as appender:
            appender.append(records)
    """

    def __init__(self, path: str, *, checkpoints: bool = True, compact_every: Optional[int] = None,
                 storage: Optional[Mapping[str, str]] = None, commit_info: Optional[Mapping[str, object]] = None,
                 by_slot: bool = False, backoff: Optional[CommitBackoff] = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if compact_every is not None and compact_every < 2:
            raise InvalidArgumentError(f"compact_every must be at least 2 appends, got {compact_every}")
        self.path = path if is_object_store(path) else os.path.abspath(path)
        self.storage = dict(storage or {})
        self._commit_info = dict(commit_info or {})
        self._by_slot = by_slot
        self._files = FileStore.at(self.path, self.storage)
        self._lock = threading.Lock()
        self._backoff = backoff or CommitBackoff()
        self._clock, self._sleep = clock, sleep
        self._races_unreported, self._races_reported_at = 0, float("-inf")
        # On object storage, _last_checkpoint is read beside the data file's write, not after it; a local
        # disk reads it in microseconds, less than handing it to a thread.
        self._reads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="delta-appender-reads") \
            if self._files.remote else None
        self._loads = 0  # how often the table was read from a snapshot: a compaction must see one only
        self._load()
        self._checkpoints_on, self._compact_every = checkpoints, compact_every
        self._appended: dict[str, dict] = {}  # the files of this appender's appends not compacted yet (compact_every)
        self._compaction_queued = False
        # Checkpoints and compactions, in the order asked for, off the caller's path.
        self._chores: Optional[queue.SimpleQueue] = None
        self._chore_thread: Optional[threading.Thread] = None
        if checkpoints or compact_every:
            self._chores = queue.SimpleQueue()
            self._chore_thread = threading.Thread(target=self._chore_loop, name="delta-chores", daemon=True)
            self._chore_thread.start()

    @property
    def schema(self) -> pa.Schema:
        """The table's schema, as Arrow: what :meth:`append` accepts."""
        return self._schema

    def append(self, data: pa.Table, *, app_transaction: Optional[tuple[str, int]] = None,
               app_transactions: Sequence[tuple[str, int]] = ()) -> Optional[int]:
        """Commit ``data`` (the table's columns, at least one row) as one new file; return its version.

        ``app_transaction=(app_id, version)`` records Delta's application transaction in the
        same commit, so the append is idempotent: if the log already records ``version`` or a
        later one for ``app_id`` (another writer made this append), nothing is written and
        ``None`` is returned. ``app_transactions`` records several in the one commit, which is then
        refused whole if the log records any of them (an action of several parts, each made once).
        What the log records is read from the table once, then kept up to date from every commit
        this appender writes or reads past.

        Example::

            version = appender.append(pa.Table.from_pylist(rows, schema=appender.schema))
        """
        prepared = self.prepare(data, app_transaction=app_transaction, app_transactions=app_transactions)
        return None if prepared is None else self.commit(prepared)

    def prepare(self, data: pa.Table, *, app_transaction: Optional[tuple[str, int]] = None,
                app_transactions: Sequence[tuple[str, int]] = ()) -> Optional[PreparedAppend]:
        """The first half of :meth:`append`: write ``data``'s file and make its commit ready, without
        committing; ``None`` if an application transaction it records is recorded already (nothing written). Pass the
        result to :meth:`commit`, in the order the commits should be made; another append's data file
        may be prepared while a commit is in flight.

        Example::

            prepared = appender.prepare(batch)        # one PUT, beside the commit in flight
            version = appender.commit(prepared)
        """
        if data.num_rows == 0:
            raise InvalidArgumentError("nothing to append")
        transactions = (*([app_transaction] if app_transaction is not None else []), *app_transactions)
        if transactions:
            with self._lock:  # a replay is known before any file is written
                if self._any_recorded(transactions):
                    return None
        if not data.schema.equals(self._schema):
            if data.schema.names != self._schema.names:
                raise InvalidArgumentError(f"data does not have the table's columns: {data.schema.names}, "
                                 f"expected {self._schema.names}")
            data = data.cast(self._schema)  # e.g. a map's entry names as another engine spells them
        checkpoint_read = self._read_last_checkpoint()
        add = self._write_file(data, data_change=True)
        now_ms = int(time.time() * 1000)
        actions = [self._commit_info_action(now_ms, "WRITE", {"mode": "Append"}, blind=True)]
        actions += [{"txn": {"appId": app_id, "version": app_version, "lastUpdated": now_ms}}
                    for app_id, app_version in transactions]
        actions.append({"add": add})
        return PreparedAppend(_encoded(actions), add["path"], data.schema, transactions, checkpoint_read,
                              add["size"], add["modificationTime"])

    def commit(self, prepared: PreparedAppend) -> Optional[int]:
        """The second half of :meth:`append`: commit ``prepared`` at the next free version and return
        it; ``None`` (its data file deleted) if its application transaction was recorded meanwhile."""
        version = self._commit(prepared.commit, prepared.schema, prepared.app_transactions,
                               checkpoint_read=prepared.checkpoint_read)
        if version is None:
            self._files.delete(prepared.data_file)
            return version
        if self._checkpoints_on and version % self._checkpoint_interval == 0:
            self._chores.put(version)
        if self._compact_every:
            with self._lock:
                self._appended[prepared.data_file] = {"path": prepared.data_file, "size_bytes": prepared.size_bytes,
                                                      "modification_time": prepared.written_ms}
                due = len(self._appended) >= self._compact_every and not self._compaction_queued
                self._compaction_queued = self._compaction_queued or due
            if due:
                self._chores.put(_COMPACT)
        return version

    def compact(self, target_bytes: int = COMPACTION_TARGET_BYTES, older_than_s: float = 0, at_least: int = 2) -> int:
        """Rewrite the table's small data files (under ``target_bytes``) into files of about
        ``target_bytes``, changing no data: one ``OPTIMIZE`` commit per new file, its ``remove`` and
        ``add`` actions marked ``dataChange=false`` (readers of changes, the checker's too, skip it).
        Return how many files it removed: none if there was nothing to compact; it stops at the
        first group of files another writer removed first (another compaction: its result stands).

        delta-rs's compaction reads every commit made since its snapshot on each attempt, and gives
        up after 15: on a commit log taking a hundred commits a second it never commits, whatever
        ``max_commit_retries`` says (docs/performance-log.md#figures-quoted-elsewhere-before). This one
        commits as an append does, reading only each winner's log entry, and conflicts with nothing
        but a commit that removed one of its files.

        Only files written over ``older_than_s`` seconds ago count, and nothing is done unless at least
        ``at_least`` of them are small: on a log whose writer compacts its own appends (``compact_every``),
        another process leaves it the recent ones, for each commit of that process races the writer's.

        Example::

            DeltaAppender(Lakehouse("lakehouse").commit_log("order_group"), checkpoints=False).compact()  # 1200
        """
        loads = self._loads
        files = pa.table(self._snapshot.get_add_actions(flatten=True)).select(["path", "size_bytes", "modification_time"])
        written_before_ms = (time.time() - older_than_s) * 1000
        aged = [f for f in files.to_pylist() if f["modification_time"] < written_before_ms]  # milliseconds
        if sum(f["size_bytes"] < target_bytes for f in aged) < at_least:
            return 0
        return self._compact_groups(_compaction_groups(aged, target_bytes), loads)

    def _compact_groups(self, groups: list[list[dict]], snapshot_loads: int) -> int:
        removed = 0
        for group in groups:
            if self._rewrite(group, snapshot_loads) is None:
                break
            removed += len(group)
        return removed

    def _compact_own_appends(self) -> None:
        """Rewrite the files of this appender's own appends as one file (or a few of about the target size), on
        the chores' thread: its commits take turns with the appends' under the lock, so no race is lost to them."""
        with self._lock:  # taken whatever happens next: one that is not compacted is left to maintenance
            appended, loads, self._compaction_queued = list(self._appended.values()), self._loads, False
            self._appended.clear()
        removed = self._compact_groups(_compaction_groups(appended, COMPACTION_TARGET_BYTES), loads)
        _log.debug("%s: %d files of its own appends compacted", self.path, removed)

    def set_properties(self, properties: Mapping[str, str]) -> Optional[int]:
        """Set ``properties`` in the table's configuration, in one ``SET TBLPROPERTIES`` commit (a
        ``metaData`` action) made as an append is; its version, or ``None`` if another metadata change
        came first (call again to apply them on top of it).

        delta-rs's ``alter.set_table_properties`` gives up beside a writer committing many times a
        second, as its compaction does (the soak's maintenance never set a commit log's log retention at
        1,000 txn/s, so nothing was ever cleaned from its log). Appenders take the change in when they
        read through it.

        Example::

            DeltaAppender(log_path, checkpoints=False).set_properties({"delta.logRetentionDuration": "interval 1 hours"})
        """
        loads, snapshot = self._loads, self._snapshot
        metadata = snapshot.metadata()
        now_ms = int(time.time() * 1000)
        actions = [self._commit_info_action(now_ms, "SET TBLPROPERTIES", {"properties": json.dumps(dict(properties))}),
                   {"metaData": {"id": metadata.id, "name": metadata.name, "description": metadata.description,
                                 "format": {"provider": "parquet", "options": {}},
                                 "schemaString": snapshot.schema().to_json(),
                                 "partitionColumns": list(metadata.partition_columns),
                                 "configuration": {**metadata.configuration, **properties},
                                 "createdTime": metadata.created_time}}]
        return self._commit(_encoded(actions), self._schema, (), snapshot_loads=loads, metadata_change=True)

    def close(self) -> None:
        """Finish the checkpoint in progress, if any, and stop. Idempotent."""
        if self._chore_thread is not None:
            self._chores.put(_STOP)
            self._chore_thread.join()
            self._chore_thread = None
        if self._reads is not None:
            self._reads.shutdown()

    def __enter__(self) -> "DeltaAppender":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _rewrite(self, files: list[dict], snapshot_loads: int) -> Optional[int]:
        """Commit ``files`` (add actions of the snapshot) rewritten as one file; ``None`` on a conflict."""
        # Read side by side on object storage: a compaction of a busy log reads thousands of small files.
        contents = read_all(lambda f: self._files.read(f["path"]).data, files, remote=self._files.remote)
        # Each on this thread alone, as a checkpoint is read (coordinator.lakehouse.checkpoints).
        data = pa.concat_tables([pq.ParquetFile(pa.BufferReader(content)).read(use_threads=False)
                                 for content in contents])
        data = data.cast(self._schema)
        add = self._write_file(data, data_change=False)
        now_ms = int(time.time() * 1000)
        actions = [self._commit_info_action(now_ms, "OPTIMIZE", {"targetSize": str(add["size"])})]
        actions += [{"remove": {"path": f["path"], "deletionTimestamp": now_ms, "dataChange": False,
                                "extendedFileMetadata": True, "partitionValues": {}, "size": f["size_bytes"]}}
                    for f in files]
        actions.append({"add": add})
        version = self._commit(_encoded(actions), data.schema, (), frozenset(f["path"] for f in files), snapshot_loads)
        if version is None:
            self._files.delete(add["path"])
        return version

    def _commit_info_action(self, now_ms: int, operation: str, parameters: dict, blind: bool = False) -> dict:
        """A commit's ``commitInfo`` action, with the fields this appender was given (``commit_info``)."""
        return {"commitInfo": {"timestamp": now_ms, "operation": operation, "operationParameters": parameters,
                               "isBlindAppend": blind, "engineInfo": _ENGINE, "clientVersion": _ENGINE,
                               **self._commit_info}}

    def _write_file(self, data: pa.Table, data_change: bool) -> dict:
        """Write ``data`` as a new Parquet file of the table; its ``add`` action."""
        name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        content, tags = write_by_slot(data) if self._by_slot and data_change else (parquet_file(data), {})
        written_ms = self._files.put(name, content)
        return {"path": name, "partitionValues": {}, "size": len(content), "modificationTime": written_ms,
                "dataChange": data_change, "stats": file_stats(data), **({"tags": tags} if tags else {})}

    def _commit(self, commit: bytes, schema: pa.Schema, app_transactions: tuple[tuple[str, int], ...],
                removes: frozenset[str] = frozenset(), snapshot_loads: int = 0, metadata_change: bool = False,
                checkpoint_read: "Optional[Future[Optional[int]]]" = None) -> Optional[int]:
        """Commit ``commit`` at the next version; ``None`` if one of ``app_transactions`` is recorded already, or if
        another commit removed one of the files in ``removes`` since the snapshot of load number
        ``snapshot_loads`` (or the table was loaded again since, which leaves that unknown), or, for a
        ``metadata_change``, if the table was loaded again since (which another metadata change does).
        ``checkpoint_read``: ``_last_checkpoint``'s version read beforehand (read here if not given)."""
        with self._lock:
            races_lost = 0
            # Checked once: past a winner's commit or a checkpoint's just read, the next version is newer than
            # a commit that exists, and a log cleanup takes the oldest commits first.
            newest_checkpoint_known = False
            while True:
                if not schema.equals(self._schema):
                    raise UnsupportedTableError(f"the schema of {self.path} changed while appending")
                if self._any_recorded(app_transactions):
                    return None
                if (removes or metadata_change) and self._loads != snapshot_loads:
                    return None
                if self._removed & removes:
                    return None
                version = self._known + 1
                if not newest_checkpoint_known:
                    newest_checkpoint_known = True
                    checkpoint = (last_delta_checkpoint(self._files) if checkpoint_read is None
                                  else checkpoint_read.result())
                    if checkpoint is not None and checkpoint >= version:
                        # Versions this far back may have been cleaned from the log, so never created again: read
                        # up to the checkpoint while the log holds them (from its snapshot once it does not).
                        self._read_through(checkpoint)
                        continue
                started = self._clock()
                if self._files.create(delta_log_file(version), commit) is None:
                    races_lost += 1
                    delay = self._backoff.delay(races_lost, self._clock() - started)
                    self._note_race_lost(version, races_lost, delay)
                    self._sleep(delay)
                    self._catch_up(version)
                    continue
                self._known = version
                for app_id, app_version in app_transactions:
                    self._app_versions[app_id] = app_version
                return version

    def _read_last_checkpoint(self) -> "Future[Optional[int]]":
        """``_last_checkpoint``'s version, being read: on object storage beside the caller's next request."""
        if self._reads is not None:
            return self._reads.submit(last_delta_checkpoint, self._files)
        read: Future = Future()
        read.set_result(last_delta_checkpoint(self._files))
        return read

    def _note_race_lost(self, version: int, races_lost: int, delay_s: float) -> None:
        """Count a commit refused because another writer made ``version`` first; log it (at INFO summed up, at
        most once every :data:`RACES_REPORT_INTERVAL_S`)."""
        note_commit_race_lost()
        _log.debug("%s: version %d was made by another writer (race %d lost in a row); the next version in %.0f ms",
                    self.path, version, races_lost, delay_s * 1000)
        self._races_unreported += 1
        now = self._clock()
        if now - self._races_reported_at >= RACES_REPORT_INTERVAL_S:
            _log.info("%s: %d commit race(s) lost to other writers since the last report (at most one every %.0f s); "
                      "each is retried at the next version after a backoff", self.path, self._races_unreported,
                      RACES_REPORT_INTERVAL_S)
            self._races_unreported, self._races_reported_at = 0, now

    def _read_through(self, version: int) -> None:
        """Take in the commits after ``self._known`` up to ``version``, which exists (some other writer's)."""
        while self._known < version and self._take_in_next(exists=True, last=version):
            pass

    def _catch_up(self, taken: int) -> None:
        """After losing the race for version ``taken``: take in its commit and every one made after it, up to
        the first version not made yet. Trying each of those instead would lose one race per version to a
        writer committing as fast as this one reads."""
        self._read_through(taken)
        while self._known >= taken and self._take_in_next(exists=False):
            pass

    def _take_in_next(self, exists: bool, last: Optional[int] = None) -> bool:
        """Read the commits after ``self._known`` (up to ``last``, if given), on object storage
        :data:`~coordinator.storage.CONCURRENT_READS` at once (a writer committing every round trip outruns
        one read at a time), and take them in, in order; whether every one read was taken in, and more may
        be read on. Each that ``exists`` (all, with ``last``) but cannot be read was cleaned from the log
        meanwhile (this appender was far behind); the table is read again then, as after a change of its
        metadata."""
        first, remote = self._known + 1, self._files.remote
        count = CONCURRENT_READS if remote else 1
        versions = list(range(first, first + count if last is None else min(first + count, last + 1)))
        commits = read_all(lambda version: self._files.read(delta_log_file(version)), versions, remote=remote)
        for version, commit in zip(versions, commits):
            if not self._take_in(version, commit, exists):
                return False
        return True

    def _take_in(self, version: int, commit: Optional[Versioned], exists: bool) -> bool:
        """Take in ``version``'s commit as read (``None``: not found), the one after ``self._known``; whether
        that was done (see :meth:`_take_in_next`)."""
        if commit is None:
            if exists:
                self._load()
            return False
        actions = commit_actions(commit.data)
        if any("metaData" in action or "protocol" in action for action in actions):
            _log.info("%s: version %d changed the table's metadata or protocol; reading it again", self.path, version)
            self._load()
            return False
        for action in actions:
            if "txn" in action:
                app_id, app_version = action["txn"]["appId"], action["txn"]["version"]
                self._app_versions[app_id] = max(app_version, self._recorded(app_id))
            elif "remove" in action:
                self._removed.add(action["remove"]["path"])
        self._known = version
        return True

    def _any_recorded(self, transactions: Sequence[tuple[str, int]]) -> bool:
        return any(self._recorded(app_id) >= app_version for app_id, app_version in transactions)

    def _recorded(self, app_id: str) -> int:
        """The newest version of ``app_id``'s transaction in the log up to ``self._known``."""
        if app_id not in self._app_versions:
            recorded = self._snapshot.transaction_version(app_id)
            self._app_versions[app_id] = -1 if recorded is None else recorded
        return self._app_versions[app_id]

    def _load(self) -> None:
        """Start again from the table's current snapshot: its version, protocol, metadata and schema."""
        snapshot = open_table(self.path, storage=self.storage)
        protocol, metadata = snapshot.protocol(), snapshot.metadata()
        check_writable({"minWriterVersion": protocol.min_writer_version, "writerFeatures": protocol.writer_features},
                       {"configuration": metadata.configuration, "schemaString": snapshot.schema().to_json()})
        self._snapshot = snapshot
        self._schema = pa.schema(snapshot.schema().to_arrow())
        self._checkpoint_interval = int(metadata.configuration.get("delta.checkpointInterval",
                                                                   DEFAULT_CHECKPOINT_INTERVAL))
        self._app_versions: dict[str, int] = {}
        self._known = snapshot.version()  # every version up to here exists and has been taken in
        self._removed: set[str] = set()  # files removed by the commits taken in since the snapshot
        self._loads += 1

    def _chore_loop(self) -> None:
        while (chore := self._chores.get()) is not _STOP:
            if chore is _COMPACT:
                try:
                    self._compact_own_appends()
                except Exception as error:  # the files stay; maintenance compacts them once they are old enough
                    _log.warning("compaction of %s's own appends failed: %s", self.path, error)
                continue
            try:
                write_delta_checkpoint(self.path, chore, self.storage)
            except Exception as error:  # the next interval's checkpoint covers this one
                _log.warning("checkpoint of %s at version %d failed: %s", self.path, chore, error)
