"""The kit's malformed client (issue 55, point 5): a writer that appends malformed records to the commit log of
the client under test's own group, beside it. The checker must refuse exactly those, each with its reason in
``system/rejected``, and deliver every transaction of the client all the same.

Example::

    neighbour = MalformedWriter(lakehouse, "conformance_malformed_neighbour")
    neighbour.append_all(client_transaction_id)   # {record_id: the reason the checker must give}
"""

from __future__ import annotations

import uuid
from typing import Callable

from coordinator.commit_logs import CommitLogRef
from coordinator.conformance.client import ClientProcess, Deadline, message
from coordinator.lakehouse import Lakehouse
from coordinator.producer.commit_log import CommitLogWriter, half_records
from coordinator.producer.message import Message
from coordinator.producer.transaction_producer import time_ordered_id

__all__ = ["MalformedWriter", "case_malformed_neighbour"]

CASE = "malformed_neighbour"


class MalformedWriter:
    """Appends to the first commit log of ``group`` (the one its first instance claims: shared with it)."""

    def __init__(self, lakehouse: Lakehouse, group: str, topic: str):
        self.lakehouse, self.group, self.topic = lakehouse, group, topic

    def _half(self, transaction_id: str, **overrides: object) -> dict:
        msg = Message(self.topic, b"malformed", keys="malformed")
        msg.msg_id = uuid.uuid4().hex
        return half_records(self.group, transaction_id, [msg])[0] | overrides

    def records(self, client_transaction_id: str) -> list[tuple[dict, str]]:
        """Each malformed record, with the start of the reason the checker must refuse it for."""
        other = f"{self.group}_other"
        return [
            (self._half(time_ordered_id(), producer_group=other),
             f"stored in producer group '{self.group}''s commit log but names producer group '{other}'"),
            (self._half(time_ordered_id(), kind="BOGUS"), "unknown record kind 'BOGUS'"),
            (self._half(time_ordered_id(), msg_id=None, topic=None), "missing msg_id"),
            (self._half(client_transaction_id), "duplicate transaction_id"),
        ]

    def append_all(self, client_transaction_id: str) -> dict[str, str]:
        """Append each record in a commit of its own; ``{record_id: reason}``."""
        expected = {}
        with CommitLogWriter(self.lakehouse, CommitLogRef.of_group(self.group)) as writer:
            for record, reason in self.records(client_transaction_id):
                writer.submit([record]).result(timeout=120)
                expected[record["record_id"]] = reason
        return expected


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
    refused = deadline.wait_for(lambda: (rows := run.observed.rejected_from(group_of(CASE)))
                                and expected.keys() <= {row["record_id"] for row in rows} and rows,
                                "system/rejected to refuse each of the malformed writer's records")
    strangers = [row for row in refused if row["record_id"] not in expected]
    expect(not strangers, f"system/rejected refused records of the client: "
                          f"{[(row['transaction_id'], row['reason']) for row in strangers]}")
    for row in refused:
        expect((row["reason"] or "").startswith(expected[row["record_id"]]),
               f"record {row['record_id']} refused as {row['reason']!r}; expected {expected[row['record_id']]!r}")
    client.stop()
