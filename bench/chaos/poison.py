"""The poisoning tenant of a chaos run (``--poison``): a group that writes, into its own prefix, every kind of
bytes the checker must refuse (:mod:`support.poisons`), round after round while the honest groups send.
Each poison must end in ``system/rejected`` with its reason, and cost nobody else anything."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Optional

from bench.chaos.options import POISON_GROUP
from bench.chaos.producer import ORDER_TOPIC
from support.poisons import INSTANCE_POISONS, POISONS, PoisonedLog
from coordinator.lakehouse import Lakehouse

__all__ = ["Poisoner", "Poisoning"]


@dataclass
class Poisoning:
    """One poison written: where (a commit log and its version, or an instance record's key), the refusal it
    must meet, and the reason ``system/rejected`` gave (``None`` until found)."""

    what: str
    commit_log: str
    commit_version: Optional[int]
    expected: str
    reason: Optional[str] = None


class Poisoner:
    """Writes :data:`POISON_GROUP`'s poisons (see the module's documentation)."""

    def __init__(self, lakehouse: Lakehouse) -> None:
        self.log = PoisonedLog(lakehouse, POISON_GROUP)
        self.written: list[Poisoning] = []
        self.rounds = 0

    @property
    def log_key(self) -> str:
        return self.log.key

    def poison(self) -> None:
        """One round: every commit-log poison. The first round also writes every instance-record poison, then
        a valid half that nobody answers: its checks make the checker survey the group's instance records."""
        if self.rounds == 0:
            for what, (make, expected) in INSTANCE_POISONS.items():
                key = self.log.instance_record(f"{uuid.uuid4().hex}.json", make(POISON_GROUP))
                self.written.append(Poisoning(what, key, None, expected))
        for what, poison in POISONS.items():
            self.written.append(Poisoning(what, self.log.key, poison.write(self.log), poison.reason))
        if self.rounds == 0:
            self.log.records({"record_id": uuid.uuid4().hex, "kind": "HALF", "transaction_id": uuid.uuid4().hex,
                              "producer_group": POISON_GROUP, "msg_id": uuid.uuid4().hex, "message_index": 0,
                              "message_count": 1, "topic": ORDER_TOPIC, "body": b"checked, never answered"})
        self.rounds += 1
