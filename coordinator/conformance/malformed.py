"""The kit's malformed client (issue 55, point 5): a writer that appends malformed records, raw, to the first
commit log of the client under test's own group, beside it, as a buggy or hostile instance of the group would.
The checker must refuse exactly those, each with its reason in ``system/rejected``, and deliver every
transaction of the client all the same.

:class:`RawCommitLog` writes any bytes as a log's next version (test support's poisons write through it too).

Example::

    neighbour = MalformedWriter(lakehouse, "conformance_malformed_neighbour", "CONFORMANCE")
    neighbour.append_all(client_transaction_id)   # {(commit log, version): the reason the checker must give}
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from typing import Callable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from coordinator.commit_logs import versions_written
from coordinator.conformance.client import ClientProcess, Deadline, message
from coordinator.doorbells import Doorbell
from coordinator.lakehouse import Lakehouse, create_table, delta_log_file
from coordinator.tables import COMMIT_LOG

__all__ = ["MalformedWriter", "RawCommitLog", "case_malformed_neighbour"]

CASE = "malformed_neighbour"


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

    def add(self, path: str) -> int:
        """A commit adding ``path`` (as written, unencoded) with new data; its version."""
        return self.commit(json.dumps({"add": {"path": path, "size": 1, "partitionValues": {}, "modificationTime": 0,
                                               "dataChange": True}}).encode())

    def data_file(self, data: bytes) -> str:
        """``data`` as a new file of the log's directory; its path there."""
        name = f"part-{uuid.uuid4().hex}.parquet"
        self.files.put(f"{self.key}/{name}", data)
        return name

    def parquet(self, table: pa.Table) -> str:
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return self.data_file(buffer.getvalue())

    def records(self, *rows: dict) -> int:
        """A well-formed commit of ``rows`` (commit-log records, missing columns null); its version."""
        columns = {name: [row.get(name) for row in rows] for name in COMMIT_LOG.column_names}
        columns["properties"] = [list((value or {}).items()) for value in columns["properties"]]
        return self.add(self.parquet(pa.table(columns, schema=COMMIT_LOG.arrow_schema())))

    def instance_record(self, name: str, data: bytes) -> str:
        """``data`` as ``_producers/<name>`` of the group; its key."""
        key = f"{self.lakehouse.group_dir(self.group)}/_producers/{name}"
        self.files.put(key, data)
        return key


class MalformedWriter:
    """Malformed records for ``group``'s first log (shared with the client under test, its first instance)."""

    def __init__(self, lakehouse: Lakehouse, group: str, topic: str):
        self.log = RawCommitLog(lakehouse, group)
        self.group, self.topic = group, topic

    def _half(self, transaction_id: Optional[str], **overrides: object) -> dict:
        from coordinator.producer.transaction_producer import time_ordered_id

        return {"record_id": uuid.uuid4().hex, "kind": "HALF", "transaction_id": transaction_id or time_ordered_id(),
                "producer_group": self.group, "msg_id": uuid.uuid4().hex, "message_index": 0, "message_count": 1,
                "topic": self.topic, "keys": "malformed", "body": b"malformed",
                "born_timestamp": dt.datetime.now(dt.timezone.utc)} | overrides

    def writes(self, client_transaction_id: str) -> list[tuple[Callable[[], int], str]]:
        """Each malformed commit (written when called: its version), with what the reason the checker must
        refuse it for says."""
        other = f"{self.group}_other"
        lacking = pa.table({"record_id": [uuid.uuid4().hex], "kind": ["HALF"], "transaction_id": ["t"]})
        return [
            (lambda: self.log.records(self._half(None, producer_group=other)),
             f"stored in producer group '{self.group}''s commit log but names producer group '{other}'"),
            (lambda: self.log.records(self._half(None, kind="BOGUS")), "unknown record kind 'BOGUS'"),
            (lambda: self.log.records(self._half(None, msg_id=None, topic=None)), "missing msg_id"),
            (lambda: self.log.add(self.log.parquet(lacking)), "lacks the commit log's column(s) producer_group, msg_id"),
            (lambda: self.log.records(self._half(client_transaction_id)), "duplicate transaction_id"),
        ]

    def append_all(self, client_transaction_id: str) -> dict[tuple[str, int], str]:
        """Write each malformed commit; ``{(commit log key, version): reason}``."""
        return {(self.log.key, write()): reason for write, reason in self.writes(client_transaction_id)}


def case_malformed_neighbour(run, deadline: Deadline, new_client: Callable[[], ClientProcess]) -> None:
    """The client sends before and after its malformed neighbour writes; only the neighbour is refused."""
    from coordinator.conformance.cases import COMMIT, TOPIC, expect, expect_delivered, group_of, started

    client = started(run, new_client, CASE)
    sends = []

    def send(body: bytes) -> None:
        messages = [message(TOPIC, body, keys="neighbour")]
        sends.append((client.send(messages, COMMIT), messages))

    send(b"before the neighbour")
    expect_delivered(run, deadline, *sends[0])  # delivered first: the neighbour's reuse of its id is the duplicate
    expected = MalformedWriter(run.lakehouse, group_of(CASE), TOPIC).append_all(sends[0][0]["transaction_id"])
    send(b"after the neighbour, 1")
    send(b"after the neighbour, 2")
    for sent, messages in sends:
        expect_delivered(run, deadline, sent, messages)

    def refused() -> list[dict]:
        rows = run.observed.rejected_from(group_of(CASE))
        return rows if expected.keys() <= {(row["commit_log"], row["commit_version"]) for row in rows} else []

    rows = deadline.wait_for(refused, "system/rejected to refuse each of the malformed writer's commits")
    strangers = [row for row in rows if (row["commit_log"], row["commit_version"]) not in expected]
    expect(not strangers, f"system/rejected refused records of the client: "
                          f"{[(row['transaction_id'], row['reason']) for row in strangers]}")
    for row in rows:
        reason = expected[(row["commit_log"], row["commit_version"])]
        expect(reason in (row["reason"] or ""),
               f"version {row['commit_version']} of {row['commit_log']} refused as {row['reason']!r}; expected {reason!r}")
    client.stop()
