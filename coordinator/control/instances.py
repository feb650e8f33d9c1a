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

Each instance also claims a commit log of the group for itself (:meth:`ProducerInstances.claim_log`,
``groups/<group>/_producers/commit_log.<n>.claim``): a log is free while its claim is missing or
names an instance not live, so the logs a group has are as many as its instances running at once.

A group writes its own records, so they are untrusted bytes: a record that is not one (not JSON,
a field missing or of another type, another group's or instance's name in it, larger than
:data:`MAX_RECORD_BYTES`) is *refused* with the reason (``GroupSurvey.refused``), which the checker
records in ``system/rejected`` before it removes the file. At most :data:`MAX_RECORDS_READ` records
of a group are read, the latest written first: thousands of them cost their group a few checks
that go unanswered, never the checker's time.

Needs no JVM: producers write these files, the checker reads them (and removes the stale ones).

Example::

    instances = ProducerInstances("lakehouse")
    instances.announce("order_group", "3f2a…", heartbeat_s=2.0)
    [i.instance_id for i in instances.live("order_group")]  # ['3f2a…']
    instances.address("order_group", instances.live("order_group"), "txn-1", check_times=1)  # '3f2a…'
    instances.forget("order_group", instances.survey("order_group").stale)  # deletes the records of instances long gone
    instances.claim_log("order_group", "3f2a…").key  # 'groups/order_group/commit_log' (the first instance's)
"""

from __future__ import annotations

import json
import math
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence, Union
from urllib.parse import quote, unquote

from coordinator.commit_logs import LOGS_PER_GROUP, CommitLogRef
from coordinator.control.processes import process_gone, this_process
from coordinator.exceptions import CorruptInputError, FileTooLargeError
from coordinator.lakehouse import Lakehouse
from coordinator.storage import read_all

__all__ = ["FORGET_AFTER_S", "GroupSurvey", "InstanceRecord", "InstanceRecords", "claim_owner", "json_object",
           "LIVE_FOR_HEARTBEATS", "MAX_RECORDS_READ", "MAX_RECORD_BYTES", "ProducerInstance", "ProducerInstances",
           "RefusedRecord"]

#: An instance is live while its record is at most this many of its heartbeats old.
LIVE_FOR_HEARTBEATS = 3
#: A record this old (and not live) is stale: :meth:`ProducerInstances.forget` may remove it.
FORGET_AFTER_S = 3600.0
#: The most records of one group a survey reads (the latest written); an instance's record is under 300 bytes.
MAX_RECORDS_READ = 256
MAX_RECORD_BYTES = 4096


@dataclass(frozen=True)
class InstanceRecord:
    """What an instance of a group (a producer's, a consumer's) says of itself in its record."""

    group: str
    instance_id: str
    host: str
    pid: int
    pid_namespace: Optional[str]
    started: Optional[str]
    last_seen: float  # seconds since the epoch
    heartbeat_s: float


@dataclass(frozen=True)
class ProducerInstance(InstanceRecord):
    """One producer instance's record."""

    def renewed_recently(self, now: float) -> bool:
        """Whether it announced itself within its last three heartbeats before ``now``."""
        return now - self.last_seen <= LIVE_FOR_HEARTBEATS * self.heartbeat_s


@dataclass(frozen=True)
class RefusedRecord:
    """A file in a group's ``_producers/`` that is not an instance's record: its key and why."""

    key: str
    reason: str


@dataclass(frozen=True)
class GroupSurvey:
    """The records of one group, sorted: which instances are live, which records are stale, and the
    files refused as records."""

    live: list[ProducerInstance]  # by instance id
    stale: list[ProducerInstance]  # gone from their host, or older than FORGET_AFTER_S: to be forgotten
    refused: list[RefusedRecord] = field(default_factory=list)  # by key: to be recorded, then removed


