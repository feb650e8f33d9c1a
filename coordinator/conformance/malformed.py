"""The kit's malformed client (issue 55, point 5): a writer that appends malformed records, raw
(:class:`~coordinator.conformance.raw_log.RawCommitLog`), to the first commit log of the client under test's own
group, beside it, as a buggy or hostile instance of the group would. The checker must refuse exactly those, each
with its reason in ``system/rejected``, and deliver every transaction of the client all the same.

Example::

    neighbour = MalformedWriter(lakehouse, "conformance_malformed_neighbour", "CONFORMANCE")
    neighbour.append_all(client_transaction_id)   # {(commit log, version): the reason the checker must give}
"""

from __future__ import annotations

import uuid
from typing import Callable, Optional

import pyarrow as pa

from coordinator.conformance.client import Deadline, message
from coordinator.conformance.primitives import COMMIT, TOPIC, NewClient, Run, expect, expect_delivered, group_of, started
from coordinator.conformance.raw_log import RawCommitLog
from coordinator.lakehouse import Lakehouse

__all__ = ["MalformedWriter", "case_malformed_neighbour"]

CASE = "malformed_neighbour"


class MalformedWriter:
    """Malformed records for ``group``'s first log (shared with the client under test, its first instance)."""

    def __init__(self, lakehouse: Lakehouse, group: str, topic: str):
        self.log = RawCommitLog(lakehouse, group)
        self.group, self.topic = group, topic

    def _half(self, transaction_id: Optional[str], **overrides: object) -> dict:
        fields = {"topic": self.topic, "keys": "malformed", "body": b"malformed"} | overrides
        return self.log.half(**fields) | ({"transaction_id": transaction_id} if transaction_id else {})

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


def case_malformed_neighbour(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    """The client sends before and after its malformed neighbour writes; only the neighbour is refused."""
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
