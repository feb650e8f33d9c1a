"""The verdict of a chaos run: the invariants of docs/design.md#invariants, from the Delta tables against
the producers' SQLite databases (their ground truth); and the consumer group's (:func:`account_consumers`), from
the topics, the group's tables, its SQLite effects and its processes' calls against what the harness did to it."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, Optional, Sequence

import support
from bench.chaos.actors import Producer, table_rows
from bench.chaos.consumer import fails_from_topic, fixed_by_redrive
from bench.chaos.hostile import BadInput
from bench.chaos.poison import Poisoning
from bench.chaos.producer import COMMITTED, HALF_NOT_STORED, HALF_OUTCOME_UNKNOWN, INTERRUPTED, REVIEW, Store, group_of, plan_id_of
from coordinator.commit_logs import CommitLogs
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse, topic_names
from coordinator.tables import CHECK_REQUESTS, HALF, OP, REJECTED

__all__ = ["CONSUMER_FINDINGS", "EXAMPLES", "ConsumerWork", "Findings", "GroundTruth", "Tables", "account_consumers",
           "before_reset", "counted_handled", "verify"]

#: Examples kept per kind of violation.
EXAMPLES = 5
#: The op rows of each half of a discarded transaction an operator committed.
RECOVERED_OPS = ["COMMIT", "DISCARD"]
#: How :func:`verify` counts such a transaction among the outcomes by kind.
_RECOVERED = "COMMIT by an operator after DISCARD"


@dataclass
class GroundTruth:
    """What the producers' SQLite databases say."""

    status: dict[str, str] = field(default_factory=dict)  # transaction_id -> committed | review
    messages: dict[str, dict] = field(default_factory=dict)  # msg_id -> transaction_id, topic, body
    returned: dict[str, str] = field(default_factory=dict)  # transaction_id -> state its send returned
    interrupted: list[str] = field(default_factory=list)  # plan ids whose send never returned
    not_stored: list[str] = field(default_factory=list)  # plan ids whose half could not be stored
    outcome_unknown: list[str] = field(default_factory=list)  # plan ids whose half the storage never confirmed

    @classmethod
    def read(cls, producers: list[Producer]) -> "GroundTruth":
        truth = cls()
        for producer in producers:
            if not producer.db.exists():
                continue
            with Store(str(producer.db)).snapshot() as db:
                truth.status.update(db.execute("SELECT transaction_id, status FROM orders"))
                for msg_id, transaction_id, topic, body in db.execute(
                        "SELECT msg_id, transaction_id, topic, body FROM order_messages"):
                    truth.messages[msg_id] = {"transaction_id": transaction_id, "topic": topic, "body": bytes(body)}
                for plan_id, transaction_id, state in db.execute(
                        "SELECT plan_id, transaction_id, returned_state FROM attempts"):
                    if state in (None, INTERRUPTED):
                        truth.interrupted.append(plan_id)
                    elif state == HALF_NOT_STORED:
                        truth.not_stored.append(plan_id)
                    elif state == HALF_OUTCOME_UNKNOWN:
                        truth.outcome_unknown.append(plan_id)
                    else:
                        truth.returned[transaction_id] = state
        return truth


@dataclass
class Tables:
    """The rows of the lakehouse a verdict reads, read once."""

    log: list[dict]  # every commit log's records
    halves: list[dict]
    ops: list[dict]
    checks: list[dict]
    rejected: list[dict]
    topic_rows: list[dict]  # every topic's

    @classmethod
    def read(cls, lakehouse: Lakehouse, unreadable: frozenset[str] = frozenset()) -> "Tables":
        """The tables; the commit logs but those ``unreadable`` (a poisoning tenant's: no Delta table's)."""
        log_columns = ["record_id", "kind", "transaction_id", "producer_group", "msg_id", "state"]
        return cls(
            log=[row for ref in CommitLogs(lakehouse).discover() if ref.key not in unreadable
                 for row in table_rows(lakehouse, ref.key, log_columns)],
            halves=table_rows(lakehouse, HALF, ["transaction_id", "producer_group", "queue_offset", "msg_id",
                                                "message_index", "body", "stored_timestamp", "immunity_ms"]),
            ops=table_rows(lakehouse, OP, ["half_offset", "transaction_id", "outcome", "end_record_id"]),
            checks=table_rows(lakehouse, CHECK_REQUESTS, ["check_id", "transaction_id", "check_times", "requested_at"]),
            rejected=table_rows(lakehouse, REJECTED, ["record_id", "reason", "producer_group", "commit_log",
                                                      "commit_version"]),
            topic_rows=[row for topic in topic_names(lakehouse)
                        for row in table_rows(lakehouse, f"topics/{topic}", ["transaction_id", "msg_id", "topic", "body"])],
        )

    @property
    def first_halves(self) -> list[dict]:
        """One half per transaction: its first message's."""
        return [row for row in self.halves if row["message_index"] == 0]


