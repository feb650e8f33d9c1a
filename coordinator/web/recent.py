"""The checker's recent batches (``system/metrics`` rows), kept in memory between page loads.

The table gains one small file per batch (thousands an hour until ``txcoord maintain`` compacts
them). Read whole at every refresh, the charts' window cost about a second of CPU per page load
at 1,000 txn/s on the 2-core test machine, taken from the checker beside it; kept here and topped
up with the files added since the last look, a refresh reads a few files.

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
import pyarrow.dataset as ds

from coordinator.lakehouse import Lakehouse, table_dataset
from coordinator.tables import METRICS
from coordinator.web.charts import CHART_COLUMNS

__all__ = ["RecentBatches"]


class RecentBatches:
    """The rows of ``lakehouse``'s ``system/metrics`` finished within ``keep`` of now (columns :data:`CHART_COLUMNS`)."""

    def __init__(self, lakehouse: Lakehouse, keep: dt.timedelta = dt.timedelta(hours=1)):
        self.lakehouse = lakehouse
        self.keep = keep
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._rows: Optional[pa.Table] = None

    def since(self, since: dt.datetime, now: dt.datetime) -> pa.Table:
        """The batches finished at ``since`` or later (``since`` at most ``keep`` before ``now``), oldest first."""
        with self._lock:
            rows = self._top_up(now)
        return rows.filter(pc.field("finished_at") >= since)

    def _top_up(self, now: dt.datetime) -> pa.Table:
        if not self.lakehouse.exists(METRICS):
            return METRICS.arrow_schema().empty_table().select(CHART_COLUMNS)
        _, dataset = table_dataset(self.lakehouse.path(METRICS), self.lakehouse.storage)
        fragments = list(dataset.get_fragments())
        files = {fragment.path for fragment in fragments}
        recent = pc.field("finished_at") >= now - self.keep
        if self._rows is None or not self._seen <= files:  # first look, or files compacted away since
            self._rows = dataset.to_table(columns=CHART_COLUMNS, filter=recent)
        else:
            added = [fragment for fragment in fragments if fragment.path not in self._seen]
            if added:
                new = ds.FileSystemDataset(added, dataset.schema, dataset.format, dataset.filesystem)
                self._rows = pa.concat_tables([self._rows.filter(recent), new.to_table(columns=CHART_COLUMNS, filter=recent)])
        self._seen = files
        self._rows = self._rows.sort_by("finished_at")
        return self._rows
