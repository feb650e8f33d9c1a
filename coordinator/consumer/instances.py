"""Which instances of a consumer group are live: each keeps a record in ``consumers/<group>/_instances/``,
renewed every ``consumer_heartbeat_ms``, and is live while that record is at most :data:`LIVE_FOR_HEARTBEATS`
heartbeats old and, seen from its own host, its process runs (a killed process is passed over at once).

That is the one liveness rule of consumer instances: the others take an instance's shares once it breaks it, and
an instance stops starting calls before it could have broken it (:mod:`.membership`).

Example::

    instances = ConsumerInstances(Lakehouse("lakehouse"))
    instances.announce("credits", "9c1e…", heartbeat_s=3.0)
    [i.instance_id for i in instances.live("credits")]  # ['9c1e…']
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from coordinator.control.instances import InstanceRecord, InstanceRecords
from coordinator.control.processes import process_gone

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

    def is_live(self, group: str, instance_id: str) -> bool:
        """Whether ``instance_id``'s own record, read now, says it is live (one GET).

        Example::

            ConsumerInstances(lakehouse).is_live("credits", "9c1e…")  # True
        """
        record = self._read_record(group, self._key(group, instance_id))
        return isinstance(record, ConsumerInstance) and record.is_live(self.clock())

    def _group_dir(self, group: str) -> str:
        return f"{self.lakehouse.consumer_dir(group)}/_instances"