class Findings:
    """The violations found, counted by name, with the first few examples of each."""

    NAMES = ("lost", "duplicated", "leaked", "wrong_outcome", "early_checks", "over_checked", "unresolved",
             "bad_input_unrecorded", "forged_accepted", "committed_twice", "false_send_result", "poison_unrefused")

    def __init__(self) -> None:
        self.found: Counter = Counter()
        self.examples: dict[str, list[str]] = defaultdict(list)

    def violation(self, name: str, example: str) -> None:
        self.found[name] += 1
        if len(self.examples[name]) < EXAMPLES:
            self.examples[name].append(example)


def verify(config: CoordinatorConfig, producers: list[Producer], bad_inputs: list[BadInput],
           plans: list[list[tuple[str, str]]], recovered: set[str], poisonings: Sequence[Poisoning] = ()) -> dict:
    """Compare the lakehouse with the ground truth; every count under ``found`` must be 0.

    ``recovered`` are the discarded transactions an operator committed: they must be delivered too.
    ``poisonings`` are the poisoning tenant's: each must be refused with its reason.
    """
    truth = GroundTruth.read(producers)
    truth.status.update({transaction_id: COMMITTED for transaction_id in recovered})
    tables = Tables.read(Lakehouse.of(config), frozenset(p.commit_log for p in poisonings if p.commit_version is not None))
    groups = {group_of(p.index) for p in producers}
    bad_ids = {bad.record_id for bad in bad_inputs}
    findings = Findings()

    _deliveries(findings, truth, tables.topic_rows)
    stored_plans = _halves_on_the_way_in(findings, truth, tables, groups, bad_ids)
    outcomes = _op_rows(findings, tables.ops, recovered)
    checks_of = _check_requests(findings, tables.checks)
    first_halves = tables.first_halves
    kind_of = {plan_id: kind for plan in plans for plan_id, kind in plan}
    pending, outcomes_by_kind = _outcomes(findings, truth, first_halves, outcomes, checks_of, recovered, groups,
                                          kind_of, config.transaction_check_max)
    _check_times(findings, first_halves, checks_of, config.transaction_check_max)
    reasons = _refusals(findings, tables.rejected, bad_inputs)
    _poisons_refused(findings, tables.rejected, poisonings)
    valid_reasons = Counter(row["reason"] for row in tables.rejected if row["producer_group"] in groups
                            and row["record_id"] not in bad_ids)
    return {
        "found": {name: findings.found[name] for name in Findings.NAMES},
        "forgeries_refused": sum(1 for bad in bad_inputs if bad.forgery and bad.reason is not None),
        "violations": sum(findings.found.values()),
        "examples": {name: list(values) for name, values in findings.examples.items()},
        "pending_halves": pending + _undecided_ends(tables, reasons) + sum(1 for bad in bad_inputs if bad.reason is None)
                          + sum(1 for poisoning in poisonings if poisoning.reason is None),
        "outcomes_by_kind": {kind: dict(counts) for kind, counts in sorted(outcomes_by_kind.items())}
                            | {"send interrupted by a kill": len(truth.interrupted),
                               "half not stored": len(truth.not_stored),
                               "half outcome unknown (its half stored: rolled back by check)":
                                   len(set(truth.outcome_unknown) & stored_plans),
                               "half outcome unknown (not stored)": len(set(truth.outcome_unknown) - stored_plans)},
        "rejected_reasons": {"valid producers' records": dict(valid_reasons)},
    }


def _deliveries(findings: Findings, truth: GroundTruth, topic_rows: list[dict]) -> None:
    """Invariants 1 and 2: every locally committed transaction's messages in the topics, each exactly once and
    intact; nothing else."""
    committed = {msg_id for msg_id, message in truth.messages.items()
                 if truth.status.get(message["transaction_id"]) == COMMITTED}
    deliveries = support.tally_deliveries(committed, (row["msg_id"] for row in topic_rows))
    for msg_id, extra in deliveries.duplicated.items():
        findings.violation("duplicated", f"msg_id {msg_id} is {extra + 1} times in the topics")
    for transaction_id, missing in Counter(truth.messages[msg_id]["transaction_id"] for msg_id in deliveries.lost).items():
        findings.violation("lost", f"transaction {transaction_id} committed locally; {missing} of its messages not in "
                                   f"any topic")
    unexpected = set(deliveries.unexpected)
    for row in topic_rows:
        expected = truth.messages.get(row["msg_id"])
        if row["msg_id"] in unexpected:
            findings.violation("leaked", f"{row['topic']} holds msg_id {row['msg_id']} of transaction "
                                         f"{row['transaction_id']}, which did not commit locally")
        elif (row["transaction_id"], row["topic"], bytes(row["body"])) != (
                expected["transaction_id"], expected["topic"], expected["body"]):
            findings.violation("leaked", f"{row['topic']} holds msg_id {row['msg_id']} altered: {row['transaction_id']}, "
                                         f"{bytes(row['body'])[:40]!r}")


