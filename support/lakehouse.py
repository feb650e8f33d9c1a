"""A lakehouse's tables written and read directly with delta-rs, beside the product: rows appended as one
commit, a ``system/metrics`` row, and a producer committing steadily in a thread."""

from __future__ import annotations

import threading
from typing import Any, Optional

import pyarrow as pa
from deltalake import write_deltalake

from coordinator.tables import METRICS, TableDef
from support.records import half_record

__all__ = ["SteadyProducer", "append_rows", "metrics_row"]


def metrics_row(**values: Any) -> dict:
    """A ``system/metrics`` row of an idle batch (counts 0, no topic), with ``values`` set."""
    return {name: None if kind.startswith("map") else 0 for name, kind in METRICS.columns} | values


def append_rows(path: str, table: TableDef, rows: list[dict], storage: Optional[dict] = None) -> None:
    """Append ``rows`` (missing columns null) to a table with delta-rs, as one commit."""
    columns = {name: [row.get(name) for row in rows] for name in table.column_names}
    for name, values in columns.items():
        if name == "properties":
            columns[name] = [None if v is None else list(v.items()) for v in values]
    write_deltalake(path, pa.table(columns, schema=table.arrow_schema()), mode="append", storage_options=storage)


class SteadyProducer:
    """A producer of group ``group`` committing one half at a time to its commit log, ``pause_s`` apart (a
    compaction can win its commit between two), while in its ``with`` block; ``sent`` holds each transaction
    id once its commit is durable.

    Example::

        with SteadyProducer(lakehouse) as producer:
            producer.wait_for(20)
            maintain(lakehouse)
        read_table(...)  # == producer.sent, each once
    """

    def __init__(self, lakehouse, group: str = "g", pause_s: float = 0.05):
        self.lakehouse, self.group, self.pause_s = lakehouse, group, pause_s
        self.sent: list[str] = []
        self._stop = threading.Event()
        self._grown = threading.Condition()
        self._thread = threading.Thread(target=self._produce, name="steady-producer")

    def __enter__(self) -> "SteadyProducer":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _produce(self) -> None:
        from coordinator.producer.commit_log import CommitLogWriter

        with CommitLogWriter(self.lakehouse, self.group, commit_interval_ms=0) as writer:
            while not self._stop.is_set():
                transaction_id = f"t{len(self.sent)}"
                writer.submit([half_record(transaction_id, group=self.group)]).result()
                with self._grown:
                    self.sent.append(transaction_id)
                    self._grown.notify_all()
                self._stop.wait(self.pause_s)

    def wait_for(self, count: int, timeout_s: float = 120) -> None:
        """Until ``count`` transactions are durable (fails after ``timeout_s``: the producer is stuck)."""
        with self._grown:
            assert self._grown.wait_for(lambda: len(self.sent) >= count or not self._thread.is_alive(), timeout_s)
        assert len(self.sent) >= count, "the producer stopped"
