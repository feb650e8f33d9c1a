"""The commit logs as a Spark streaming source: each micro-batch is a :class:`~.segment.Segment` of them.

Spark's trigger asks the source how far the logs have grown (:func:`~.segment.grown_to`: a few
``stat`` calls per log, and one listing of ``groups/`` to find the logs of groups added since; on
object storage only the logs of groups busy lately or whose doorbell rang, :mod:`coordinator.doorbells`). The
lakehouse's layout (:meth:`~coordinator.commit_logs.CommitLogs.layout`) is read once, at the first
trigger: only ``txcoord upgrade`` changes it, and it takes the checker's lease to do so.
Each micro-batch is one row, its segment: the versions of each log committed since the previous
batch and the batch's **clock** (the wall clock when Spark planned it). Both are Spark offsets,
kept in the checkpoint, so a replayed batch covers the same versions with the same clock. With no
new commits the source still ends a batch once per :data:`HEARTBEAT_MS`, so check-backs keep
coming when producers are quiet.

The checker reads a segment's records itself, on the driver (:meth:`Segment.records`): they never
make a round trip through the JVM, as the batch is decided on the driver anyway.

The source is a ``SimpleDataSourceStreamReader`` (Spark 4's Python data source API).

Example::

    spark.dataSource.register(CommitLogSource)
    stream = (spark.readStream.format(CommitLogSource.name())
              .option("path", Lakehouse(lakehouse).root).option("startingVersions", "{}").load())
"""

from __future__ import annotations

import json
import signal
import struct
import threading
import time
from typing import Iterator, Mapping, Optional

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from coordinator.checker.segment import Segment, grown_to
from coordinator.commit_logs import CommitLogs, Layout
from coordinator.doorbells import GroupWatch
from coordinator.lakehouse import Lakehouse

__all__ = ["CommitLogSource", "HEARTBEAT_MS", "segments"]

#: With no new commit, a batch of one clock tick ends this often.
HEARTBEAT_MS = 1000


class CommitLogReader(SimpleDataSourceStreamReader):
    """Offsets are ``{"versions": {log: first version not read}, "clock_us": the batch clock}``; each
    batch is one row, its :class:`Segment`."""

    def __init__(self, lakehouse: Lakehouse, starting_versions: Mapping[str, int]):
        self.lakehouse = lakehouse
        self.starting_versions = dict(starting_versions)
        self._layout: Optional[Layout] = None
        # On object storage a probe is a request: quiet groups' logs are probed when they ring (coordinator.doorbells).
        self._watch = None if lakehouse.is_local else GroupWatch()
        _outlive_stop_signals()

    @property
    def watch(self) -> Optional[GroupWatch]:
        """Which groups' logs a trigger probes, on object storage (``None`` on a local disk: every log)."""
        return self._watch

    def initialOffset(self) -> dict:
        return {"versions": self.starting_versions, "clock_us": 0}

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        if self._layout is None:  # read under the lease, which the query's start took
            self._layout = CommitLogs(self.lakehouse).layout()
        following = grown_to(self.lakehouse, start["versions"], layout=self._layout, watch=self._watch)
        now_us = time.time_ns() // 1000
        grew = any(end > start["versions"].get(key, 0) for key, end in following.items())
        if not grew and now_us - start["clock_us"] < HEARTBEAT_MS * 1000:
            return iter(()), start
        end = {"versions": following, "clock_us": now_us}
        return self.readBetweenOffsets(start, end), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        # A list's iterator: Spark copies it to keep the batch for a replay, which a generator would not allow.
        return iter([_one_row(Segment(start["versions"], end["versions"], end["clock_us"]).to_json())])


def _one_row(segment: str) -> pa.RecordBatch:
    """The batch's one row as Arrow, which Spark takes as it is (a tuple it converts with ``pa.array``).

    Built from the string's bytes because any conversion of Python objects (``pa.array``, even of one
    string) makes pyarrow import pandas, in the fresh Python process that runs this source: inside the
    first micro-batch of every checker start and takeover (docs/performance-log.md#backlog-drain).
    """
    data = segment.encode()
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
    return pa.RecordBatch.from_arrays([pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])],
                                      names=["segment"])


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
    """The ``txcoord_commit_log`` streaming source: options ``path`` (the lakehouse's root),
    ``startingVersions`` (JSON: the first version to read of each log; a log not named starts at 0)
    and ``storage`` (the lakehouse's storage settings, as JSON)."""

    @classmethod
    def name(cls) -> str:
        return "txcoord_commit_log"

    def schema(self) -> str:
        return "segment string"

    def simpleStreamReader(self, schema) -> CommitLogReader:
        lakehouse = Lakehouse(self.options["path"], json.loads(self.options.get("storage", "{}")))
        return CommitLogReader(lakehouse, json.loads(self.options.get("startingVersions", "{}")))


def segments(batch: DataFrame) -> list[Segment]:
    """The segments a micro-batch of this source holds (one; none if it is empty): one small Spark job.

    Example::

        segments(micro_batch)  # [Segment(starts={...}, ends={...}, clock_us=...)]
    """
    return [Segment.from_json(row[0]) for row in batch.collect()]
