"""Step 1 — ingest: validate new HALF records and give each accepted half its queue offset."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

from coordinator.checker.context import OFFSETS_PER_COMMIT, BatchContext, BatchRecords, shaped
from coordinator.checker.refusals import first_failure, rejection
from coordinator.checker.state import Known, TrackedTransaction, pending_from_rows
from coordinator.grants import TopicGrants
from coordinator.protocol import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    DELAY_PROPERTIES,
    IMMUNITY_DIGITS,
    MAX_BODY_BYTES,
    MAX_IMMUNITY_SECONDS,
    TOPIC_CHARACTERS,
    TOPIC_MAX_LENGTH,
    TOPIC_PATTERN,
    RecordKind,
)
from coordinator.tables import HALF

_KINDS = frozenset(kind.value for kind in RecordKind)

_TOPIC = re.compile(f"[{TOPIC_CHARACTERS}]+")
_IMMUNITY = re.compile(IMMUNITY_DIGITS)


@dataclass(frozen=True)
class Ingested:
    """The halves a batch accepted (``system/half`` rows, and one pending
    transaction each) and the HALF records it refused (``system/rejected`` rows)."""

    halves: pa.Table
    transactions: list[TrackedTransaction]
    rejections: list[dict]


def refuse_unknown_kinds(records: BatchRecords) -> list[dict]:
    """Records that are neither HALF nor END, as rejections."""
    return [rejection(r, f"unknown record kind '{r['kind'] if r['kind'] is not None else 'null'}'")
            for r in records.rows if r["kind"] not in _KINDS]


def ingest_halves(ctx: BatchContext, records: BatchRecords, known: Mapping[str, Known]) -> Ingested:
    """Split this batch's HALF records into accepted halves and rejections.

    A transaction is all-or-nothing: if one of its messages is refused (a message for a topic its
    group is not granted, for one), all are.
    A transaction id already ingested by an earlier batch (one in ``known``) or
    commit is refused as a duplicate.

    Example::

        ingested = ingest_halves(ctx, records, known)
        ingested.halves.num_rows, len(ingested.rejections)
    """
    halves = [r for r in records.rows if r["kind"] == RecordKind.HALF]
    _number(halves)
    grants = TopicGrants(ctx.config.topic_grants)
    for record in halves:
        record["reason"] = (first_failure(record, _RECORD_RULES)
                            or grants.refusal(record["producer_group"], record["topic"]))
    _refuse_whole_transactions(halves, known)
    accepted = [r for r in halves if r["reason"] is None]
    table = _half_rows(ctx, records, accepted)
    return Ingested(table, pending_from_rows(table), [rejection(r, r["reason"]) for r in halves if r["reason"]])


def _number(halves: list[dict]) -> None:
    """Give each half its position in its commit and its queue offset (nulls sort first, as in SQL);
    see :mod:`.context` for the queue offset."""
    by_commit = defaultdict(list)
    for record in halves:
        by_commit[record["sequence"]].append(record)
    for sequence, commit in by_commit.items():
        commit.sort(key=lambda r: tuple((r[c] is not None, r[c] if r[c] is not None else 0)
                                        for c in ("record_id", "transaction_id", "message_index")))
        for position, record in enumerate(commit):
            record["position"] = position
            record["queue_offset"] = sequence * OFFSETS_PER_COMMIT + position


def _blank(name: str):
    # SQL's trim, which the rule had first: spaces only.
    return lambda r: r[name] is None or r[name].strip(" ") == ""


def _immunity(record: dict):
    for key, value in record["properties"] or ():
        if key == CHECK_IMMUNITY_TIME_IN_SECONDS:
            return value
    return None


def _bad_immunity(record: dict) -> bool:
    value = _immunity(record)
    return value is not None and not (_IMMUNITY.fullmatch(value) and 1 <= int(value) <= MAX_IMMUNITY_SECONDS)


def _bad_message_numbering(r: dict) -> bool:
    index, count = r["message_index"], r["message_count"]
    return count is None or count < 1 or index is None or index < 0 or index >= count


_RECORD_RULES = [
    (lambda r: r["record_id"] is None, "missing record_id"),
    (_blank("transaction_id"), "missing transaction_id"),
    (_blank("producer_group"), "missing producer_group"),
    (_blank("msg_id"), "missing msg_id"),
    (_blank("topic"), "missing topic"),
    (lambda r: len(r["topic"]) > TOPIC_MAX_LENGTH, f"topic longer than {TOPIC_MAX_LENGTH} characters"),
    (lambda r: not _TOPIC.fullmatch(r["topic"]), f"topic does not match {TOPIC_PATTERN}"),
    (lambda r: not r["body_size"], "empty body"),
    (lambda r: r["body_size"] > MAX_BODY_BYTES, f"body larger than {MAX_BODY_BYTES} bytes"),
    (_bad_message_numbering, "bad message_index/message_count"),
    (_bad_immunity, f"bad {CHECK_IMMUNITY_TIME_IN_SECONDS}"),
    (lambda r: r["position"] >= OFFSETS_PER_COMMIT, f"more than {OFFSETS_PER_COMMIT} records in one commit"),
]


def _refuse_whole_transactions(halves: list[dict], known: Mapping[str, Known]) -> None:
    """Apply the transaction-level rules: one commit, one group, every message present, a new id."""
    commits = defaultdict(list)  # (transaction id, commit sequence) -> its records
    first_commit: dict = {}
    for record in halves:
        key = (record["transaction_id"], record["sequence"])
        commits[key].append(record)
        first_commit[key[0]] = min(first_commit.get(key[0], key[1]), key[1])
    for (transaction_id, sequence), messages in commits.items():
        counts = [r["message_count"] for r in messages if r["message_count"] is not None]
        expected = max(counts, default=None)
        indexes = {r["message_index"] for r in messages if r["message_index"] is not None}
        incomplete = expected is not None and (len(messages) != expected or len(indexes) != expected or min(counts) != expected)
        groups = [r["producer_group"] for r in messages if r["producer_group"] is not None]
        for record in messages:
            if record["reason"] is not None:
                continue
            if sequence > first_commit[transaction_id] or transaction_id in known:
                record["reason"] = "duplicate transaction_id"
            elif incomplete:
                record["reason"] = "transaction's messages incomplete or inconsistent"
            elif groups and min(groups) != max(groups):
                record["reason"] = "transaction's messages name different producer groups"
        if any(r["reason"] is not None for r in messages):
            for record in messages:
                record["reason"] = record["reason"] or "another message of the transaction was refused"


def _half_rows(ctx: BatchContext, records: BatchRecords, accepted: list[dict]) -> pa.Table:
    """The accepted halves as ``system/half`` rows, in queue-offset order."""
    accepted = sorted(accepted, key=lambda r: r["queue_offset"])
    taken = records.table.take(pa.array([r["row"] for r in accepted], pa.int64()))
    default_ms = ctx.config.transaction_timeout_ms
    columns = {name: taken.column(name) for name in HALF.column_names if name in taken.column_names}
    columns.update(
        queue_offset=[r["queue_offset"] for r in accepted],
        properties=[None if r["properties"] is None else [(k, v) for k, v in r["properties"] if k not in DELAY_PROPERTIES]
                    for r in accepted],
        immunity_ms=[int(_immunity(r)) * 1000 if _immunity(r) is not None else default_ms for r in accepted],
    )
    return shaped(HALF, columns, len(accepted), ctx.batch_id)
