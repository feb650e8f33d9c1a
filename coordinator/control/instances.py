"""Which producer instances of a group are alive, so that each check goes to one of them.

Every producer instance announces itself in ``groups/<group>/_producers/<instance>.json``
(its host, pid and when it was last seen), renewed every ``producer_heartbeat_ms`` and removed
when it shuts down. An instance is live while its record is at most three heartbeats old and,
seen from its own host, while its process runs (a killed instance is passed over at once); the
checker addresses each check request to one live instance of the transaction's group, chosen
by the transaction and the check's number so that the checks of a group spread over its
instances and a check that went unanswered goes to another one next time. A record a crashed
instance left behind is stale once it is :data:`FORGET_AFTER_S` old (at once when its process
is seen gone from its host): reading the records (:meth:`ProducerInstances.survey`,
:meth:`ProducerInstances.live`) never deletes, the checker removes the stale records it found
(:meth:`ProducerInstances.forget`) after each batch's writes, so the directory holds one small file
per instance alive lately and nothing grows without bound.

Needs no JVM: producers write these files, the checker reads them (and removes the stale ones).

Example::

    instances = ProducerInstances("lakehouse")
    instances.announce("order_group", "3f2a…", heartbeat_s=2.0)
    [i.instance_id for i in instances.live("order_group")]  # ['3f2a…']
    instances.address("order_group", instances.live("order_group"), "txn-1", check_times=1)  # '3f2a…'
    instances.forget("order_group", instances.survey("order_group").stale)  # deletes the records of instances long gone
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Union
from urllib.parse import quote

from coordinator.control.processes import process_gone, this_process
from coordinator.lakehouse import Lakehouse

__all__ = ["FORGET_AFTER_S", "GroupSurvey", "LIVE_FOR_HEARTBEATS", "ProducerInstance", "ProducerInstances"]

#: An instance is live while its record is at most this many of its heartbeats old.
LIVE_FOR_HEARTBEATS = 3
#: A record this old (and not live) is stale: :meth:`ProducerInstances.forget` may remove it.
FORGET_AFTER_S = 3600.0


@dataclass(frozen=True)
class ProducerInstance:
    """One producer instance's record."""

    group: str
    instance_id: str
    host: str
    pid: int
    pid_namespace: Optional[str]
    started: Optional[str]
    last_seen: float  # seconds since the epoch
    heartbeat_s: float

    def renewed_recently(self, now: float) -> bool:
        """Whether it announced itself within its last three heartbeats before ``now``."""
        return now - self.last_seen <= LIVE_FOR_HEARTBEATS * self.heartbeat_s


@dataclass(frozen=True)
class GroupSurvey:
    """The records of one group, sorted: which instances are live, which records are stale."""

    live: list[ProducerInstance]  # by instance id
    stale: list[ProducerInstance]  # gone from their host, or older than FORGET_AFTER_S: to be forgotten


class ProducerInstances:
    """The producer instances of a lakehouse, by group (see the module's docstring)."""

    def __init__(self, lakehouse: Union[str, Lakehouse], clock: Callable[[], float] = time.time):
        self.lakehouse = Lakehouse.at(lakehouse)
        self.files = self.lakehouse.files
        self.clock = clock

    def announce(self, group: str, instance_id: str, heartbeat_s: float) -> None:
        """Record that ``instance_id`` of ``group`` is alive now; call every ``heartbeat_s``."""
        record = {"group": group, "instance_id": instance_id, **this_process(), "last_seen": self.clock(),
                  "heartbeat_s": heartbeat_s}
        self.files.put(self._key(group, instance_id), json.dumps(record).encode())

    def withdraw(self, group: str, instance_id: str) -> None:
        """Remove ``instance_id``'s record: it shuts down and answers no more checks."""
        self.files.delete(self._key(group, instance_id))

    def survey(self, group: str) -> GroupSurvey:
        """Read the records of ``group``: its live instances, and the stale records (see :meth:`forget`).
        Deletes nothing."""
        now = self.clock()
        live, stale = [], []
        for record in sorted(self._records(group), key=lambda record: record.instance_id):
            gone = process_gone(asdict(record))
            if record.renewed_recently(now) and not gone:
                live.append(record)
            elif gone or now - record.last_seen > FORGET_AFTER_S:
                stale.append(record)
        return GroupSurvey(live, stale)

    def live(self, group: str) -> list[ProducerInstance]:
        """The live instances of ``group``, by instance id. Deletes nothing."""
        return self.survey(group).live

    def forget(self, group: str, stale: list[ProducerInstance]) -> None:
        """Remove the records of ``stale`` instances of ``group`` (its :meth:`survey`'s ``stale``)."""
        for record in stale:
            self.withdraw(group, record.instance_id)

    @staticmethod
    def address(group: str, live: list[ProducerInstance], transaction_id: str, check_times: int) -> Optional[str]:
        """The instance a check goes to: one of ``live``, by the transaction and the check's number;
        ``None`` (every instance of the group may answer) when none is live."""
        if not live:
            return None
        key = f"{group}\0{transaction_id}\0{check_times}".encode()
        return live[zlib.crc32(key) % len(live)].instance_id

    def _records(self, group: str) -> list[ProducerInstance]:
        records = []
        for key in self.files.list(self._group_dir(group)):
            current = self.files.read(key) if key.endswith(".json") else None
            if current is None:
                continue  # withdrawn meanwhile
            try:
                records.append(ProducerInstance(**json.loads(current.data)))
            except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
                continue  # not one of ours
        return records

    def _group_dir(self, group: str) -> str:
        return f"{self.lakehouse.group_dir(group)}/_producers"

    def _key(self, group: str, instance_id: str) -> str:
        return f"{self._group_dir(group)}/{quote(instance_id, safe='')}.json"