def _halves_on_the_way_in(findings: Findings, truth: GroundTruth, tables: Tables, groups: set[str],
                          bad_ids: set[str]) -> set[str]:
    """Invariant 3, on the way in: no record committed twice (a commit whose reply was lost, made again), no
    send that said "not stored" of a half that was, no half lost between a send, the commit log and
    ``system/half``, none there twice. Returns the plan ids whose half is stored."""
    for record_id, count in Counter(row["record_id"] for row in tables.log if row["record_id"] not in bad_ids).items():
        if count > 1:
            findings.violation("committed_twice", f"record {record_id} is {count} times in the commit logs")
    stored_plans = {plan_id_of(row["body"]) for row in tables.halves if row["producer_group"] in groups}
    for plan_id in set(truth.not_stored) & stored_plans:
        findings.violation("false_send_result", f"the send of plan {plan_id} said its half was not stored; it was")
    half_msg_ids = Counter(row["msg_id"] for row in tables.halves)
    for msg_id, count in half_msg_ids.items():
        if count > 1:
            findings.violation("duplicated", f"msg_id {msg_id} is {count} times in system/half")
    logged_halves = [row for row in tables.log if row["kind"] == "HALF" and row["producer_group"] in groups
                     and row["record_id"] not in bad_ids]
    for row in logged_halves:
        if row["msg_id"] not in half_msg_ids:
            findings.violation("lost", f"half {row['msg_id']} of transaction {row['transaction_id']} is in the commit "
                                       f"log, not in system/half")
    logged_txns = {row["transaction_id"] for row in logged_halves}
    for transaction_id, state in truth.returned.items():
        if transaction_id not in logged_txns:
            findings.violation("lost", f"send of {transaction_id} returned {state} but its half is not in the commit log")
    return stored_plans


def _op_rows(findings: Findings, ops: list[dict], recovered: set[str]) -> dict[str, set[str]]:
    """One op row per half (two, DISCARD then COMMIT, for a discarded transaction an operator committed);
    returns each transaction's outcomes."""
    ops_of_half: dict[int, list[dict]] = defaultdict(list)
    for row in ops:
        ops_of_half[row["half_offset"]].append(row)
    for offset, rows in ops_of_half.items():
        found_ops = sorted(row["outcome"] for row in rows)
        if len(found_ops) > 1 and not (rows[0]["transaction_id"] in recovered and found_ops == RECOVERED_OPS):
            findings.violation("duplicated", f"half offset {offset} has op rows {found_ops}")
    outcomes: dict[str, set[str]] = defaultdict(set)
    for row in ops:
        outcomes[row["transaction_id"]].add(row["outcome"])
    return outcomes


def _check_requests(findings: Findings, checks: list[dict]) -> dict[str, list[dict]]:
    """Each check requested once; returns each transaction's check requests."""
    for check_id, count in Counter(row["check_id"] for row in checks).items():
        if count > 1:
            findings.violation("duplicated", f"check {check_id} was requested {count} times")
    checks_of: dict[str, list[dict]] = defaultdict(list)
    for row in checks:
        checks_of[row["transaction_id"]].append(row)
    return checks_of


