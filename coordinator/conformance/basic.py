"""The kit's first cases (docs/protocol.md#the-cases): a send and its outcome, the check-back, several topics in
one transaction, a crash after the half, a late END, the limits and the name rule, and the instance record's
routing of checks. Each drives the client under test, then asserts what the checker really did.
"""

from __future__ import annotations

from coordinator.conformance.client import ClientProcess, Deadline, message
from coordinator.conformance.primitives import (COMMIT, HANG, KIT_SETTINGS, OTHER_TOPIC, ROLLBACK, TOPIC, UNKNOW, NewClient,
                                                Run, expect, expect_delivered, expect_nothing_delivered, expect_outcome,
                                                group_of, started)
from coordinator.validation import MAX_BODY_BYTES

__all__ = ["case_check_commit", "case_check_rollback", "case_commit", "case_crash_after_half", "case_heartbeat_routing",
           "case_late_end", "case_multi_topic", "case_name_rule", "case_rollback", "case_size_limit"]

LATE_END = "arrived after the immunity time: wait for check"


def case_commit(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, "commit")
    unknown = client.request({"op": "conformance_no_such_op"})
    expect((unknown.get("ok"), unknown.get("error")) == (False, "UnknownOp"),
           f"an unknown op got {unknown}; expected ok false, error UnknownOp")
    messages = [message(TOPIC, b"conformance: commit", keys="order-1", tags="created", properties={"origin": "kit"})]
    sent = client.send(messages, COMMIT, check_state=ROLLBACK)
    expect_outcome(run, deadline, sent["transaction_id"], "COMMIT", by_check=False)
    expect_delivered(run, deadline, sent, messages)
    client.stop()


def case_rollback(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, "rollback")
    sent = client.send([message(TOPIC, b"conformance: rollback")], ROLLBACK, check_state=COMMIT)
    expect_outcome(run, deadline, sent["transaction_id"], "ROLLBACK", by_check=False)
    expect_nothing_delivered(run, sent["transaction_id"])
    client.stop()


def checked_back(run: Run, deadline: Deadline, new_client: NewClient, case: str, answer: str) -> None:
    """An UNKNOW local transaction, decided by the check's ``answer``."""
    client = started(run, new_client, case)
    messages = [message(TOPIC, f"conformance: {case}".encode(), keys=case)]
    sent = client.send(messages, UNKNOW, check_state=answer)
    transaction_id = sent["transaction_id"]
    asked = client.wait_event("check", f"a check of {transaction_id}", transaction_id=transaction_id)
    expect((asked.get("msg_id"), asked.get("topic")) == (sent["msg_ids"][0], TOPIC),
           f"the check handed the listener message {asked.get('msg_id')!r} of topic {asked.get('topic')!r}; "
           f"the transaction's first is {sent['msg_ids'][0]} of {TOPIC}")
    outcome = "COMMIT" if answer == COMMIT else "ROLLBACK"
    expect_outcome(run, deadline, transaction_id, outcome, by_check=True)
    if answer == COMMIT:
        expect_delivered(run, deadline, sent, messages)
    else:
        expect_nothing_delivered(run, transaction_id)
    client.stop()


