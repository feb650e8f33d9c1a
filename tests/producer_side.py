"""Helpers for the producer-side tests: read the lakehouse with delta-rs."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from coordinator.tables import COMMIT_LOG


def commit_log_rows(lakehouse: str) -> list[dict]:
    """Every commit-log row, each with the ``_commit_version`` it was written in."""
    table = DeltaTable(COMMIT_LOG.path(lakehouse))
    return pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=0)).read_all().to_pylist()


def commit_log_version(lakehouse: str) -> int:
    return DeltaTable(COMMIT_LOG.path(lakehouse)).version()
