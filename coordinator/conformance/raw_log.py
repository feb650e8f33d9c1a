"""A commit log written raw, as a buggy or hostile writer of the group would: any bytes at all, each as the log's
next version. The kit's malformed neighbour, its checkpointed-log and protocol-version cases write through it,
and so do test support's poisons (``support/poisons.py``).

Example::

    log = RawCommitLog(lakehouse, "conformance_malformed_neighbour")
    log.records({"record_id": "r1", "kind": "BOGUS"})      # the version it landed at
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from coordinator.commit_logs import versions_written
from coordinator.doorbells import Doorbell
from coordinator.lakehouse import Lakehouse, create_table, delta_log_file
from coordinator.tables import COMMIT_LOG

__all__ = ["RawCommitLog"]


class RawCommitLog:
    """Group ``group``'s first commit log, written raw: any bytes at all, each as the log's next version.

    On object storage it rings the group's doorbell after its commits, as every writer of the protocol does:
    otherwise a group quiet for a while would have them read only at the checker's recheck, a minute later.
    """

    def __init__(self, lakehouse: Lakehouse, group: str) -> None:
        self.lakehouse, self.group = lakehouse, group
        self.key = f"{lakehouse.group_dir(group)}/commit_log"
        create_table(COMMIT_LOG, lakehouse.key_path(self.key), lakehouse.storage)
        self.files = lakehouse.files
        self._known = 0  # versions the log has at least: the search for the next one starts there, as a writer's does
        self._doorbell = None if lakehouse.is_local else Doorbell(lakehouse.files, group)

    def commit(self, data: bytes) -> int:
        """``data`` as the log's next version (the next free one: created only if absent); that version."""
        version = versions_written(self.files, self.key, known=self._known)
        while self.files.create(f"{self.key}/{delta_log_file(version)}", data) is None:
            version += 1
        self._known = version + 1
        if self._doorbell is not None:
            self._doorbell.landed()
        return version

    def add(self, path: str, commit_info: Optional[dict] = None) -> int:
        """A commit adding ``path`` (as written, unencoded) with new data, after a ``commitInfo`` action of
        ``commit_info``'s fields if given; its version."""
        add = {"add": {"path": path, "size": 1, "partitionValues": {}, "modificationTime": 0, "dataChange": True}}
        actions = [add] if commit_info is None else [{"commitInfo": commit_info}, add]
        return self.commit("".join(json.dumps(action) + "\n" for action in actions).encode())

    def data_file(self, data: bytes) -> str:
        """``data`` as a new file of the log's directory; its path there."""
        name = f"part-{uuid.uuid4().hex}.parquet"
        self.files.put(f"{self.key}/{name}", data)
        return name

    def parquet(self, table: pa.Table) -> str:
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return self.data_file(buffer.getvalue())

    def records(self, *rows: dict, commit_info: Optional[dict] = None) -> int:
        """A well-formed commit of ``rows`` (commit-log records, missing columns null), its ``commitInfo`` as
        :meth:`add` takes it; its version."""
        columns = {name: [row.get(name) for row in rows] for name in COMMIT_LOG.column_names}
        columns["properties"] = [list((value or {}).items()) for value in columns["properties"]]
        return self.add(self.parquet(pa.table(columns, schema=COMMIT_LOG.arrow_schema())), commit_info)

    def half(self, topic: str, **overrides: object) -> dict:
        """A well-formed HALF of this log's group, a transaction of one message to ``topic`` (a new time-ordered
        id), with ``overrides``: what a case changes to make it malformed."""
        from coordinator.producer.transaction_producer import time_ordered_id

        return {"record_id": uuid.uuid4().hex, "kind": "HALF", "transaction_id": time_ordered_id(),
                "producer_group": self.group, "msg_id": uuid.uuid4().hex, "message_index": 0, "message_count": 1,
                "topic": topic, "keys": "raw", "body": b"raw", "born_timestamp": dt.datetime.now(dt.timezone.utc)
                } | overrides

    def instance_record(self, name: str, data: bytes) -> str:
        """``data`` as ``_producers/<name>`` of the group; its key."""
        key = f"{self.lakehouse.group_dir(self.group)}/_producers/{name}"
        self.files.put(key, data)
        return key
