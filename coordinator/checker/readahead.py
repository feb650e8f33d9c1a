"""Reading the next segment's commits in another process while the checker decides the current one.

Draining a backlog, a batch spends about as long reading its segment (2,000 commit-log versions:
their JSON commits and ~2,000 small Parquet files) as deciding and writing it, and both hold the GIL:
threads do not overlap them (more reader threads read the same files no faster than one; the figures:
docs/performance-log.md#figures-quoted-elsewhere-before). So once a batch took a full segment (a backlog: more
commits are waiting), the commits after it are read by a worker process while the batch is decided; the next
batch takes what the worker read and reads only the rest itself. At start, unless another checker
holds the lease, the worker reads what the first batch will cover, from the progress record's next
versions, while Spark resolves the source and starts its query.

A commit-log version is immutable once it exists (written whole or not at all) and so are the data
files it adds: what the worker read is exactly what the batch would read, whichever batch, replayed
or not, asks for it. A worker that fails costs only its time: the batch reads everything itself.

Example::

    ahead = ReadAhead(lakehouse)
    ahead.warm()           # at start: the worker's imports, before any batch
    ahead.read_from(progress.next_versions)  # the first batch's commits, while Spark starts its query
    records = segment.records(lakehouse, ahead.take())
    ahead.start(segment)   # only after a full segment: a backlog
    ...
    ahead.close()
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import resource_tracker
from typing import Mapping, Optional

import pyarrow as pa

from coordinator.checker.allocator import use_system_allocator
from coordinator.checker.segment import MAX_VERSIONS_PER_BATCH, CommitRead, Segment, grown_to, read_commits
from coordinator.lakehouse import Lakehouse

__all__ = ["ReadAhead"]

log = logging.getLogger("coordinator.checker")

#: The worker's niceness, added to the driver's.
_NICENESS = 10


class ReadAhead:
    """The commits after the last full segment, read by a worker process (see the module's docstring)."""

    def __init__(self, lakehouse: Lakehouse, full: int = MAX_VERSIONS_PER_BATCH) -> None:
        self.lakehouse = lakehouse
        self.full = full  # versions in a full segment: one the source cut short of a backlog
        self._pool: Optional[ProcessPoolExecutor] = None
        self._reading: Optional[Future] = None
        self._reading_from: dict[str, int] = {}  # where self._reading starts

    def warm(self) -> None:
        """Start the worker now, before any batch: a fresh interpreter takes about a second of CPU to import
        what it reads with, which a checker starting on a backlog would otherwise spend beside its first
        batches."""
        self._worker().submit(_imported)

    def start(self, segment: Segment) -> None:
        """Read, in the worker, the commits after ``segment`` if it was a full one (a backlog)."""
        if segment.versions >= self.full:
            self.read_from(segment.ends)

    def read_from(self, versions: Mapping[str, int]) -> None:
        """Read, in the worker, up to a full segment's commits from ``versions`` on (the first version of each
        log not read yet): what the next batch covers. At start, while Spark resolves the source and starts its
        query, so that the first batch need not read its segment itself."""
        self._reading_from = dict(versions)
        self._reading = self._worker().submit(_read_after, self.lakehouse.root, self.lakehouse.storage,
                                              self._reading_from, self.full)

    @property
    def reading_from(self) -> Optional[dict[str, int]]:
        """The versions the read under way (or done and not taken yet) starts at; ``None`` if there is none."""
        return dict(self._reading_from) if self._reading is not None else None

    def take(self) -> Mapping[tuple[str, int], CommitRead]:
        """What the worker read since :meth:`start` (waiting for it), by ``(log, version)``; empty if nothing."""
        reading, self._reading = self._reading, None
        if reading is None:
            return {}
        try:
            return _unpacked(*reading.result())
        except Exception as error:  # noqa: BLE001 - any failure of the worker: the batch reads for itself
            log.warning("reading ahead failed, the batch reads its segment itself: %s", error)
            self.close()
            return {}

    def _worker(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # A fresh interpreter, not a fork of the driver (its JVM gateway and threads stay behind), and a
            # lower priority: reading ahead must not slow what runs now (the JVM starting, the batch deciding).
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_started)
        return self._pool

    def close(self) -> None:
        """End the worker and multiprocessing's resource tracker, and reap both before returning: a read in
        flight is dropped, not waited for (a stop must not wait out a backlog's read), and no process of the
        checker's outlives its exit."""
        self._reading = None
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # Killed rather than asked: a busy worker would finish its read first. The pool has no public way to
        # end its workers before Python 3.14; killed, they make it broken, and its shutdown then joins them.
        for worker in list((getattr(pool, "_processes", None) or {}).values()):
            worker.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        del pool
        _stop_resource_tracker()


def _stop_resource_tracker() -> None:
    """End the resource tracker the worker's start launched (a child of this process, which otherwise
    lingers after it exits), once the pool's semaphores are released; a later worker launches another."""
    gc.collect()  # the pool's queues, whose semaphores the tracker holds until they are collected
    tracker = resource_tracker._resource_tracker
    if hasattr(tracker, "_stop"):  # private, as is the tracker itself; there is no public way to stop it
        tracker._stop()


def _worker_started() -> None:
    os.nice(_NICENESS)
    use_system_allocator()
    # A worker outlives a driver killed with SIGKILL (measured: still there, adopted by init, seconds
    # later); it leaves with it instead, when its parent's sentinel closes.
    threading.Thread(target=_exit_with_parent, name="read-ahead-parent", daemon=True).start()


def _exit_with_parent() -> None:
    multiprocessing.parent_process().join()
    os._exit(0)


def _imported() -> None:
    """Nothing: sent to the worker, it makes it import this module and what reading needs."""


def _read_after(root: str, storage: Mapping[str, str], starts: dict[str, int], budget: int) -> tuple[pa.Table, list]:
    """The worker's read, packed as one table and an index: one table of the commits' rows pickles far faster
    than 2,000 small tables (docs/performance-log.md#figures-quoted-elsewhere-before)."""
    lakehouse = Lakehouse(root, storage)
    read = read_commits(lakehouse, starts, grown_to(lakehouse, starts, budget))
    index = [(key, version, commit.modified_ms, commit.rows.num_rows, commit.refusals, commit.sha256, commit.size)
             for (key, version), commit in read.items()]
    rows = pa.concat_tables([commit.rows for commit in read.values()]).combine_chunks() if read else None
    return rows, index


def _unpacked(rows: Optional[pa.Table], index: list) -> dict[tuple[str, int], CommitRead]:
    read, offset = {}, 0
    for key, version, modified_ms, count, refusals, sha256, size in index:
        read[key, version] = CommitRead(modified_ms, rows.slice(offset, count), refusals, sha256, size)
        offset += count
    return read
