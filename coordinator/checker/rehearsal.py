"""A standby's rehearsal: one throwaway micro-batch of the checker's source, run while it stands by.

Spark's first micro-batch in a session is slow: the streaming classes load, the source's Python
runner starts, the ``foreachBatch`` callback is set up. Without a rehearsal a hot standby's first
batch after a takeover was that one, and came seconds later than with one
(docs/performance-log.md#figures-quoted-elsewhere-before).

The rehearsal is a query of its own (:data:`REHEARSAL_NAME`, as Spark's UI shows it) over the same
source, with ``Trigger.AvailableNow`` and a checkpoint in a temporary directory, deleted afterwards:
its batch holds the source's segment only (which commit-log versions it covers), so it reads no
record and writes nothing to the lakehouse. It runs in the background, and a takeover never waits
for it: one still running is abandoned (:meth:`Rehearsal.abandon`).

Example::

    rehearsal = Rehearsal(lambda: spark.readStream.format(CommitLogSource.name()).option("path", root))
    lease.acquire(wait=True, prepare=rehearsal.start)
    rehearsal.abandon()
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from pyspark.sql.streaming import DataStreamReader, StreamingQuery

from coordinator.checker import CHECKER_NAME
from coordinator.checker.source import segments

__all__ = ["REHEARSAL_NAME", "Rehearsal"]

log = logging.getLogger("coordinator.checker")

#: The name of the rehearsal's query.
REHEARSAL_NAME = f"{CHECKER_NAME}-rehearsal"


class Rehearsal:
    """One rehearsal of a first micro-batch over the stream ``reader()`` makes, in a background thread."""

    def __init__(self, reader: Callable[[], DataStreamReader]):
        self._reader = reader
        self._lock = threading.Lock()
        self._abandoned = False
        self._query: Optional[StreamingQuery] = None

    def start(self) -> None:
        """Start rehearsing in the background; returns at once."""
        threading.Thread(target=self._run, name="checker-rehearsal", daemon=True).start()

    def abandon(self) -> None:
        """Stop the rehearsal if it still runs (its query stopped, or never started). Returns without waiting
        for a query still being started: that one stops itself once started."""
        with self._lock:
            self._abandoned = True
            query = self._query
        if query is not None:
            query.stop()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix="txcoord-rehearsal-") as checkpoint:
                query = (self._reader().load().writeStream.queryName(REHEARSAL_NAME)
                         .foreachBatch(lambda batch, _: segments(batch))
                         .option("checkpointLocation", Path(checkpoint).as_uri())
                         .trigger(availableNow=True).start())
                with self._lock:
                    self._query = query
                    abandoned = self._abandoned
                if abandoned:
                    query.stop()
                    return
                query.awaitTermination()
        except Exception as error:  # py4j's and Spark's alike: a failed rehearsal costs only its gain
            if not self._abandoned:
                log.warning("a first batch could not be rehearsed while standing by (a takeover's first batch "
                            "will take longer): %s", error)
            return
        if self._abandoned:
            log.info("the rehearsal of a first batch was abandoned at the takeover")
        else:
            log.info("standing by with a first batch rehearsed in %.1f s", time.monotonic() - started)