def _outcomes(findings: Findings, truth: GroundTruth, first_halves: list[dict], outcomes: dict[str, set[str]],
              checks_of: dict[str, list[dict]], recovered: set[str], groups: set[str], kind_of: dict[str, str],
              check_max: int) -> tuple[int, dict[str, Counter]]:
    """Invariant 3, on the way out: each transaction resolved once, as its producer's database says, or still
    legitimately pending (fewer than ``check_max`` checks). Returns the pending ones' count and the outcomes
    of the producers' transactions by planned kind."""
    pending = 0
    outcomes_by_kind: dict[str, Counter] = defaultdict(Counter)
    for half in first_halves:
        transaction_id = half["transaction_id"]
        found_outcomes = outcomes.get(transaction_id, set())
        was_recovered = transaction_id in recovered and found_outcomes == set(RECOVERED_OPS)
        if len(found_outcomes) > 1 and not was_recovered:
            findings.violation("duplicated", f"transaction {transaction_id} resolved as {sorted(found_outcomes)}")
        outcome = "COMMIT" if was_recovered else next(iter(found_outcomes)) if len(found_outcomes) == 1 else None
        times_checked = len(checks_of.get(transaction_id, ()))
        if outcome is None:
            pending += 1
            if times_checked >= check_max:
                findings.violation("unresolved", f"transaction {transaction_id} pending after {times_checked} checks")
        if half["producer_group"] not in groups:
            continue  # hostile traffic: its outcome is checked through the topics and system/rejected
        kind = kind_of.get(plan_id_of(half["body"]), "unplanned")
        outcomes_by_kind[kind][_RECOVERED if was_recovered else outcome or "pending"] += 1
        status = truth.status.get(transaction_id)
        expected = {COMMITTED: "COMMIT", REVIEW: "DISCARD", None: "ROLLBACK"}[status]
        if outcome is not None and outcome != expected and status != COMMITTED:  # committed ones count as lost above
            findings.violation("wrong_outcome", f"transaction {transaction_id} ({kind}, local status {status}) "
                                                f"ended {outcome}")
    return pending, outcomes_by_kind


def _check_times(findings: Findings, first_halves: list[dict], checks_of: dict[str, list[dict]], check_max: int) -> None:
    """Invariant 4: no check before immunity, none beyond the maximum."""
    half_of = {row["transaction_id"]: row for row in first_halves}
    for transaction_id, requests in checks_of.items():
        half = half_of.get(transaction_id)
        if len(requests) > check_max or max(r["check_times"] for r in requests) > check_max:
            findings.violation("over_checked", f"transaction {transaction_id} checked {len(requests)} times")
        if half is None:
            findings.violation("early_checks", f"transaction {transaction_id} checked but not in system/half")
            continue
        immune_until = half["stored_timestamp"] + timedelta(milliseconds=half["immunity_ms"])
        for request in requests:
            if request["requested_at"] < immune_until:
                findings.violation("early_checks", f"check {request['check_id']} at {request['requested_at']}, "
                                                   f"immune until {immune_until}")


def _refusals(findings: Findings, rejected: list[dict], bad_inputs: list[BadInput]) -> dict[str, str]:
    """Invariant 6: every hostile record refused, with its reason (set on each ``BadInput``). Returns every
    refused record's reason by record id."""
    reasons = {row["record_id"]: row["reason"] for row in rejected}
    for bad in bad_inputs:
        bad.reason = reasons.get(bad.record_id)
        if bad.reason is None:
            findings.violation("forged_accepted" if bad.forgery else "bad_input_unrecorded",
                               f"{bad.what} (record {bad.record_id}) is not in system/rejected")
    return reasons


def _poisons_refused(findings: Findings, rejected: list[dict], poisonings: Sequence[Poisoning]) -> None:
    """Every poison refused (in ``system/rejected``, at its log and version, or its instance record's key) with
    the reason expected of it (set on each ``Poisoning``)."""
    reasons = {(row["commit_log"], row["commit_version"]): row["reason"] for row in rejected if row["commit_log"]}
    for poisoning in poisonings:
        reason = reasons.get((poisoning.commit_log, poisoning.commit_version))
        poisoning.reason = reason if reason is not None and poisoning.expected in reason else None
        if poisoning.reason is None:
            findings.violation("poison_unrefused", f"{poisoning.what} ({poisoning.commit_log} "
                                                   f"version {poisoning.commit_version}): refused with {reason!r}")


def _undecided_ends(tables: Tables, reasons: dict[str, str]) -> int:
    """Decisions not yet looked at: a COMMIT or ROLLBACK in the log that is neither an op nor a refusal."""
    looked_at = {row["end_record_id"] for row in tables.ops} | set(reasons)
    return sum(1 for row in tables.log if row["kind"] == "END" and row["state"] in ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE")
               and row["record_id"] not in looked_at)


# The consumer group's verdict.

#: Each count must be 0 (docs/chaos.md says what each counts).
CONSUMER_FINDINGS = ("consumer_missed", "consumer_applied_twice", "consumer_out_of_order", "consumer_overlap",
                     "consumer_fenced_call", "consumer_leaked", "dead_letter_unaccounted", "reset_not_honoured")
_REDRIVE_SOURCE = "~redrive"  # coordinator.consumer.group.REDRIVE_SOURCE: where a dead letter of a redrive was read


