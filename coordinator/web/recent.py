"""The checker's recent batches (``system/metrics`` rows), kept in memory between page loads.

The table gains one small file per batch (thousands an hour until ``txcoord maintain`` compacts
them). Read whole at every refresh, the charts' window cost the console CPU at every page load, taken
from the checker beside it (docs/performance-log.md#figures-quoted-elsewhere-before); kept here,
each refresh reads only the files holding batches newer than the newest one kept (a compaction
that rewrote recent batches brings them again: they are told apart by batch id).

Example::

    recent = RecentBatches(Lakehouse.of(config))
    rows = recent.since(now - dt.timedelta(minutes=15), now)
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.lakehouse import Lakehouse
from coordinator.ops.status import read_metrics
from coordinator.web.charts import CHART_COLUMNS

__all__ = ["RecentBatches"]


class RecentBatches:
    """The rows of ``lakehouse``'s ``system/metrics`` finished within ``keep`` of now (columns :data:`CHART_COLUMNS`)."""

    def __init__(self, lakehouse: Lakehouse, keep: dt.timedelta = dt.timedelta(hours=1)):
        self.lakehouse = lakehouse
        self.keep = keep
        self._lock = threading.Lock()
        self._rows: Optional[pa.Table] = None

    def since(self, since: dt.datetime, now: dt.datetime) -> pa.Table:
        """The batches finished at ``since`` or later (``since`` at most ``keep`` before ``now``), oldest first."""
        with self._lock:
            rows = self._top_up(now)
        return rows.filter(pc.field("finished_at") >= since)

    def _top_up(self, now: dt.datetime) -> pa.Table:
        oldest = now - self.keep
        if self._rows is None or not self._rows.num_rows:
            self._rows = read_metrics(self.lakehouse, CHART_COLUMNS, since=oldest)
        else:
            newest = pc.max(self._rows.column("finished_at")).as_py()
            new = read_metrics(self.lakehouse, CHART_COLUMNS, since=max(oldest, newest))
            new = new.filter(pc.invert(pc.is_in(new.column("batch_id"), value_set=self._rows.column("batch_id"))))
            self._rows = pa.concat_tables([self._rows.filter(pc.field("finished_at") >= oldest), new])
        self._rows = self._rows.sort_by("finished_at")
        return self._rows