class InstanceRecords:
    """The records instances of a kind keep of themselves, by group, each in a directory of its group's
    (:meth:`_group_dir`) and parsed as :attr:`record_type`: the writing and reading every kind shares."""

    record_type: type = InstanceRecord
    #: What a record is called in a refusal's reason.
    record_name = "an instance's record"

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
        """Remove ``instance_id``'s record: it shuts down."""
        self.files.delete(self._key(group, instance_id))

    def _records(self, group: str) -> tuple[list[InstanceRecord], list[RefusedRecord]]:
        """The group's records, the latest :data:`MAX_RECORDS_READ` written (read at once on object
        storage), and the files refused as records."""
        listed = {key: at for key, at in self.files.modified(self._group_dir(group)).items() if key.endswith(".json")}
        keys = sorted(listed, key=lambda key: (-listed[key], key))[:MAX_RECORDS_READ]
        reads = read_all(lambda key: self._read_record(group, key), keys, remote=not self.lakehouse.is_local)
        records = [read for read in reads if isinstance(read, self.record_type)]
        return records, [read for read in reads if isinstance(read, RefusedRecord)]

    def _read_record(self, group: str, key: str) -> Union[InstanceRecord, RefusedRecord, None]:
        """The record at ``key``; ``None`` if it was withdrawn meanwhile."""
        try:
            current = self.files.read(key, max_bytes=MAX_RECORD_BYTES)
        except FileTooLargeError as error:
            return RefusedRecord(key, f"not {self.record_name}: {error}")
        if current is None:
            return None
        try:
            fields = _parsed(current.data, group, unquote(key.rsplit("/", 1)[-1].removesuffix(".json")))
        except CorruptInputError as error:
            return RefusedRecord(key, f"not {self.record_name}: {error}"[:512])
        return self.record_type(**fields)

    def _group_dir(self, group: str) -> str:
        raise NotImplementedError

    def _key(self, group: str, instance_id: str) -> str:
        return f"{self._group_dir(group)}/{quote(instance_id, safe='')}.json"


class ProducerInstances(InstanceRecords):
    """The producer instances of a lakehouse, by group (see the module's docstring)."""

    record_type = ProducerInstance
    record_name = "a producer instance's record"

    def survey(self, group: str) -> GroupSurvey:
        """Read the records of ``group``: its live instances, the stale records (see :meth:`forget`) and
        the files refused as records. Deletes nothing."""
        now = self.clock()
        live, stale = [], []
        records, refused = self._records(group)
        for record in sorted(records, key=lambda record: record.instance_id):
            gone = process_gone(asdict(record))
            if record.renewed_recently(now) and not gone:
                live.append(record)
            elif gone or now - record.last_seen > FORGET_AFTER_S:
                stale.append(record)
        return GroupSurvey(live, stale, sorted(refused, key=lambda refusal: refusal.key))

    def live(self, group: str) -> list[ProducerInstance]:
        """The live instances of ``group``, by instance id. Deletes nothing."""
        return self.survey(group).live

    def forget(self, group: str, stale: list[ProducerInstance], refused: Sequence[RefusedRecord] = ()) -> None:
        """Remove the records of ``stale`` instances of ``group`` (its :meth:`survey`'s ``stale``), and the
        files ``refused`` as records."""
        for record in stale:
            self.withdraw(group, record.instance_id)
        for refusal in refused:
            self.files.delete(refusal.key)

    @staticmethod
    def address(group: str, live: list[ProducerInstance], transaction_id: str, check_times: int) -> Optional[str]:
        """The instance a check goes to: one of ``live``, by the transaction and the check's number;
        ``None`` (every instance of the group may answer) when none is live."""
        if not live:
            return None
        key = f"{group}\0{transaction_id}\0{check_times}".encode()
        return live[zlib.crc32(key) % len(live)].instance_id

    def claim_log(self, group: str, instance_id: str) -> CommitLogRef:
        """Claim a commit log of ``group`` for ``instance_id``, whose record must be written first
        (:meth:`announce`): the lowest-numbered log whose claim is missing or names an instance that
        is not live, taken by a conditional write (two instances starting at once never take the
        same one), kept while the instance's record stays live. With all :data:`LOGS_PER_GROUP` taken,
        one picked by the instance id, shared: a log takes its writers' commits in turn, so a claim
        is about speed, never about what is stored. A claim file that is not one (the group's own
        bytes) counts as free, one too large as taken.

        Example::

            ProducerInstances("lakehouse").claim_log("order_group", "3f2a…")  # CommitLogRef('groups/order_group/commit_log.1')
        """
        live = {record.instance_id for record in self.live(group)}
        claim = json.dumps({"instance_id": instance_id}).encode()
        listed = set(self.files.modified(self._group_dir(group)))
        for number in range(LOGS_PER_GROUP):
            key = self._claim_key(group, number)
            try:
                current = self.files.read(key, max_bytes=MAX_RECORD_BYTES) if key in listed else None
            except FileTooLargeError:
                continue
            if current is None:
                won = self.files.create(key, claim) is not None
            else:
                owner = claim_owner(current.data)
                if owner == instance_id:
                    won = True
                elif owner in live:
                    continue
                else:
                    won = self.files.replace(key, claim, current.version) is not None
            if won:
                return CommitLogRef.of_group(group, number)
        return CommitLogRef.of_group(group, zlib.crc32(instance_id.encode()) % LOGS_PER_GROUP)

    def release_log(self, group: str, instance_id: str, log: CommitLogRef) -> None:
        """Give up ``instance_id``'s claim of ``log`` (it shuts down), unless another instance holds it now.

        Example::

            instances.release_log("order_group", "3f2a…", CommitLogRef("groups/order_group/commit_log.1"))
        """
        key = self._claim_key(group, log.number or 0)
        try:
            current = self.files.read(key, max_bytes=MAX_RECORD_BYTES)
        except FileTooLargeError:
            return
        if current is not None and claim_owner(current.data) == instance_id:
            self.files.delete(key)

    def _group_dir(self, group: str) -> str:
        return f"{self.lakehouse.group_dir(group)}/_producers"

    def _claim_key(self, group: str, number: int) -> str:
        return f"{self._group_dir(group)}/commit_log.{number}.claim"


