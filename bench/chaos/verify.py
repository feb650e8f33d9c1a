"""The verdict of a chaos run: the invariants of docs/design.md#invariants, from the Delta tables against
the producers' SQLite databases (their ground truth)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Sequence

import support
from bench.chaos.actors import Producer, table_rows
from bench.chaos.hostile import BadInput
from bench.chaos.poison import Poisoning
from bench.chaos.producer import COMMITTED, HALF_NOT_STORED, HALF_OUTCOME_UNKNOWN, INTERRUPTED, REVIEW, Store, group_of, plan_id_of
from coordinator.commit_logs import CommitLogs
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse, topic_names
from coordinator.tables import CHECK_REQUESTS, HALF, OP, REJECTED

__all__ = ["EXAMPLES", "Findings", "GroundTruth", "Tables", "verify"]

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