@dataclass
class ConsumerWork:
    """What the consumer group did, as read at one moment, and what the harness did to it.

    ``messages``: every message of the group's topics (``msg_id``, ``topic``, ``keys``, ``tags``, ``queue_offset``
    and ``version``, the topic's version that added it). ``effects``: the rows of the group's SQLite ``effects``,
    ``(msg_id, topic, keys, topic_version, queue_offset, pid)``, in the order they committed. ``dead``: its dead letters
    (``dead_letter_id``, ``msg_id``); ``actions``: the operators' (``action``, ``dead_letter_id``, ``msg_id``);
    ``redriven``: the rows of its redrive table (``msg_id``, ``version``). ``calls``: every listener call its
    processes logged (``pid``, ``start``, ``end``: wall times, ``end`` the process's end for a call it never
    finished; ``topic``, ``msg_id``, ``keys``, ``version``, ``offset``, ``outcome``). ``pauses``: each pause of a
    process, the harness's SIGSTOPs and the gaps an instance reported in the proof of its hold (``pid``; it began
    between ``begin_lo`` and ``begin_hi``, wall times: a call of its process running then may overlap another's;
    a gap's ``fenced``, from when its record may have been taken for dead to when it renewed it: no call of its
    process may start then).
    ``resets``: the operator's resets of the group, in order (``versions``: where each topic was reset to; ``pids``:
    the processes started after it; ``counted_handled``: what :func:`before_reset` found); ``epochs``: each topic's
    resets so far, as its records say."""

    messages: list[dict]
    effects: list[tuple]
    dead: list[dict]
    actions: list[dict] = field(default_factory=list)
    redriven: list[dict] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    pauses: list[dict] = field(default_factory=list)
    resets: list[dict] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)

    @property
    def last_reset(self) -> Optional[dict]:
        return self.resets[-1] if self.resets else None


def counted_handled(progress: Optional[dict], version: int, offset: int) -> bool:
    """Whether a share's progress record (the fields of ``coordinator.consumer.group.ShareProgress``: ``version`` and
    ``offset``, where its next read begins; ``floor``; ``unhandled`` and ``skip``, offsets by version) counts the
    message at ``version`` and queue ``offset`` as handled: read, and not listed as still to do. ``None``: the share
    never saved its progress, and counts nothing handled."""
    if progress is None:
        return False
    if offset < progress["floor"] or offset in progress["skip"].get(version, ()):
        return True
    return offset not in progress["unhandled"].get(version, ()) and (version, offset) < (progress["version"],
                                                                                       progress["offset"])


def before_reset(messages: list[dict], handled: set[str], progress: dict[tuple[str, int], Optional[dict]],
                 share_of: Callable[[Optional[str], str], int], since: dict[str, int]) -> list[str]:
    """At a reset, every instance stopped: the messages neither applied nor a dead letter (not in ``handled``) that
    their share's ``progress`` (by topic and share; ``share_of(keys, msg_id)``) counts as handled. Each was lost
    before the reset, which moves past it or delivers it again and hides it: the verdict counts it missed. Those of
    versions before ``since`` (by topic: where the previous reset went) are left out: that reset moved past them."""
    return [row["msg_id"] for row in messages if row["msg_id"] not in handled
            and row["version"] >= since.get(row["topic"], 0)
            and counted_handled(progress.get((row["topic"], share_of(row["keys"], row["msg_id"]))), row["version"],
                                row["queue_offset"])]


@dataclass(frozen=True)
class _DeadLetter:
    """A dead letter's identity, parsed: where it was read (``source``, ``version``, ``offset``) and the epoch."""

    source: str
    version: int
    offset: int
    epoch: int

    @classmethod
    def parse(cls, dead_letter_id: str, msg_id: str) -> Optional["_DeadLetter"]:
        """``<source>.<version>.<queue offset>.<msg id>.<epoch>`` (coordinator.consumer.group.dead_letter_id)."""
        head, dot, tail = dead_letter_id.partition(f".{msg_id}.")
        parts = head.split(".")
        if not dot or len(parts) != 3 or not tail.isdigit():
            return None
        try:
            return cls(parts[0], int(parts[1]), int(parts[2]), int(tail))
        except ValueError:
            return None


