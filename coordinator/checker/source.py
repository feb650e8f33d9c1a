"""The commit log as a Spark streaming source: each micro-batch is a segment of it.

The commit log is append-only and written only by producers, one small commit per
group commit. Spark's trigger asks the source how far the log has grown:
the source lists the next versions' ``_delta_log/<version>.json`` files (a commit
exists whole or not at all), so a trigger costs a few ``stat`` calls rather than a
Delta snapshot rebuild. Each micro-batch is one row, its :class:`Segment`: the
versions committed since the previous batch and the batch's **clock** (the wall
clock when Spark planned it). Both are Spark offsets, kept in the checkpoint, so a
replayed batch covers the same versions with the same clock. With no new commits
the source still ends a batch once per :data:`HEARTBEAT_MS`, so check-backs keep
coming when producers are quiet.

The checker reads a segment's records itself, on the driver (:meth:`Segment.records`):
the data files its versions added, each record with its version and when that version
was committed (the log file's modification time, which is what Delta calls the
commit's timestamp). Compaction commits (``dataChange=false``) add no records and are
skipped, as Delta's own change feed does. The records never make a round trip
through the JVM: the batch is decided on the driver anyway.

The source is a ``SimpleDataSourceStreamReader`` (Spark 4's Python data source API).

Example::

    spark.dataSource.register(CommitLogSource)
    stream = (spark.readStream.format(CommitLogSource.name())
              .option("path", Lakehouse(lakehouse).path(COMMIT_LOG)).option("startingVersion", 0).load())
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from coordinator.storage import FileStore
from coordinator.tables import COMMIT_LOG

#: With no new commit, a batch of one clock tick ends this often.
HEARTBEAT_MS = 1000
#: A backlog is read in bounded steps: at most this many commit-log versions per batch.
MAX_VERSIONS_PER_BATCH = 2000

_COMMIT_LOG_SCHEMA = COMMIT_LOG.arrow_schema()
#: A checker record: a commit-log record, the version it entered with and when, or a clock tick.
RECORD_SCHEMA = pa.schema([*_COMMIT_LOG_SCHEMA, pa.field("commit_version", pa.int64()),
                           pa.field("stored_timestamp", pa.timestamp("us", tz="UTC")),
                           pa.field("is_heartbeat", pa.bool_())])


def _log_file(version: int) -> str:
    return f"_delta_log/{version:020d}.json"


def next_versions(commit_log: str, first_version: int, limit: int = MAX_VERSIONS_PER_BATCH,
                  storage: Optional[Mapping[str, str]] = None) -> int:
    """The first version at or after ``first_version`` that is not committed yet (at most ``limit`` on).

    A Delta writer commits by creating the version's log file atomically: if it exists, it is whole.
    """
    files = FileStore.at(commit_log, storage)
    version = first_version
    while version < first_version + limit and files.exists(_log_file(version)):
        version += 1
    return version


def read_records(commit_log: str, first_version: int, last_version: int,
                 storage: Optional[Mapping[str, str]] = None) -> pa.Table:
    """The records of commit-log versions ``first_version..last_version`` (inclusive), with
    ``commit_version``, ``stored_timestamp`` and ``is_heartbeat`` (false), in commit order.

    Example::

        read_records(Lakehouse("lakehouse").path(COMMIT_LOG), 1, 5).num_rows
    """
    store = FileStore.at(commit_log, storage)
    files, versions, stored = [], [], []
    for version in range(first_version, last_version + 1):
        commit = store.read(_log_file(version))
        stored_us = commit.modified_ms * 1000  # Delta keeps milliseconds
        for action in (json.loads(line) for line in commit.data.splitlines() if line.strip()):
            add = action.get("add")
            if add is not None and add.get("dataChange", True):
                files.append(unquote(add["path"]))
                versions.append(version)
                stored.append(stored_us)
    if not files:
        return RECORD_SCHEMA.empty_table()
    # A producer commits small files, often one per version: ParquetFile reads one at a fraction
    # of read_table's cost, which sets up a dataset for every file.
    parts = [_commit_log_rows(pq.ParquetFile(pa.BufferReader(store.read(path).data))
                              .read(columns=COMMIT_LOG.column_names, use_threads=False)) for path in files]
    counts = [part.num_rows for part in parts]
    data = pa.concat_tables(parts)
    data = data.append_column("commit_version", pa.array(_repeat(versions, counts), pa.int64()))
    data = data.append_column("stored_timestamp", pa.array(_repeat(stored, counts), pa.int64()).cast(
        RECORD_SCHEMA.field("stored_timestamp").type))
    return data.append_column("is_heartbeat", pa.repeat(False, data.num_rows))


def _commit_log_rows(data: pa.Table) -> pa.Table:
    return data if data.schema.equals(_COMMIT_LOG_SCHEMA) else data.cast(_COMMIT_LOG_SCHEMA)


def _repeat(values: list, counts: list[int]) -> list:
    return [value for value, count in zip(values, counts) for _ in range(count)]


def tick(clock_us: int) -> pa.Table:
    """One clock tick, shaped like a record: only ``stored_timestamp`` and ``is_heartbeat`` are set."""
    columns = {field.name: pa.nulls(1, field.type) for field in RECORD_SCHEMA}
    columns["stored_timestamp"] = pa.array([clock_us], pa.int64()).cast(RECORD_SCHEMA.field("stored_timestamp").type)
    columns["is_heartbeat"] = pa.array([True])
    return pa.table(columns, schema=RECORD_SCHEMA)


@dataclass(frozen=True)
class Segment:
    """What one micro-batch covers: commit-log versions ``first_version`` up to (not including)
    ``end_version``, and its clock (the wall clock when Spark planned it)."""

    first_version: int
    end_version: int
    clock_us: int

    def records(self, commit_log: str, storage: Optional[Mapping[str, str]] = None) -> pa.Table:
        """The segment's records, then its clock tick: what the checker's batch decides over.

        Example::

            Segment(3, 5, clock_us).records(Lakehouse("lakehouse").path(COMMIT_LOG)).num_rows
        """
        return pa.concat_tables([read_records(commit_log, self.first_version, self.end_version - 1, storage),
                                 tick(self.clock_us)])


class CommitLogReader(SimpleDataSourceStreamReader):
    """Offsets are ``{"version": first version not read, "clock_us": the batch clock}``; each
    batch is one row, its :class:`Segment`."""

    def __init__(self, commit_log: str, starting_version: int, storage: Mapping[str, str]):
        self.commit_log = commit_log
        self.starting_version = starting_version
        self.storage = storage
        _outlive_stop_signals()

    def initialOffset(self) -> dict:
        return {"version": self.starting_version, "clock_us": 0}

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        following = next_versions(self.commit_log, start["version"], storage=self.storage)
        now_us = time.time_ns() // 1000
        if following == start["version"] and now_us - start["clock_us"] < HEARTBEAT_MS * 1000:
            return iter(()), start
        end = {"version": following, "clock_us": now_us}
        return self.readBetweenOffsets(start, end), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        # A list's iterator: Spark copies it to keep the batch for a replay, which a generator would not allow.
        return iter([(start["version"], end["version"], end["clock_us"])])


def _outlive_stop_signals() -> None:
    """In the Python process that runs this reader for the JVM, ignore SIGTERM and SIGINT.

    A stop sent to the checker's whole process group (Ctrl-C in a terminal, ``kill -TERM -PGID``,
    systemd's default ``KillMode=control-group``) reaches this process too; dying of it mid-call
    failed the streaming query (exit 1) where the checker would have finished its batch and
    exited 0. The JVM ends this process when it stops (its socket closes), so it needs no signal.
    """
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)


class CommitLogSource(DataSource):
    """The ``txcoord_commit_log`` streaming source: options ``path`` (the commit log), ``startingVersion``
    and ``storage`` (the lakehouse's storage settings, as JSON)."""

    @classmethod
    def name(cls) -> str:
        return "txcoord_commit_log"

    def schema(self) -> str:
        return "first_version long, end_version long, clock_us long"

    def simpleStreamReader(self, schema) -> CommitLogReader:
        return CommitLogReader(self.options["path"], int(self.options.get("startingVersion", 0)),
                               json.loads(self.options.get("storage", "{}")))


def segments(batch: DataFrame) -> list[Segment]:
    """The segments a micro-batch of this source holds (one; none if it is empty): one small Spark job.

    Example::

        segments(micro_batch)  # [Segment(first_version=3, end_version=5, clock_us=...)]
    """
    return [Segment(*row) for row in batch.collect()]