def case_check_commit(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    checked_back(run, deadline, new_client, "check_commit", COMMIT)


def case_check_rollback(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    checked_back(run, deadline, new_client, "check_rollback", ROLLBACK)


def case_multi_topic(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, "multi_topic")
    committed = [message(TOPIC, b"first", keys="m-1"), message(OTHER_TOPIC, b"second", keys="m-2"),
                 message(TOPIC, b"third", keys="m-3", tags="last")]
    sent = client.send(committed, COMMIT)
    rolled_back = client.send([message(TOPIC, b"not this"), message(OTHER_TOPIC, b"nor this")], ROLLBACK)
    expect_outcome(run, deadline, sent["transaction_id"], "COMMIT", by_check=False)
    expect_delivered(run, deadline, sent, committed)
    offsets = [row["queue_offset"] for topic in (TOPIC, OTHER_TOPIC)
               for row in run.observed.delivered(topic, sent["transaction_id"])]
    expect(len(set(offsets)) == 3, f"the three messages have queue offsets {offsets}; expected three distinct")
    expect_outcome(run, deadline, rolled_back["transaction_id"], "ROLLBACK", by_check=False)
    expect_nothing_delivered(run, rolled_back["transaction_id"], (TOPIC, OTHER_TOPIC))
    client.stop()


def case_crash_after_half(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    first = started(run, new_client, "crash_after_half")
    messages = [message(TOPIC, b"conformance: crash after the half", keys="crash")]
    op = first.send_op(messages, HANG)
    first.post(op)
    executing = first.wait_event("executing", "the local transaction to start", request=op["request"])
    transaction_id = executing.get("transaction_id")
    expect(transaction_id, f"the executing event names no transaction: {executing}")
    first.kill()
    second = started(run, new_client, "crash_after_half")
    second.answer(transaction_id, COMMIT)
    second.wait_event("check", f"a check of {transaction_id} at the second instance", transaction_id=transaction_id)
    row = expect_outcome(run, deadline, transaction_id, "COMMIT", by_check=True)
    request = next((r for r in run.observed.check_requests(transaction_id) if r["check_id"] == row["check_id"]), None)
    expect(request is not None, f"no check request {row['check_id']} in system/check_requests")
    expect(request["producer_instance"] in (None, second.instance_id),
           f"the deciding check {row['check_id']} was addressed to {request['producer_instance']}, "
           f"not to the live instance {second.instance_id}")
    rows = deadline.wait_for(lambda: run.observed.delivered(TOPIC, transaction_id), f"{transaction_id} in topics/{TOPIC}")
    expect(len(rows) == 1 and rows[0]["body"] == b"conformance: crash after the half",
           f"topics/{TOPIC} holds {len(rows)} row(s) of the crashed transaction")
    second.stop()


def case_late_end(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, "late_end")
    delay_ms = 3 * KIT_SETTINGS["transaction_timeout_ms"]
    sent = client.send([message(TOPIC, b"conformance: late END", keys="late")], COMMIT, UNKNOW, delay_ms=delay_ms)
    transaction_id = sent["transaction_id"]
    refused = deadline.wait_for(lambda: [row for row in run.observed.rejected(transaction_id) if row["kind"] == "END"],
                                f"system/rejected to refuse the late END of {transaction_id}")
    expect([row["reason"] for row in refused] == [LATE_END] and refused[0]["check_id"] is None
           and refused[0]["state"] == COMMIT,
           f"system/rejected holds {[(r['state'], r['check_id'], r['reason']) for r in refused]} for the END of "
           f"{transaction_id}; expected its own COMMIT refused as {LATE_END!r}")
    expect(run.observed.outcome(transaction_id) is None, f"{transaction_id} was decided by its late END")
    client.answer(transaction_id, ROLLBACK)
    expect_outcome(run, deadline, transaction_id, "ROLLBACK", by_check=True)
    expect(client.events("check", transaction_id=transaction_id), f"the client reported no check of {transaction_id}")
    expect_nothing_delivered(run, transaction_id)
    client.stop()


def refused_at_client(client: ClientProcess, messages: list[dict], what: str) -> None:
    """A send the client must refuse with ``MessageValidationError``, not retriable."""
    reply = client.request(client.send_op(messages, COMMIT))
    expect(reply.get("ok") is False and reply.get("error") == "MessageValidationError" and reply.get("retriable") is False,
           f"{what}: the client replied {({k: reply.get(k) for k in ('ok', 'error', 'retriable')})}; "
           "expected MessageValidationError, not retriable")


def expect_only_marker(run: Run, deadline: Deadline, client: ClientProcess, case: str) -> None:
    """A valid send after the refused ones; once it is delivered, the checker holds nothing else of the group."""
    messages = [message(TOPIC, f"conformance: {case} marker".encode())]
    marker = client.send(messages, COMMIT)
    expect_delivered(run, deadline, marker, messages)
    others = {row["transaction_id"] for row in run.observed.halves(group_of(case))} - {marker["transaction_id"]}
    expect(not others, f"system/half holds transaction(s) {sorted(others)} the client should have refused")
    rejected = run.observed.rejected_from(group_of(case))
    expect(not rejected, f"system/rejected holds {[row['reason'] for row in rejected]} from the group")


def case_size_limit(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, "size_limit")
    refused_at_client(client, [message(TOPIC, b"x" * (MAX_BODY_BYTES + 1))], f"a body of {MAX_BODY_BYTES + 1} bytes")
    refused_at_client(client, [message(TOPIC, b"")], "an empty body")
    expect_only_marker(run, deadline, client, "size_limit")
    client.stop()


def case_name_rule(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, "name_rule")
    for topic in ("bad topic", "a/../b", "%41", "T" * 128, "", "T\n"):
        refused_at_client(client, [message(topic, b"conformance: name rule")], f"topic {topic!r}")
    expect_only_marker(run, deadline, client, "name_rule")
    client.stop()


def case_heartbeat_routing(run: Run, deadline: Deadline, new_client: NewClient) -> None:
    client = started(run, new_client, "heartbeat_routing")
    group = group_of("heartbeat_routing")
    first = deadline.wait_for(lambda: run.observed.instance(group, client.instance_id),
                              f"a live instance record of {client.instance_id} in groups/{group}/_producers")
    deadline.wait_for(lambda: getattr(run.observed.instance(group, client.instance_id), "last_seen", 0) > first.last_seen,
                      f"the instance record of {client.instance_id} to be renewed")
    sent = client.send([message(TOPIC, b"conformance: routed check")], UNKNOW, check_state=COMMIT)
    transaction_id = sent["transaction_id"]
    expect_outcome(run, deadline, transaction_id, "COMMIT", by_check=True)
    addressed = [row["producer_instance"] for row in run.observed.check_requests(transaction_id)]
    expect(addressed and set(addressed) == {client.instance_id},
           f"the checks of {transaction_id} were addressed to {addressed}; the group's one live instance is "
           f"{client.instance_id}")
    client.stop()