def account_consumers(work: ConsumerWork, with_examples: bool = False):
    """The counts of :data:`CONSUMER_FINDINGS` (and, ``with_examples``, their first examples and what the group's
    messages came to).

    What a reset and a discard allow: the messages of versions before the last reset of their topic that were not
    handled when it was made are *reset past* (never delivered again; neither applied nor a dead letter is right),
    provided the group's progress did not count them handled then (:func:`before_reset`: lost, and hidden);
    every message from that version on must have been delivered after it, by a process started after it, and be
    applied, or of the failing kind a dead letter of the topic's current epoch. A dead letter's fate is the
    operators': open, discarded (closed for good), or redriven, and then each row of the redrive table must be
    handled again: applied if the fix covers its message, else a dead letter of the redrive table's version."""
    findings = Findings()
    messages = {row["msg_id"]: row for row in work.messages}
    reset_to = (work.last_reset or {}).get("versions", {})
    applied = Counter(msg_id for msg_id, *_ in work.effects)
    closed = {row["dead_letter_id"]: row["action"] for row in work.actions if row["action"] in ("REDRIVE", "DISCARD")}
    redrive_actions = Counter(row["msg_id"] for row in work.actions if row["action"] == "REDRIVE")
    redrive_versions: dict[str, list[int]] = defaultdict(list)
    for row in work.redriven:
        redrive_versions[row["msg_id"]].append(row["version"])
    dead_of = _dead_letters(findings, work, messages, redrive_versions)
    _effects(findings, work.effects, messages, redrive_versions, work.resets)
    states = Counter()
    lost = {msg_id for reset in work.resets for msg_id in reset["counted_handled"]}  # counted missed below
    for msg_id, row in messages.items():
        state = _fate(row, applied[msg_id], dead_of[msg_id], closed, reset_to.get(row["topic"], 0),
                      work.epochs.get(row["topic"], 0))
        if state == "reset past" and msg_id in lost:
            state = "lost before a reset"
        if state.startswith("missed"):
            findings.violation("consumer_missed", f"{row['topic']} {msg_id} ({row['tags']}, version {row['version']}): "
                                                  f"{state.removeprefix('missed: ')}")
        states[state if not state.startswith("missed") else "missed"] += 1
    for msg_id, versions in redrive_versions.items():
        _redrives_handled(findings, msg_id, versions, redrive_actions[msg_id], applied[msg_id], dead_of[msg_id])
    for msg_id in set(redrive_actions) - set(redrive_versions):
        findings.violation("consumer_missed", f"{msg_id}: redriven {redrive_actions[msg_id]} time(s), never in the "
                                              f"redrive table")
    for number, reset in enumerate(work.resets):
        for msg_id in reset["counted_handled"]:
            findings.violation("consumer_missed", f"{msg_id}: neither applied nor a dead letter at reset {number + 1}, "
                                                  f"though its share's progress counted it handled")
    if work.last_reset is not None:
        _reset_honoured(findings, work.last_reset, messages, work.calls)
    documented = _overlaps(findings, work.calls, work.pauses)
    _fenced_calls(findings, work.calls, work.pauses)
    found = {name: findings.found[name] for name in CONSUMER_FINDINGS}
    if not with_examples:
        return found
    after_reset = set((work.last_reset or {}).get("pids", ()))
    did = {"applied": sum(applied.values()), "fates": dict(states),
           "dead_letters": len(work.dead), "dead_letters_open": sum(1 for row in work.dead
                                                                    if row["dead_letter_id"] not in closed),
           "skipped_after_reset": sum(1 for call in work.calls if call["pid"] in after_reset
                                      and call.get("outcome") == "skipped"),
           "overlaps_across_a_pause": len(documented),
           "overlaps_past_the_successors_first_call": sum(1 for overlap in documented if overlap["past_first"]),
           "overlap_examples": [overlap["overlap"] + (" (past the successor's first call of the key)"
                                                      if overlap["past_first"] else "") for overlap in documented][:EXAMPLES],
           "keys_in_order": len({(topic, keys) for _, topic, keys, version, *_ in work.effects
                                 if keys is not None and version >= 0})}
    return found, {name: list(values) for name, values in findings.examples.items() if name in CONSUMER_FINDINGS}, did


