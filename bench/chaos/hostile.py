"""Hostile records a chaos run appends to a commit log: malformed ones, and forgeries (claiming another
group, an operator's mark, a topic the group is not granted). Each must end in ``system/rejected``."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Optional

import support
from bench.chaos.actors import table_rows
from bench.chaos.options import FORGED_GROUP
from bench.chaos.producer import AUDIT_TOPIC, KIND_UNKNOWN_FOREVER, ORDER_TOPIC, plan_id_of
from coordinator.lakehouse import Lakehouse
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.tables import HALF, OP

__all__ = ["BadInput", "HostileWriter"]


@dataclass
class BadInput:
    """A hostile record appended straight to the commit log, and what became of it."""

    what: str
    record_id: str
    reason: Optional[str] = None
    forgery: bool = False  # claims what its writer may not: another group, an operator's mark, an ungranted topic


class HostileWriter:
    """Appends records no well-behaved producer sends to the commit log of :data:`FORGED_GROUP`, a group
    whose principal may write only that log."""

    def __init__(self, lakehouse: Lakehouse, rng: random.Random) -> None:
        self.lakehouse, self.rng = lakehouse, rng
        self.injected: list[BadInput] = []

    def inject_blind(self) -> None:
        """Records that are refused whatever the lakehouse holds."""
        early_txn = uuid.uuid4().hex
        self._write([
            ("unknown kind", _end(kind="BOGUS")),
            ("null kind", _end(kind=None)),
            ("half without transaction_id", _half(transaction_id=None)),
            ("half with an empty body", _half(body=b"")),
            ("half with an invalid topic", _half(topic="no spaces allowed!")),
            ("half of an incomplete transaction", _half(message_count=2)),
            ("end with an unknown state", _end(state="MAYBE")),
            ("end of an unknown transaction", _end()),
            ("end without transaction_id", _end(transaction_id=None)),
            ("end before its half", _end(transaction_id=early_txn)),
        ])
        # The half the early END named, in a later commit: valid, but nobody answers its checks.
        with CommitLogWriter(self.lakehouse, FORGED_GROUP) as writer:
            writer.submit([_half(transaction_id=early_txn)]).result()

    def inject_targeted(self, plans: list[list[tuple[str, str]]], require_every_target: bool) -> bool:
        """Records aimed at real transactions: a pending one, a rolled-back one, a committed one.

        Returns ``False``, writing nothing, if ``require_every_target`` and one of them does not exist yet.
        """
        kind_of = {plan_id: kind for plan in plans for plan_id, kind in plan}
        halves = table_rows(self.lakehouse, HALF, ["transaction_id", "producer_group", "body", "message_index"])
        outcomes = {row["transaction_id"]: row["outcome"] for row in table_rows(self.lakehouse, OP, ["transaction_id", "outcome"])}
        ours = [row for row in halves if row["producer_group"] != FORGED_GROUP and row["message_index"] == 0]

        def pick(condition) -> Optional[dict]:
            candidates = [row for row in ours if condition(row)]
            return self.rng.choice(candidates) if candidates else None

        pending_forever = pick(lambda row: kind_of.get(plan_id_of(row["body"])) == KIND_UNKNOWN_FOREVER
                               and row["transaction_id"] not in outcomes)
        rolled_back = pick(lambda row: outcomes.get(row["transaction_id"]) == "ROLLBACK")
        committed = pick(lambda row: outcomes.get(row["transaction_id"]) == "COMMIT")
        if require_every_target and None in (pending_forever, rolled_back, committed):
            return False
        records, forgeries = [], []
        if pending_forever:
            records.append(("forged group commits a pending transaction",
                            _end(transaction_id=pending_forever["transaction_id"])))
            records.append(("null group commits a pending transaction",
                            _end(transaction_id=pending_forever["transaction_id"], producer_group=None)))
            forgeries = [
                ("claims the owner's group to commit a pending transaction",
                 _end(transaction_id=pending_forever["transaction_id"], producer_group=pending_forever["producer_group"])),
                ("an operator's mark from a group commits a pending transaction",
                 _end(transaction_id=pending_forever["transaction_id"], check_id=f"operator-{uuid.uuid4().hex}")),
                ("the owner's group and an operator's mark",
                 _end(transaction_id=pending_forever["transaction_id"], producer_group=pending_forever["producer_group"],
                      check_id=f"operator-{uuid.uuid4().hex}")),
                ("a half for a topic the group is not granted", _half(topic=AUDIT_TOPIC)),
                ("a half claiming another group", _half(producer_group=pending_forever["producer_group"])),
            ]
        if rolled_back:
            records.append(("owner commits a rolled-back transaction",
                            _end(transaction_id=rolled_back["transaction_id"], producer_group=rolled_back["producer_group"])))
        if committed:
            records.append(("second half for a committed transaction id",
                            _half(transaction_id=committed["transaction_id"], producer_group=committed["producer_group"])))
        if records:
            self._write(records, forgeries)
        return True

    def _write(self, records: list[tuple[str, dict]], forgeries: list[tuple[str, dict]] = ()) -> None:
        """Append ``records`` and ``forgeries`` (records claiming what their writer may not) as one commit."""
        with CommitLogWriter(self.lakehouse, FORGED_GROUP) as writer:
            writer.submit([record for _, record in [*records, *forgeries]]).result()
        self.injected += [BadInput(what, record["record_id"]) for what, record in records]
        self.injected += [BadInput(what, record["record_id"], forgery=True) for what, record in forgeries]



def _half(**overrides) -> dict:
    """A HALF record of the forging group; ``overrides`` replace any column (``transaction_id=None``: none)."""
    return support.half_record(uuid.uuid4().hex, FORGED_GROUP, ORDER_TOPIC, b"forged", keys="forged") | overrides


def _end(**overrides) -> dict:
    """A COMMIT END record of the forging group, of a new transaction id unless ``overrides`` say otherwise."""
    return support.end_record(uuid.uuid4().hex, group=FORGED_GROUP) | overrides