def claim_owner(data: bytes) -> Optional[str]:
    """The instance a claim names (a producer's commit log's, a consumer's share's); ``None`` for bytes that are
    no claim.

    Example::

        claim_owner(b'{"instance_id": "3f2a"}')  # '3f2a'
    """
    try:
        owner = json.loads(data).get("instance_id")
    except (ValueError, RecursionError, AttributeError):
        return None
    return owner if isinstance(owner, str) else None


def json_object(data: bytes) -> dict:
    """The JSON object a small record written by a group holds; :class:`CorruptInputError` for bytes that are
    not one (the records are untrusted bytes).

    Example::

        json_object(b'{"instance_id": "3f2a"}')  # {'instance_id': '3f2a'}
    """
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        raise CorruptInputError("not JSON") from None
    if not isinstance(raw, dict):
        raise CorruptInputError("not a JSON object")
    return raw


def _parsed(data: bytes, group: str, instance_id: str) -> dict:
    """The fields of the instance record in ``data``, held to their shape; :class:`CorruptInputError` saying what
    is wrong."""
    raw = json_object(data)
    kinds = {"group": (str,), "instance_id": (str,), "host": (str,), "pid": (int,), "last_seen": (int, float),
             "heartbeat_s": (int, float), "pid_namespace": (str, type(None)), "started": (str, type(None))}
    optional = {"pid_namespace", "started"}  # not written by the first versions
    for name, allowed in kinds.items():
        if name not in raw and name not in optional:
            raise CorruptInputError(f"no {name}")
        if not isinstance(raw.get(name), allowed) or isinstance(raw.get(name), bool):
            raise CorruptInputError(f"{name} is {type(raw.get(name)).__name__}")
    if raw["group"] != group or raw["instance_id"] != instance_id:
        raise CorruptInputError(f"it names group {raw['group'][:128]!r} and instance {raw['instance_id'][:128]!r}, "
                         f"but is instance {instance_id[:128]!r}'s record of group {group!r}")
    if not (math.isfinite(raw["last_seen"]) and math.isfinite(raw["heartbeat_s"]) and raw["heartbeat_s"] > 0):
        raise CorruptInputError("last_seen and heartbeat_s must be finite, heartbeat_s positive")
    return {name: raw.get(name) for name in kinds}