def _dead_letters(findings: Findings, work: ConsumerWork, messages: dict[str, dict],
                  redrive_versions: dict[str, list[int]]) -> dict[str, list[tuple[str, _DeadLetter]]]:
    """Each dead letter accounted for: written once, of a message of the failing kind read where its identity
    says, in an epoch its topic has had; from the redrive table, of a redrive the fix does not cover. Returns each
    message's dead letters, with their identities."""
    dead_of: dict[str, list[tuple[str, _DeadLetter]]] = defaultdict(list)
    for dead_letter_id, count in Counter(row["dead_letter_id"] for row in work.dead).items():
        if count > 1:
            findings.violation("dead_letter_unaccounted", f"dead letter {dead_letter_id} written {count} times")
    for row in {row["dead_letter_id"]: row for row in work.dead}.values():
        msg_id, identity = row["msg_id"], _DeadLetter.parse(row["dead_letter_id"], row["msg_id"])
        message = messages.get(msg_id)
        if message is None or identity is None or not fails_from_topic(message["tags"]):
            findings.violation("dead_letter_unaccounted", f"{row['dead_letter_id']}: of "
                                                          f"{'no message of the topics' if message is None else message['tags']}")
            continue
        if identity.source == _REDRIVE_SOURCE:
            why = ("its message succeeds once redriven" if fixed_by_redrive(msg_id) else None
                   if identity.version in redrive_versions.get(msg_id, ()) else "no redrive of it in that version")
        else:
            why = ("read where its message is not" if (identity.source, identity.version, identity.offset)
                   != (message["topic"], message["version"], message["queue_offset"])
                   else f"its topic has had {work.epochs.get(identity.source, 0)} reset(s)"
                   if identity.epoch > work.epochs.get(identity.source, 0) else None)
        if why:
            findings.violation("dead_letter_unaccounted", f"{row['dead_letter_id']}: {why}")
        dead_of[msg_id].append((row["dead_letter_id"], identity))
    return dead_of


def _effects(findings: Findings, effects: list[tuple], messages: dict[str, dict],
             redrive_versions: dict[str, list[int]], resets: list[dict]) -> None:
    """No effect twice, none of a message the listener fails, none from the redrive table but of a redriven message
    the fix covers; a key's effects from its topic in the topic's order (its versions, then ``queue_offset``), between
    two resets (a reset to an earlier version delivers again what the group had not handled, after what it had)."""
    for msg_id, times in Counter(msg_id for msg_id, *_ in effects).items():
        if times > 1:
            findings.violation("consumer_applied_twice", f"{msg_id}: applied {times} times")
    last: dict[tuple, tuple] = {}
    for msg_id, topic, keys, version, offset, pid in effects:
        message = messages.get(msg_id)
        redriven = version == -1
        if message is None:
            findings.violation("consumer_leaked", f"{msg_id}: applied, but in no topic")
        elif fails_from_topic(message["tags"]) and not (redriven and fixed_by_redrive(msg_id)
                                                         and msg_id in redrive_versions):
            findings.violation("consumer_leaked", f"{msg_id}: applied {'from the redrive table' if redriven else ''}"
                                                  f", but of the failing kind ({message['tags']})")
        elif redriven and not fails_from_topic(message["tags"]):
            findings.violation("consumer_leaked", f"{msg_id}: applied from the redrive table, never a dead letter")
        if keys is None or redriven:
            continue  # no key: a lane of its own; redriven: read from the redrive table, in its own order
        lane = (sum(1 for reset in resets if pid in reset["pids"]), topic, keys)  # the resets before its process
        if lane in last and last[lane] >= (version, offset):
            findings.violation("consumer_out_of_order", f"{topic} key {keys}: {msg_id} at version {version} offset "
                                                        f"{offset} applied after version {last[lane][0]} offset "
                                                        f"{last[lane][1]}")
        last[lane] = max(last.get(lane, (version, offset)), (version, offset))


def _fate(message: dict, applied: int, dead: list[tuple[str, _DeadLetter]], closed: dict[str, str], reset_to: int,
          epoch: int) -> str:
    """What became of ``message``: applied, a dead letter (open, discarded, redriven), reset past; or ``missed: ...``
    saying what is wrong (see :func:`account_consumers`)."""
    if applied:
        return "applied after a redrive" if fails_from_topic(message["tags"]) else "applied"
    behind = message["version"] < reset_to
    if not fails_from_topic(message["tags"]):
        return "reset past" if behind else "missed: never applied"
    if not dead:
        return "reset past" if behind else "missed: no dead letter"
    if not behind and not any(identity.source == message["topic"] and identity.epoch == epoch for _, identity in dead):
        return f"missed: no dead letter of epoch {epoch} (after the last reset)"
    actions = {closed.get(dead_letter_id) for dead_letter_id, _ in dead}
    if None in actions:
        return "dead letter"
    return "discarded" if "DISCARD" in actions else "redriven, not handled again"


