"""The kit's case ``grant`` (``--object-store`` only): a client started as one group with another group's
credentials is refused by the storage, and nothing of that group is stored; with its own group, it is delivered.
Only accounts can make it: the run's object store gives group A an account of its own, which the bucket policy
``txcoord grants`` makes allows group A's prefixes only (:mod:`.object_store`).
"""

from __future__ import annotations

from coordinator.conformance.client import Deadline, message
from coordinator.conformance.primitives import COMMIT, TOPIC, NewClient, Run, expect, expect_delivered

__all__ = ["GRANTED", "STRANGER", "case_grant"]

#: The group whose account the grant case uses, and the group it claims to be with it.
GRANTED, STRANGER = "conformance_grant_a", "conformance_grant_b"


def case_grant(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    """Group A's account cannot write as group B (refused by the storage: nothing of B stored); as group A it can."""
    config = run.object_store.granted_config
    stranger = new_client()
    reply = stranger.request({"op": "start", "config": str(config), "group": STRANGER})
    if reply.get("ok"):
        reply = stranger.request(stranger.send_op([message(TOPIC, b"conformance: outside the grant")], COMMIT))
    expect(reply.get("ok") is False and reply.get("error") in ("AccessDeniedError", "HalfNotStoredError")
           and reply.get("retriable") is not True,
           f"group A's account writing as group B: the client replied {reply}; expected AccessDeniedError "
           "(or HalfNotStoredError, not retriable) at start or at the send")
    halves = run.observed.halves(STRANGER)
    expect(not halves, f"system/half holds {len(halves)} half(s) of group B, written with group A's account")
    expect(not run.observed.log_records(STRANGER), "group B's commit log holds records written with group A's account")
    granted = new_client()
    granted.start(config, GRANTED)
    messages = [message(TOPIC, b"conformance: inside the grant")]
    expect_delivered(run, deadline, granted.send(messages, COMMIT), messages)
    granted.stop()
