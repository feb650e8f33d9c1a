"""Which instances of a consumer group are live: each keeps a record in ``consumers/<group>/_instances/``,
renewed every ``consumer_heartbeat_ms``, and is live while that record is at most :data:`LIVE_FOR_HEARTBEATS`
heartbeats old and, seen from its own host, its process runs (a killed process is passed over at once).

That is the one liveness rule of consumer instances: the others take an instance's shares once it breaks it, and
an instance stops starting calls before it could have broken it (:mod:`.membership`).

Beside the records, ``_instances/_changed`` holds a random token, rewritten by whoever changes the group's
membership (an instance joining or leaving, one finding another dead): the others read it at every look and list
the records only when it changed (:mod:`.membership`).

Example::

    instances = ConsumerInstances(Lakehouse("lakehouse"))
    instances.announce("credits", "9c1e…", heartbeat_s=3.0)
    [i.instance_id for i in instances.live("credits")]  # ['9c1e…']
    instances.mark_changed("credits")                    # b'5d41…'
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping, Optional

from coordinator.control.instances import MAX_RECORD_BYTES, MAX_RECORDS_READ, InstanceRecord, InstanceRecords
from coordinator.control.processes import process_gone
from coordinator.storage import read_all

__all__ = ["LIVE_FOR_HEARTBEATS", "ConsumerInstance", "ConsumerInstances"]

#: An instance is live while its record is at most this many of its heartbeats old: with the live instances
#: looking every half heartbeat, a dead one's shares move within three heartbeats of its last.
LIVE_FOR_HEARTBEATS = 2


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

    def changes(self, group: str) -> Optional[bytes]:
        """The token of ``group``'s last membership change (one GET), ``None`` before the first.

        Example::

            ConsumerInstances(lakehouse).changes("credits")  # b'5d41…'
        """
        current = self.files.read(self._changed_key(group), max_bytes=MAX_RECORD_BYTES)
        return None if current is None else current.data

    def mark_changed(self, group: str) -> bytes:
        """Say that ``group``'s membership changed (a PUT of a new token, which it returns): each instance lists
        the records again at its next look.

        Example::

            ConsumerInstances(lakehouse).mark_changed("credits")  # b'5d41…'
        """
        token = uuid.uuid4().hex.encode()
        self.files.put(self._changed_key(group), token)
        return token

    def is_live(self, group: str, instance_id: str) -> bool:
        """Whether ``instance_id``'s own record, read now, says it is live (one GET).

        Example::

            ConsumerInstances(lakehouse).is_live("credits", "9c1e…")  # True
        """
        record = self._read_record(group, self._key(group, instance_id))
        return isinstance(record, ConsumerInstance) and record.is_live(self.clock())

    def _group_dir(self, group: str) -> str:
        return f"{self.lakehouse.consumer_dir(group)}/_instances"

    def _changed_key(self, group: str) -> str:
        return f"{self._group_dir(group)}/_changed"
