"""Which instances of a consumer group are live: each keeps a record in ``consumers/<group>/_instances/``,
renewed every ``consumer_heartbeat_ms``, and is live while that record is at most :data:`LIVE_FOR_HEARTBEATS`
heartbeats old and, seen from its own host, its process runs (a killed process is passed over at once).

That is the one liveness rule of consumer instances: the others take an instance's shares once it breaks it, and
an instance stops starting calls before it could have broken it (:mod:`.membership`).

Beside the records, ``_instances/_changes`` holds the last :data:`KEPT_CHANGES` changes of the group's
membership (an instance joined, left, or was found dead by another), each with an id of its own: the others read
it at every look and apply what changed since they last did (:mod:`.membership`).

Example::

    instances = ConsumerInstances(Lakehouse("lakehouse"))
    instances.announce("credits", "9c1e…", heartbeat_s=3.0)
    [i.instance_id for i in instances.live("credits")]  # ['9c1e…']
    instances.record_change("credits", "joined", "9c1e…")
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping, Optional

from coordinator.control.instances import MAX_RECORDS_READ, InstanceRecord, InstanceRecords
from coordinator.control.processes import process_gone
from coordinator.storage import Versioned, read_all

__all__ = ["CHANGE_KINDS", "KEPT_CHANGES", "LIVE_FOR_HEARTBEATS", "ConsumerInstance", "ConsumerInstances",
           "membership_changes"]

#: An instance is live while its record is at most this many of its heartbeats old: with the live instances
#: looking every half heartbeat, a dead one's shares move within three heartbeats of its last.
LIVE_FOR_HEARTBEATS = 2
#: The membership changes kept in ``_instances/_changes``: an instance that missed more reads every record.
KEPT_CHANGES = 32
CHANGE_KINDS = frozenset({"joined", "left", "dead"})
_MAX_CHANGES_BYTES = 64 * 1024
#: How long a change is tried conditionally before it is written whatever is there.
_RECORD_WITHIN_S = 2.0


@dataclass(frozen=True)
class ConsumerInstance(InstanceRecord):
    """One consumer instance's record."""

    def is_live(self, now: float) -> bool:
        """Whether the instance is live at ``now`` by its record (see the module's docstring).

        Example::

            record.is_live(time.time())  # True
        """
        return now - self.last_seen <= LIVE_FOR_HEARTBEATS * self.heartbeat_s and not process_gone(asdict(self))


class ConsumerInstances(InstanceRecords):
    """The instances of each consumer group (see the module's docstring)."""

    record_type = ConsumerInstance
    record_name = "a consumer instance's record"

    def live(self, group: str) -> list[ConsumerInstance]:
        """The live instances of ``group``, by instance id. Reads every record (a LIST, a GET each); deletes nothing.

        Example::

            [i.instance_id for i in ConsumerInstances(lakehouse).live("credits")]  # ['9c1e…']
        """
        now = self.clock()
        records, _ = self._records(group)
        return sorted((record for record in records if record.is_live(now)), key=lambda record: record.instance_id)

    def joined(self, group: str, live: Iterable[str], listed: Mapping[str, int]) -> tuple[set[str], dict[str, int]]:
        """The instances of ``group`` live now that are not in ``live``, from one listing of the records: only
        a record written since the ``listed`` listing (each key with its time then), or not listed then, is read
        (a GET), so an unchanged group costs one LIST and its long-dead records nothing. Returns those instances,
        and this listing's keys and times for the next call.

        Example::

            joined, listed = instances.joined("credits", {"9c1e…"}, {})      # ({'5d41…'}, {...})
            instances.joined("credits", {"9c1e…", "5d41…"}, listed)          # (set(), {...}): a LIST alone
        """
        now = self.clock()
        listing = {key: at for key, at in self.files.modified(self._group_dir(group)).items() if key.endswith(".json")}
        known = {self._key(group, instance_id) for instance_id in live}
        written = sorted((key for key, at in listing.items() if key not in known and listed.get(key) != at),
                         key=lambda key: (-listing[key], key))[:MAX_RECORDS_READ]
        reads = read_all(lambda key: self._read_record(group, key), written, remote=not self.lakehouse.is_local)
        return {record.instance_id for record in reads
                if isinstance(record, ConsumerInstance) and record.is_live(now)}, listing

    def changes(self, group: str) -> Optional[Versioned]:
        """``group``'s membership changes as last written (one GET): read by :func:`membership_changes`; ``None``
        before the first.

        Example::

            ConsumerInstances(lakehouse).changes("credits")  # Versioned(b'[["5d41…", "joined", "9c1e…"]]', …)
        """
        return self.files.read(self._changes_key(group), max_bytes=_MAX_CHANGES_BYTES)

    def record_change(self, group: str, kind: str, instance_id: str) -> str:
        """Add a change of ``group``'s membership (``kind``: ``joined``, ``left`` or ``dead``, of ``instance_id``)
        to the last :data:`KEPT_CHANGES` ones, by a conditional write (two instances recording at once both
        land, one after the other); returns the change's id. Refused for :data:`_RECORD_WITHIN_S` seconds, it is
        written whatever is there: the changes it replaced are missing for the others, who then read every
        record.

        Example::

            ConsumerInstances(lakehouse).record_change("credits", "joined", "9c1e…")  # '5d41…'
        """
        key = self._changes_key(group)
        change = [uuid.uuid4().hex[:16], kind, instance_id]
        give_up_at, attempt = time.monotonic() + _RECORD_WITHIN_S, 0
        while time.monotonic() < give_up_at:
            current = self.changes(group)
            data = json.dumps(([*membership_changes(current)] if current is not None else [])[1 - KEPT_CHANGES:]
                              + [change]).encode()
            version = (self.files.create(key, data) if current is None
                       else self.files.replace(key, data, current.version))
            if version is not None:
                return change[0]
            attempt += 1  # another instance wrote first: after a while drawn at random, so that the losers spread
            time.sleep(random.uniform(0, min(0.1, 0.005 * 2 ** attempt)))
        self.files.put(key, json.dumps([change]).encode())
        return change[0]

    def is_live(self, group: str, instance_id: str) -> bool:
        """Whether ``instance_id``'s own record, read now, says it is live (one GET).

        Example::

            ConsumerInstances(lakehouse).is_live("credits", "9c1e…")  # True
        """
        record = self._read_record(group, self._key(group, instance_id))
        return isinstance(record, ConsumerInstance) and record.is_live(self.clock())

    def _group_dir(self, group: str) -> str:
        return f"{self.lakehouse.consumer_dir(group)}/_instances"

    def _changes_key(self, group: str) -> str:
        return f"{self._group_dir(group)}/_changes"


def membership_changes(written: Optional[Versioned]) -> list[tuple[str, str, str]]:
    """The changes :meth:`ConsumerInstances.record_change` wrote, oldest first, each ``(change id, kind, instance
    id)``; written by the group's instances, so untrusted: what is not one is left out, and bytes that are not a
    list of them read as no change at all (the reader then reads every record).

    Example::

        membership_changes(instances.changes("credits"))  # [('5d41…', 'joined', '9c1e…'), ...]
    """
    try:
        listed = json.loads(written.data) if written is not None else []
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return []
    if not isinstance(listed, list):
        return []
    return [tuple(change) for change in listed if isinstance(change, list) and len(change) == 3
            and all(isinstance(part, str) and 0 < len(part) <= 256 for part in change)
            and change[1] in CHANGE_KINDS]
