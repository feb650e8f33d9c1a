"""Delta logs read as files (no JVM, no delta-rs dataset), on a local disk or object storage: a table's
versions and commits, when each transaction reached a topic table, and how big a table's log has grown.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Iterator, Mapping, NamedTuple, Optional, Union
from urllib.parse import unquote

if TYPE_CHECKING:
    from coordinator.lakehouse import Lakehouse

__all__ = ["Delivery", "TopicFollower", "commits", "deliveries", "delta_log_size", "latest_version", "log_versions",
           "table_shape"]




def log_versions(table_path: str, storage: Optional[Mapping[str, str]] = None) -> list[int]:
    """The commit versions whose JSON is in ``_delta_log`` (log cleanup removes old ones); ``storage``
    reaches a table on object storage (``s3://...``)."""
    from coordinator.storage import FileStore

    names = (key.rsplit("/", 1)[-1] for key in FileStore.at(table_path, storage).list("_delta_log"))
    return sorted(int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit())


def latest_version(table_path: str, storage: Optional[Mapping[str, str]] = None) -> int:
    """The table's latest version, from the highest ``_delta_log/<version>.json`` (-1 if none)."""
    return max(log_versions(table_path, storage), default=-1)


def commits(table_path: str, storage: Optional[Mapping[str, str]] = None, from_version: int = 0) -> list[dict]:
    """Every commit from ``from_version`` on whose JSON is still in the log: ``version``, ``timestamp_ms``
    (commitInfo), ``log_mtime`` (when the JSON file was written, in seconds: on object storage its
    Last-Modified, whole seconds rounded up) and the data files it ``added`` (paths relative to the table)."""
    from coordinator.lakehouse.deltalog import commit_actions
    from coordinator.storage import FileStore

    files = FileStore.at(table_path, storage)
    result = []
    for version in log_versions(table_path, storage):
        if version < from_version:
            continue
        log_file = files.read(f"_delta_log/{version:020d}.json")
        if log_file is None:  # removed by log cleanup since it was listed
            continue
        timestamp_ms, added = None, []
        for action in commit_actions(log_file.data):
            if "commitInfo" in action:
                timestamp_ms = action["commitInfo"].get("timestamp")
            elif "add" in action and action["add"].get("dataChange", True):
                added.append(unquote(action["add"]["path"]))
        result.append({"version": version, "timestamp_ms": timestamp_ms, "log_mtime": log_file.modified_ms / 1000,
                       "added": added})
    return result


class Delivery(NamedTuple):
    """When a transaction's message became readable in its topic table, and how many rows it has there."""

    timestamp_s: float  # commitInfo timestamp of the topic version that first held it
    log_mtime: float  # when that version's log file was written
    rows: int


def deliveries(lakehouse: Union[str, Lakehouse], topic: str) -> dict[str, Delivery]:
    """Transaction id → :class:`Delivery`, for every transaction in the topic table's log (none before
    the table exists)."""
    found: dict[str, Delivery] = {}
    for tid, timestamp_s, log_mtime in TopicFollower(lakehouse, topic).read_new():
        first = found.get(tid)
        found[tid] = Delivery(timestamp_s, log_mtime, 1) if first is None else first._replace(rows=first.rows + 1)
    return found


class TopicFollower:
    """Reads a topic table's log as it grows: each :meth:`read_new` reads only the versions written since the
    last call. Log cleanup (maintenance's ``log_retention_hours``) removes old JSON commits, so a run with
    maintenance on must follow the log while it runs, not read it all at the end; ``versions_missed`` counts
    the versions cleaned up before they were read.

    Example::

        follower = TopicFollower(lakehouse, "ORDERS")
        for transaction_id, timestamp_s, log_mtime in follower.read_new():  # every few seconds
            ...
    """

    def __init__(self, lakehouse: Union[str, Lakehouse], topic: str):
        from coordinator.lakehouse import Lakehouse
        from coordinator.storage import FileStore

        self.lakehouse = Lakehouse.at(lakehouse)
        self.table_path = self.lakehouse.topic(topic)
        self.files = FileStore.at(self.table_path, self.lakehouse.storage)
        self.next_version = 0
        self.versions_missed = 0

    def read_new(self) -> Iterator[tuple[str, float, float]]:
        """``(transaction id, commit timestamp of its version in seconds, that version's log file mtime)`` for
        each row the versions written since the last call added (none before the table exists)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        for commit in commits(self.table_path, self.lakehouse.storage, from_version=self.next_version):
            tids = []
            if commit["timestamp_ms"] is not None:
                for path in commit["added"]:
                    data = pa.BufferReader(self.files.read(path).data)
                    tids += pq.read_table(data, columns=["transaction_id"]).column("transaction_id").to_pylist()
            # Only once the whole version is read: a read that fails is tried again, whole, by the next call.
            self.versions_missed += commit["version"] - self.next_version
            self.next_version = commit["version"] + 1
            for tid in tids:
                yield tid, commit["timestamp_ms"] / 1000, commit["log_mtime"]


def delta_log_size(table_path: str) -> Optional[dict]:
    """A local table's ``_delta_log``: JSON commits, checkpoints, both together (``log_files``) and the bytes
    of everything in it (``log_bytes``); ``None`` before the table exists. A stat per file: at a few hundred
    thousand files, a fraction of a second."""
    log_dir = os.path.join(table_path, "_delta_log")
    if not os.path.isdir(log_dir):
        return None
    json_files = checkpoints = log_bytes = 0
    with os.scandir(log_dir) as entries:
        for entry in entries:
            name = entry.name
            if name.endswith(".json") and name[:-5].isdigit():
                json_files += 1
            elif ".checkpoint." in name and name.endswith(".parquet"):
                checkpoints += 1
            with contextlib.suppress(FileNotFoundError):  # removed by log cleanup since it was listed
                log_bytes += entry.stat().st_size if entry.is_file() else 0
    return {"log_json_files": json_files, "checkpoints": checkpoints, "log_files": json_files + checkpoints,
            "log_bytes": log_bytes}


def table_shape(table_path: str) -> dict:
    """How big a table's log and file set are: its version, JSON commits in ``_delta_log``, checkpoints,
    both together and the bytes of the whole ``_delta_log`` (:func:`delta_log_size`), data files in the
    current snapshot and Parquet files on disk (those not yet vacuumed)."""
    from deltalake import DeltaTable

    log = delta_log_size(table_path)
    if log is None:
        return {"exists": False}
    on_disk = sum(1 for _, _, files in os.walk(table_path) for name in files
                  if name.endswith(".parquet") and "_delta_log" not in name)
    table = DeltaTable(table_path)
    return {
        "exists": True,
        "version": table.version(),
        **log,
        "active_files": len(table.file_uris()),
        "parquet_files_on_disk": on_disk,
    }

