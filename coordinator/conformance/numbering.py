"""The kit's case ``log_numbering`` (docs/protocol.md, "Creating a commit log": a client creates every missing
log of its group numbered below its own before it writes). Two other instances of the client's group are live
and hold the group's logs 0 and 1, and neither has written yet: the client claims log 2 and must create logs 0
and 1 (as far as version 0) first. The checker finds a group's logs by looking for the next number, so a client that
skips this leaves a gap that hides its own log: its messages are never delivered while its sends say stored.
"""

from __future__ import annotations

import uuid

from coordinator.commit_logs import CommitLogRef, committed
from coordinator.conformance.client import Deadline, message
from coordinator.conformance.primitives import COMMIT, TOPIC, NewClient, Run, expect, expect_delivered, group_of, started
from coordinator.control.instances import ProducerInstances
from coordinator.exceptions import ConformanceKitError

__all__ = ["case_log_numbering"]

CASE = "log_numbering"
#: Live instances of the group, each holding a log of its own and writing nothing, before the client starts.
OTHERS = 2
#: Their records' heartbeat: live for the whole case (three heartbeats) without being renewed.
OTHERS_HEARTBEAT_S = 600.0


def case_log_numbering(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    group = group_of(CASE)
    instances = ProducerInstances(run.lakehouse)
    for number in range(OTHERS):
        other = f"conformance-other-{uuid.uuid4().hex}"
        instances.announce(group, other, OTHERS_HEARTBEAT_S)
        claimed = instances.claim_log(group, other)
        if claimed.number != number:
            raise ConformanceKitError(f"the kit's instance {other} claimed {claimed.key}, not log {number}")
    client = started(run, new_client, CASE)
    sent = [message(TOPIC, b"conformance: a log above the others'", keys="numbering")]
    stored = client.send(sent, COMMIT)
    below = [CommitLogRef.of_group(group, number).key for number in range(OTHERS)]
    missing = [key for key in below if not committed(run.lakehouse.files, key, 0)]
    expect(not missing, f"the client wrote its transaction {stored['transaction_id']} with {', '.join(missing)} "
                        "missing: the checker finds a group's logs by the next number, so it never reads a log above a "
                        "gap (create every missing log below the client's own, as far as version 0, before writing)")
    expect_delivered(run, deadline, stored, sent)
    client.stop()