def _redrives_handled(findings: Findings, msg_id: str, versions: list[int], redrives: int, applied: int,
                      dead: list[tuple[str, _DeadLetter]]) -> None:
    """Each redrive of ``msg_id`` appended to the redrive table once, and each of its rows there handled: applied
    (once, whatever the rows) if the fix covers it, else a dead letter of that version of the redrive table."""
    if len(versions) > redrives:
        findings.violation("dead_letter_unaccounted", f"{msg_id}: {len(versions)} rows in the redrive table for "
                                                      f"{redrives} redrive(s)")
    elif len(versions) < redrives:
        findings.violation("consumer_missed", f"{msg_id}: redriven {redrives} times, {len(versions)} row(s) in the "
                                              f"redrive table")
    if fixed_by_redrive(msg_id):
        if not applied:
            findings.violation("consumer_missed", f"{msg_id}: redriven (the fix covers it), never applied")
        return
    again = {identity.version for _, identity in dead if identity.source == _REDRIVE_SOURCE}
    for version in sorted(set(versions) - again):
        findings.violation("consumer_missed", f"{msg_id}: redriven in version {version} of the redrive table, "
                                              f"not a dead letter again")


def _reset_honoured(findings: Findings, reset: dict, messages: dict[str, dict], calls: list[dict]) -> None:
    """After the last reset, its processes delivered every message of each topic from the version it was reset to
    (applied already or not), and none before it."""
    after = set(reset["pids"])
    delivered = {call["msg_id"] for call in calls if call["pid"] in after and call["version"] != -1}
    for msg_id, message in messages.items():
        reset_to = reset["versions"].get(message["topic"])
        if reset_to is None:
            continue
        if message["version"] >= reset_to and msg_id not in delivered:
            findings.violation("reset_not_honoured", f"{message['topic']} {msg_id} at version {message['version']}: "
                                                     f"not delivered after the reset to version {reset_to}")
        elif message["version"] < reset_to and msg_id in delivered:
            findings.violation("reset_not_honoured", f"{message['topic']} {msg_id} at version {message['version']}: "
                                                     f"delivered after the reset to version {reset_to}")


def _overlaps(findings: Findings, calls: list[dict], pauses: list[dict]) -> list[dict]:
    """Two calls of one key (in one source) overlapping in time: allowed only where the first began before a pause
    of its process and was still running when it began, and the second began after that: another process's, or
    its own once the pause was over (it lost the share, and holds it again: a successor too)
    (coordinator/consumer/membership.py: what may overlap a successor's calls is only a call already running when
    the pause began). Returns
    the overlaps so allowed, each saying whether it reached past the successor's first call of the key since the
    pause began."""
    lanes: dict[tuple, list[dict]] = defaultdict(list)
    for call in calls:
        if call["keys"] is not None:
            source = _REDRIVE_SOURCE if call["version"] == -1 else call["topic"]
            lanes[source, call["topic"], call["keys"]].append(call)
    pauses_of: dict[int, list[dict]] = defaultdict(list)
    for pause in pauses:
        pauses_of[pause["pid"]].append(pause)
    allowed = []
    for (source, _, keys), lane in lanes.items():
        lane.sort(key=lambda call: call["start"])
        running: list[dict] = []
        for call in lane:
            running = [earlier for earlier in running if _end(earlier) > call["start"]]
            for earlier in running:
                pause = next((pause for pause in pauses_of[earlier["pid"]]
                              if earlier["start"] <= pause["begin_hi"] and _end(earlier) >= pause["begin_lo"]
                              and call["start"] >= (pause["begin_lo"] if call["pid"] != earlier["pid"]
                                                    else pause["resumed"])), None)
                what = (f"{source} key {keys}: {earlier['msg_id']} (pid {earlier['pid']}, {earlier['start']:.3f} to "
                        f"{_end(earlier):.3f}) and {call['msg_id']} (pid {call['pid']}, from {call['start']:.3f})")
                if pause is None:
                    findings.violation("consumer_overlap", f"{what}: the first not running when a pause of its "
                                                           f"process began, or the second begun before it")
                    continue
                first = min((other for other in lane if other["pid"] == call["pid"]
                             and other["start"] >= pause["begin_lo"]), key=lambda other: other["start"])
                allowed.append({"overlap": what, "past_first": first is not call})
            running.append(call)
    return allowed


def _fenced_calls(findings: Findings, calls: list[dict], pauses: list[dict]) -> None:
    """No call started by a process while its instance was fenced: past a liveness window since it last proved its
    hold on its shares, before it renewed its record (and then read its claims back)."""
    for pause in pauses:
        if "fenced" not in pause:
            continue
        since, until = pause["fenced"]
        for call in calls:
            if call["pid"] == pause["pid"] and since < call["start"] < until:
                findings.violation("consumer_fenced_call", f"{call['topic']} {call['msg_id']} called by pid "
                                                           f"{call['pid']} at {call['start']:.3f}, its instance fenced "
                                                           f"from {since:.3f} to {until:.3f}")


def _end(call: dict) -> float:
    return call["end"] if call.get("end") is not None else math.inf
