"""The chaos harness's verdict (``bench/chaos/verify.py``), step by step on rows made by hand: each invariant's
step finds the violation it exists for, and nothing in a lakehouse that keeps the invariants."""

from __future__ import annotations

import datetime as dt

from bench.chaos.hostile import BadInput
from bench.chaos.producer import COMMITTED, REVIEW, body_of
from bench.chaos.consumer import fixed_by_redrive
from bench.chaos.verify import (
    ConsumerWork,
    Findings,
    GroundTruth,
    Tables,
    _check_times,
    _deliveries,
    _halves_on_the_way_in,
    _outcomes,
    _refusals,
    account_consumers,
    before_reset,
    counted_handled,
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


def message(msg_id: str, version: int, tags: str = "commit", keys: str = "customer-1", offset: int = 0) -> dict:
    return {"msg_id": msg_id, "topic": "CHAOS_ORDERS", "keys": keys, "tags": tags, "queue_offset": offset or version * 10,
            "version": version}


def call(msg_id: str, pid: int, start: float, end: float, version: int = 1, keys: str = "customer-1",
         outcome: str = "applied") -> dict:
    return {"msg_id": msg_id, "pid": pid, "start": start, "end": end, "topic": "CHAOS_ORDERS", "keys": keys,
            "version": version, "offset": version * 10, "outcome": outcome}


def dead(msg: dict, epoch: int = 0) -> dict:
    return {"dead_letter_id": f"CHAOS_ORDERS.{msg['version']}.{msg['queue_offset']}.{msg['msg_id']}.{epoch}",
            "msg_id": msg["msg_id"]}


#: Ids of the failing kind's messages that an operator's redrive fixes, and that it does not.
FIXED, NOT_FIXED = (next(f"bad-{n}" for n in range(100) if fixed_by_redrive(f"bad-{n}") == fixed) for fixed in (True, False))


def test_the_consumer_groups_verdict_finds_each_violation_and_none_where_it_kept_the_invariants():
    """Missed, applied twice, out of a key's order, leaked, unaccounted dead letters."""
    topics = [message(f"m{n}", 4, offset=10 + n) for n in range(2)] + [message("m2", 5, offset=3)]
    topics.append(message("bad", 6, tags="unknown_then_commit"))
    effects = [("m0", "CHAOS_ORDERS", "customer-1", 4, 10, 1), ("m1", "CHAOS_ORDERS", "customer-1", 4, 11, 1),
               ("m2", "CHAOS_ORDERS", "customer-1", 5, 3, 1)]  # version 5 after 4: in order, its offset lower
    kept = account_consumers(ConsumerWork(topics, effects, [dead(topics[3])]))
    assert set(kept.values()) == {0}
    broken = account_consumers(ConsumerWork(topics, [effects[1], effects[0], effects[1],
                                                     ("bad", "CHAOS_ORDERS", "customer-1", 6, 60, 1),
                                                     ("x", "CHAOS_ORDERS", None, 6, 2, 1)],
                                            [dead(topics[2]), dead(topics[2]), dead(topics[3], epoch=1)]))
    assert broken == {"consumer_missed": 1,  # m2 never applied
                      "consumer_applied_twice": 1, "consumer_out_of_order": 2,  # m0 after m1, m1 again after m0
                      "consumer_leaked": 2,  # bad (the failing kind) and x (in no topic) applied
                      "consumer_overlap": 0, "consumer_fenced_call": 0,
                      "dead_letter_unaccounted": 3,  # m2's twice, and not of the failing kind; bad's epoch 1
                      "reset_not_honoured": 0}


def test_a_keys_effects_are_in_the_topics_order_between_two_resets():
    """A reset to an earlier version delivers again what the group had not handled: after what it had handled."""
    effects = [("m20", "CHAOS_ORDERS", "customer-1", 20, 200, 1), ("m0", "CHAOS_ORDERS", "customer-1", 0, 5, 1)]
    assert account_consumers(ConsumerWork([], effects, []))["consumer_out_of_order"] == 1
    reset = {"versions": {"CHAOS_ORDERS": 0}, "pids": [2], "counted_handled": []}
    effects[1] = ("m0", "CHAOS_ORDERS", "customer-1", 0, 5, 2)  # applied by a process started after the reset
    assert account_consumers(ConsumerWork([], effects, [], resets=[reset]))["consumer_out_of_order"] == 0


def test_a_reset_allows_what_it_moved_past_and_demands_what_it_went_back_to():
    """Reset to version 5, epoch 1: m4 (version 4) never handled is reset past; m5 applied before the reset must be
    delivered after it (skipped); the failing kind's message at version 6 needs a dead letter of epoch 1."""
    topics = [message("m4", 4), message("m5", 5), message("bad", 6, tags="unknown_then_commit")]
    reset = {"versions": {"CHAOS_ORDERS": 5}, "pids": [20], "counted_handled": []}
    effects = [("m5", "CHAOS_ORDERS", "customer-1", 5, 50, 1)]
    after = [call("m5", 20, 10.0, 10.1, version=5, outcome="skipped"), call("bad", 20, 10.2, 10.3, version=6)]
    work = ConsumerWork(topics, effects, [dead(topics[2], epoch=0), dead(topics[2], epoch=1)], calls=after,
                        resets=[reset], epochs={"CHAOS_ORDERS": 1})
    found, _, did = account_consumers(work, with_examples=True)
    assert set(found.values()) == {0} and did["fates"] == {"reset past": 1, "applied": 1, "dead letter": 1}
    assert did["skipped_after_reset"] == 1

    work = ConsumerWork(topics, effects, [dead(topics[2], epoch=0)], calls=[call("m4", 20, 10.0, 10.1, version=4)],
                        resets=[reset], epochs={"CHAOS_ORDERS": 1})
    found, examples, _ = account_consumers(work, with_examples=True)
    # bad has no dead letter since the reset; m4 delivered though the reset moved past it; m5 and bad not delivered
    assert found["consumer_missed"] == 1 and "no dead letter of epoch 1" in examples["consumer_missed"][0]
    assert found["reset_not_honoured"] == 3


def test_a_message_its_shares_progress_counts_handled_must_be_applied_or_a_dead_letter_when_a_reset_is_made():
    """What the reset may move past is what the group's progress still listed (or had not read), nothing else."""
    progress = {"version": 5, "offset": 20, "floor": 0, "unhandled": {3: [30]}, "skip": {}}
    assert not counted_handled(progress, 3, 30)  # read, listed as still to do (a retry, say)
    assert counted_handled(progress, 3, 31) and counted_handled(progress, 5, 19)  # read before the position
    assert not counted_handled(progress, 5, 20) and not counted_handled(None, 0, 0)  # not read yet; never saved
    assert counted_handled(progress | {"floor": 100}, 5, 40)  # below a reset's queue offset

    topics = [message("m3", 3, offset=30), message("m4", 3, offset=31), message("m5", 5, offset=50)]
    lost = before_reset(topics, handled={"m5"}, progress={("CHAOS_ORDERS", 0): progress},
                        share_of=lambda keys, msg_id: 0, since={})
    assert lost == ["m4"]  # m3 listed as unhandled: the reset may move past it; m5 applied
    # m4 before where a previous reset went: that reset moved past it (its progress starts there)
    assert before_reset(topics, {"m5"}, {("CHAOS_ORDERS", 0): progress}, lambda keys, msg_id: 0, {"CHAOS_ORDERS": 4}) == []
    work = ConsumerWork(topics, [("m5", "CHAOS_ORDERS", "customer-1", 5, 50, 1)], [],
                        resets=[{"versions": {"CHAOS_ORDERS": 6}, "pids": [], "counted_handled": lost}],
                        epochs={"CHAOS_ORDERS": 1})
    found, examples, did = account_consumers(work, with_examples=True)
    assert found["consumer_missed"] == 1 and did["fates"] == {"applied": 1, "reset past": 1, "lost before a reset": 1}
    assert any("counted it handled" in example for example in examples["consumer_missed"])


def test_dead_letters_discarded_or_redriven_are_accounted_for_and_a_redrive_must_be_handled():
    fixed, not_fixed, kept = (message(msg_id, 4 + n, tags="unknown_then_commit")
                              for n, msg_id in enumerate((FIXED, NOT_FIXED, "bad-kept")))
    letters = [dead(fixed), dead(not_fixed), dead(kept)]
    actions = [{"action": "REDRIVE", **letters[0]}, {"action": "REDRIVE", **letters[1]},
               {"action": "DISCARD", **letters[2]}]
    redriven = [{"msg_id": FIXED, "version": 0}, {"msg_id": NOT_FIXED, "version": 0}]
    again = {"dead_letter_id": f"~redrive.0.50.{NOT_FIXED}.0", "msg_id": NOT_FIXED}
    applied = [(FIXED, "CHAOS_ORDERS", "customer-1", -1, 40, 1)]
    found, _, did = account_consumers(ConsumerWork([fixed, not_fixed, kept], applied, letters + [again], actions,
                                                   redriven), with_examples=True)
    assert set(found.values()) == {0}
    assert did["fates"] == {"applied after a redrive": 1, "dead letter": 1, "discarded": 1}

    # Neither redrive handled; a dead letter again of the one the fix covers; a redrive never appended.
    found = account_consumers(ConsumerWork([fixed, not_fixed, kept], [], letters + [
        {"dead_letter_id": f"~redrive.0.40.{FIXED}.0", "msg_id": FIXED}], actions + [
        {"action": "REDRIVE", "dead_letter_id": "x", "msg_id": "bad-kept"}], redriven))
    assert found["consumer_missed"] == 3 and found["dead_letter_unaccounted"] == 1


def test_only_a_call_running_when_its_process_was_paused_may_overlap_another_processes_calls_of_its_key():
    pause = {"pid": 1, "begin_lo": 5.0, "begin_hi": 5.1, "resumed": 15.0}
    across = call("m1", 1, 4.0, 15.5)  # running when its process stopped, finished after it resumed
    successor = [call("m1", 2, 8.0, 8.1, outcome="skipped"), call("m2", 2, 8.2, 8.3, version=2)]
    other_key = call("m9", 2, 4.5, 6.0, keys="customer-2")
    found, _, did = account_consumers(ConsumerWork([], [], [], calls=[across, *successor, other_key], pauses=[pause]),
                                      with_examples=True)
    assert found["consumer_overlap"] == 0 and did["overlaps_across_a_pause"] == 2
    assert did["overlaps_past_the_successors_first_call"] == 1  # m2, after the successor's m1
    # Its own process, after the pause: it lost the share and holds it again, a successor too.
    again = call("m1", 1, 15.1, 15.2, outcome="skipped")
    assert account_consumers(ConsumerWork([], [], [], calls=[across, again], pauses=[pause]))["consumer_overlap"] == 0

    for calls in ([call("m1", 1, 5.5, 15.5), successor[0]],  # began after the pause began
                  [across, call("m1", 2, 4.5, 4.6)],  # the other began before the pause
                  [across, call("m2", 1, 14.0, 14.1, version=2)],  # its own process, before the pause ended
                  [call("m1", 3, 4.0, 9.0), successor[0]]):  # a process never paused
        assert account_consumers(ConsumerWork([], [], [], calls=calls, pauses=[pause]))["consumer_overlap"] == 1, calls


def test_no_call_starts_while_its_instance_is_fenced():
    """A gap its instance reported: a liveness window after its last proof, it may have lost its shares, and starts no
    call until it renewed its record (and read its claims back)."""
    gap = {"pid": 1, "begin_lo": 10.0, "begin_hi": 12.0, "resumed": 14.0, "fenced": (12.0, 14.0)}
    calls = [call("m1", 1, 11.0, 11.1), call("m2", 1, 14.5, 14.6, keys="customer-2"),  # before it, after it
             call("m3", 2, 13.0, 13.1, keys="customer-3")]  # another process's
    assert account_consumers(ConsumerWork([], [], [], calls=calls, pauses=[gap]))["consumer_fenced_call"] == 0
    fenced = account_consumers(ConsumerWork([], [], [], calls=[call("m4", 1, 12.5, 12.6)], pauses=[gap]))
    assert fenced["consumer_fenced_call"] == 1
