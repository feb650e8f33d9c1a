"""The checker's writes: one idempotent delta-rs append per table per batch, from the driver.

Each append carries the Delta application transaction ``(app_id, batch_id)``, as Spark's
``txnAppId``/``txnVersion`` would. Only the lease holder writes these tables, so which
batch each table last received is known without asking Delta on every batch: it is read
from the table once (the first write after a start or a rebuild) and then kept. A replayed
batch finds its earlier writes recorded and skips them.

delta-rs from the driver costs a few milliseconds per append where a Spark append costs a
job and, for an idempotent one, a rebuild of the table's state (delta-spark 4.4).

Example::

    writer = TableWriter("lakehouse", app_id="txcoord-checker")
    writer.append(OP.path("lakehouse"), ops, batch_id=12)   # the version written, or None on a replay
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Optional

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError


log = logging.getLogger("coordinator.checker")

_WRITE_ATTEMPTS = 10


class TableWriter:
    """Idempotent appends to the checker's tables (see the module's docstring)."""

    def __init__(self, app_id: str):
        self.app_id = app_id
        self._tables: dict[str, DeltaTable] = {}
        self._written: dict[str, int] = {}  # path -> last batch id appended there

    def append(self, path: str, data: pa.Table, batch_id: int) -> Optional[int]:
        """Append ``data`` to the table at ``path`` as batch ``batch_id``'s write; return the
        version written, or ``None`` if this batch's write is there already. A table that does
        not exist yet (a topic's, before its first delivery) is created by this append.

        An append that loses to a concurrent metadata change (``txcoord maintain`` setting a
        table property) is tried again on the new snapshot: it changes no data.
        """
        delta = self._table(path)
        if self._written[path] >= batch_id:
            return None
        properties = CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)])
        if delta is None:
            write_deltalake(path, data, mode="append", commit_properties=properties)
            delta = self._tables[path] = DeltaTable(path)
        else:
            self._append(delta, data, batch_id, properties)
        self._written[path] = batch_id
        return delta.version()

    def _append(self, delta: DeltaTable, data: pa.Table, batch_id: int, properties: CommitProperties) -> None:
        for attempt in range(1, _WRITE_ATTEMPTS + 1):
            try:
                write_deltalake(delta, data, mode="append", commit_properties=properties)
                return
            except CommitFailedError:
                if attempt == _WRITE_ATTEMPTS:
                    raise
                log.warning("batch %d: append to %s lost to a concurrent change; attempt %d of %d",
                            batch_id, delta.table_uri, attempt + 1, _WRITE_ATTEMPTS)
                time.sleep(0.05 * attempt)
                delta.update_incremental()
                if (delta.transaction_version(self.app_id) or -1) >= batch_id:
                    return

    def _table(self, path: str) -> Optional[DeltaTable]:
        if path not in self._written:
            delta = DeltaTable(path) if DeltaTable.is_deltatable(path) else None
            recorded = None if delta is None else delta.transaction_version(self.app_id)
            self._written[path] = -1 if recorded is None else recorded
            if delta is not None:
                self._tables[path] = delta
        return self._tables.get(path)


def files_written_at_us(path: str, version: int) -> int:
    """When the data files that version ``version`` of the table at ``path`` added were written
    (their ``modificationTime``, which Spark reads as ``_metadata.file_modification_time``)."""
    log_file = os.path.join(path, "_delta_log", f"{version:020d}.json")
    with open(log_file) as lines:
        actions = [json.loads(line) for line in lines if line.strip()]
    times = [action["add"]["modificationTime"] for action in actions if "add" in action]
    return max(times) * 1000
