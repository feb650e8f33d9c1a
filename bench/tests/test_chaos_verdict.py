"""The chaos harness's verdict (``bench/chaos/verify.py``), step by step on rows made by hand: each invariant's
step finds the violation it exists for, and nothing in a lakehouse that keeps the invariants."""

from __future__ import annotations

import datetime as dt

from bench.chaos.hostile import BadInput
from bench.chaos.producer import COMMITTED, REVIEW, body_of
from bench.chaos.verify import (
    Findings,
    GroundTruth,
    Tables,
    _check_times,
    _deliveries,
    _halves_on_the_way_in,
    _outcomes,
    _refusals,
)

UTC = dt.timezone.utc
STORED = dt.datetime(2026, 11, 25, 6, 0, tzinfo=UTC)
GROUP = "chaos_p0"


def truth_of(**status: str) -> GroundTruth:
    """Producers' databases where each transaction ``t`` sent one message ``m-<t>`` to CHAOS_ORDERS."""
    truth = GroundTruth(status=dict(status))
    for transaction_id in ("t1", "t2", "t3"):
        truth.messages[f"m-{transaction_id}"] = {"transaction_id": transaction_id, "topic": "CHAOS_ORDERS",
                                                 "body": transaction_id.encode()}
    return truth


def topic_row(transaction_id: str, body: bytes = b"") -> dict:
    return {"transaction_id": transaction_id, "msg_id": f"m-{transaction_id}", "topic": "CHAOS_ORDERS",
            "body": body or transaction_id.encode()}


def half(transaction_id: str, plan_id: str, group: str = GROUP, offset: int = 0) -> dict:
    return {"transaction_id": transaction_id, "producer_group": group, "queue_offset": offset,
            "msg_id": f"m-{transaction_id}", "message_index": 0, "body": body_of(plan_id, 0),
            "stored_timestamp": STORED, "immunity_ms": 6000}


def test_deliveries_find_lost_duplicated_leaked_and_altered_messages():
    truth = truth_of(t1=COMMITTED, t2=COMMITTED)  # t3 never committed locally
    findings = Findings()
    _deliveries(findings, truth, [topic_row("t1"), topic_row("t1"), topic_row("t3"), topic_row("t2", b"tampered")])

    assert dict(findings.found) == {"duplicated": 1, "leaked": 2}  # t2 is there, but altered
    findings = Findings()
    _deliveries(findings, truth, [topic_row("t1")])
    assert dict(findings.found) == {"lost": 1} and "transaction t2 committed locally" in findings.examples["lost"][0]

    findings = Findings()
    _deliveries(findings, truth, [topic_row("t1"), topic_row("t2")])
    assert not findings.found


def test_halves_on_the_way_in_find_a_lost_half_a_false_not_stored_and_a_double_commit():
    truth = truth_of()
    truth.not_stored = ["p0-00001"]
    truth.returned = {"t9": "COMMIT_MESSAGE"}  # its send returned; no half of it in the commit log
    log = [{"record_id": "r1", "kind": "HALF", "transaction_id": "t1", "producer_group": GROUP, "msg_id": "m-t1",
            "state": None}] * 2
    tables = Tables(log=log, halves=[half("t2", "p0-00001")], ops=[], checks=[], rejected=[], topic_rows=[])
    findings = Findings()

    stored = _halves_on_the_way_in(findings, truth, tables, {GROUP}, bad_ids=set())

    assert stored == {"p0-00001"}
    assert dict(findings.found) == {"committed_twice": 1, "false_send_result": 1, "lost": 3}  # r1 twice, t9


def test_outcomes_must_follow_the_local_database_and_pending_ones_must_still_be_checkable():
    truth = truth_of(t1=COMMITTED, t2=REVIEW)  # t3: rolled back locally
    halves = [half("t1", "p0-00000"), half("t2", "p0-00001"), half("t3", "p0-00002")]
    outcomes = {"t2": {"ROLLBACK"}, "t3": {"ROLLBACK", "COMMIT"}}
    checks_of = {"t1": [{}, {}, {}]}  # t1 pending after the maximum
    findings = Findings()

    pending, by_kind = _outcomes(findings, truth, halves, outcomes, checks_of, recovered=set(), groups={GROUP},
                                 kind_of={"p0-00000": "commit", "p0-00001": "unknown_forever"}, check_max=3)

    # t1 pending beyond the checks, t2 rolled back though held for review, t3 resolved twice (so still pending)
    assert pending == 2 and dict(findings.found) == {"unresolved": 1, "wrong_outcome": 1, "duplicated": 1}
    assert by_kind == {"commit": {"pending": 1}, "unknown_forever": {"ROLLBACK": 1}, "unplanned": {"pending": 1}}


def test_a_check_before_immunity_or_beyond_the_maximum_is_a_violation():
    early = {"check_id": "c1", "check_times": 1, "requested_at": STORED + dt.timedelta(seconds=5)}
    in_time = {"check_id": "c2", "check_times": 2, "requested_at": STORED + dt.timedelta(seconds=6)}
    findings = Findings()

    _check_times(findings, [half("t1", "p0-00000")], {"t1": [early, in_time], "t2": [in_time]}, check_max=1)

    assert dict(findings.found) == {"early_checks": 2, "over_checked": 2}  # c1; t2 has no half. t1 twice, c2's 2


def test_every_hostile_record_must_be_refused_with_its_reason():
    forged, malformed = BadInput("claims another group", "r1", forgery=True), BadInput("empty body", "r2")
    findings = Findings()

    reasons = _refusals(findings, [{"record_id": "r2", "reason": "empty body", "producer_group": "x"}],
                        [forged, malformed])

    assert reasons == {"r2": "empty body"} and malformed.reason == "empty body" and forged.reason is None
    assert dict(findings.found) == {"forged_accepted": 1}


def test_the_consumer_groups_verdict_finds_each_violation_and_none_where_it_kept_the_invariants():
    """``bench/chaos/consumers.py``: missed, applied twice, out of a key's order, leaked, unaccounted dead letters."""
    from bench.chaos.consumers import _account

    topics = [{"msg_id": f"m{n}", "topic": "CHAOS_ORDERS", "keys": "customer-1", "tags": "commit"} for n in range(3)]
    topics.append({"msg_id": "bad", "topic": "CHAOS_ORDERS", "keys": "customer-1", "tags": "unknown_then_commit"})
    effects = [("m0", "CHAOS_ORDERS", "customer-1", 4, 10), ("m1", "CHAOS_ORDERS", "customer-1", 4, 11),
               ("m2", "CHAOS_ORDERS", "customer-1", 5, 3)]  # version 5 after 4: in order, its offset lower
    kept = _account({"topics": topics, "dead": [{"msg_id": "bad", "topic": "CHAOS_ORDERS"}], "effects": effects})
    assert set(kept.values()) == {0}
    broken = _account({"topics": topics, "dead": [{"msg_id": "m2", "topic": "CHAOS_ORDERS"}],
                       "effects": [effects[1], effects[0], effects[1], ("bad", "CHAOS_ORDERS", "customer-1", 6, 1),
                                   ("x", "CHAOS_ORDERS", None, 6, 2)]})
    assert broken == {"consumer_missed": 2,  # m2 never applied, bad no dead letter
                      "consumer_applied_twice": 1, "consumer_out_of_order": 2,  # m0 after m1, m1 again after m0
                      "consumer_leaked": 2,  # bad (the failing kind) and x (in no topic) applied
                      "dead_letter_unaccounted": 1}  # m2 is not of the failing kind
