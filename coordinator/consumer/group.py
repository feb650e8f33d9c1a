"""A consumer group's records in its own prefix, ``consumers/<group>/``, with the conditional writes that keep
each one single-writer (:mod:`coordinator.storage`).

* ``_grant.json``: the topics the group may read and how many shares each topic is split into, written by
  operators only (``txcoord add-consumer-group``); the storage lets the group read it, never write it;
* ``_instances/<instance>.json``: each live instance's record, renewed every ``consumer_heartbeat_ms``
  (:class:`ConsumerInstances`, as producer instances announce themselves); live while at most
  :data:`LIVE_FOR_HEARTBEATS` heartbeats old and its process runs;
* ``shares/<topic>/<share>.claim``: which instance handles a share now, taken by a conditional create, or a
  conditional replace of a claim naming an instance that is not live or released by its instance
  (:meth:`ConsumerGroup.claim_share`); given up by a conditional replace with a released claim
  (:meth:`ConsumerGroup.release_share`), so that a release never removes a claim written since;
* ``progress/<topic>/<share>.json``: the share's position and retry state (:class:`ShareProgress`), replaced
  only if unchanged since its holder read or wrote it, so an instance that lost its share cannot write over
  its successor's; ``progress/<topic>/_start.json``: where the group started on the topic, fixed once;
* ``dead_letters``, ``operator_actions``, ``redrive``: Delta tables (``coordinator.tables``).

The group writes its own records: to anyone else they are untrusted bytes, and a record that is not one is
refused with the reason (:class:`~coordinator.exceptions.CorruptInputError`), stopping that group alone.

Example::

    group = ConsumerGroup(Lakehouse("lakehouse"), "credits")
    group.grant().topics                                  # ('ORDER_TOPIC',)
    group.claim_share("ORDER_TOPIC", 3, "9c1e…", live={"9c1e…"})   # '5d41…' (the claim's version) or None
    progress, version = group.progress("ORDER_TOPIC", 3)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase
from typing import Callable, Iterable, Optional, Union

from coordinator.control.instances import GroupSurvey, ProducerInstance, ProducerInstances, claim_owner, json_object
from coordinator.control.processes import process_gone
from coordinator.exceptions import AccessDeniedError, CorruptInputError, FileTooLargeError
from coordinator.lakehouse import Lakehouse

__all__ = ["DEFAULT_SHARES", "GRANT_FILE", "LIVE_FOR_HEARTBEATS", "MAX_SHARES", "REDRIVE_SOURCE", "ConsumerGroup",
           "ConsumerInstances", "GroupGrant", "ShareProgress", "share_of", "share_owners"]

#: Shares a topic is split into when ``txcoord add-consumer-group`` is not told: the most instances of a group
#: that can share one topic's work.
DEFAULT_SHARES = 16
MAX_SHARES = 1024
GRANT_FILE = "_grant.json"
#: An instance is live while its record is at most this many heartbeats old: with the live instances looking
#: every half heartbeat, a dead one's shares move within three heartbeats of its last.
LIVE_FOR_HEARTBEATS = 2
#: The name under ``progress/`` and ``shares/`` of the group's redrive table, consumed like a topic of its own
#: (``~`` is in no topic's name).
REDRIVE_SOURCE = "~redrive"
_MAX_RECORD_BYTES = 1024 * 1024  # a progress record lists up to consumer_max_buffered offsets and retries


def share_of(keys: Optional[str], msg_id: str, shares: int) -> int:
    """The share of a message: a stable hash of its ``keys``, or of its ``msg_id`` when it has none, so that
    the messages of one key are always in one share (and handled in order by one instance).

    Example::

        share_of("order-42", "9f2c…", 16)  # 11, on every host and every run
    """
    text = keys if keys else f"\0{msg_id}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % shares


def share_owners(group: str, topic: str, shares: int, live: Iterable[str]) -> list[Optional[str]]:
    """Which of the ``live`` instances should hold each of the ``shares`` of ``topic``: rendezvous hashing with
    bounded loads. Shares in order, each goes to the instance its hash ranks first among those with room, where
    each has room for ``shares // len(live)`` and ``shares % len(live)`` of them for one more: every instance
    computes the same answer from the same live set, and each holds its part, give or take one (plain rendezvous
    hashing spread them by chance: of two instances and 16 shares, one held 10 or more in 45 % of starts, and
    the group went at the pace of the busier). ``None`` each when none is live.

    Example::

        share_owners("credits", "ORDER_TOPIC", 4, ["a1", "b2"])  # ['a1', 'b2', 'a1', 'b2']
    """
    instances = sorted(set(live))
    if not instances:
        return [None] * shares
    part, one_more = divmod(shares, len(instances))
    held: dict[str, int] = dict.fromkeys(instances, 0)
    owners: list[Optional[str]] = []
    for share in range(shares):
        def weight(instance: str) -> bytes:
            return hashlib.blake2b(f"{group}\0{topic}\0{share}\0{instance}".encode(), digest_size=8).digest()

        with_room = [instance for instance in instances
                     if held[instance] < part or (held[instance] == part and one_more)]
        owner = max(with_room, key=lambda instance: (weight(instance), instance))
        if held[owner] == part:
            one_more -= 1
        held[owner] += 1
        owners.append(owner)
    return owners


@dataclass(frozen=True)
class GroupGrant:
    """What an operator granted a consumer group: the topics it may read (names or shell-style patterns), how many
    shares each topic is split into, and who granted it when."""

    group: str
    topics: tuple[str, ...]
    shares: int = DEFAULT_SHARES
    granted_by: str = ""
    granted_at: str = ""

    def refusal(self, topic: str) -> Optional[str]:
        """Why the group may not read ``topic`` (naming its grant), or ``None`` when it may.

        Example::

            GroupGrant("credits", ("ORDER_*",)).refusal("PAYMENTS")  # "consumer group 'credits' may not read ..."
        """
        if any(fnmatchcase(topic, pattern) for pattern in self.topics):
            return None
        return (f"consumer group {self.group!r} may not read topic {topic!r}: its grant "
                f"(consumers/{self.group}/{GRANT_FILE}) names {', '.join(self.topics) or 'no topic'}; an operator "
                f"grants it with `txcoord add-consumer-group {self.group} --topics {' '.join((*self.topics, topic))}`")


@dataclass
class ShareProgress:
    """A share's progress in one topic: every message of the share in versions before ``version`` is handled,
    and so are those in ``done`` (version -> queue offsets) and those with a queue offset below ``floor`` (a
    reset to an offset). ``retrying`` holds, by queue offset, each message that failed and is not handled yet:
    ``attempts`` made, ``due_ms`` (epoch milliseconds) of the next, the ``error`` of the last, and ``dead``
    once it used up its attempts (its dead letter being written). ``dead_letters``: how many this share wrote,
    which numbers the next one."""

    version: int
    floor: int = 0
    done: dict[int, list[int]] = field(default_factory=dict)
    retrying: dict[int, dict] = field(default_factory=dict)
    dead_letters: int = 0

    def to_json(self, writer: str, now: float) -> bytes:
        """The record's bytes, naming its writer and time (which makes every write's content unique)."""
        record = asdict(self) | {"written_by": writer, "written_at": now, "nonce": uuid.uuid4().hex}
        record["done"] = {str(version): offsets for version, offsets in self.done.items()}
        record["retrying"] = {str(offset): retry for offset, retry in self.retrying.items()}
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> "ShareProgress":
        """The record in ``data``, held to its shape: :class:`CorruptInputError` saying what is wrong."""
        raw = json_object(data)
        for name in ("version", "floor", "dead_letters"):
            if not _is_int(raw.get(name)) or raw[name] < (-1 if name == "version" else 0):
                raise CorruptInputError(f"{name} is not a whole number of the right sign: {raw.get(name)!r}"[:300])
        done, retrying = raw.get("done"), raw.get("retrying")
        if not isinstance(done, dict) or not all(
                _is_digits(version) and isinstance(offsets, list) and all(map(_is_int, offsets))
                for version, offsets in done.items()):
            raise CorruptInputError("done is not a map of versions to lists of queue offsets")
        if not isinstance(retrying, dict) or not all(_is_digits(offset) and _is_retry(retry)
                                                     for offset, retry in retrying.items()):
            raise CorruptInputError("retrying is not a map of queue offsets to {attempts, due_ms, error, dead}")
        return cls(raw["version"], raw["floor"], {int(v): list(o) for v, o in done.items()},
                   {int(offset): dict(retry) for offset, retry in retrying.items()}, raw["dead_letters"])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_digits(text: object) -> bool:
    return isinstance(text, str) and text.isdigit() and len(text) < 20


def _is_retry(retry: object) -> bool:
    return (isinstance(retry, dict) and _is_int(retry.get("attempts")) and retry["attempts"] >= 0
            and _is_int(retry.get("due_ms")) and isinstance(retry.get("error"), (str, type(None)))
            and isinstance(retry.get("dead", False), bool))


class ConsumerInstances(ProducerInstances):
    """The instances of each consumer group (``consumers/<group>/_instances/``): records, heartbeats and
    surveys as producer instances have (:class:`~coordinator.control.instances.ProducerInstances`), live while at
    most :data:`LIVE_FOR_HEARTBEATS` heartbeats old.

    Example::

        instances = ConsumerInstances(Lakehouse("lakehouse"))
        instances.announce("credits", "9c1e…", heartbeat_s=2.0)
        [i.instance_id for i in instances.live("credits")]  # ['9c1e…']
    """

    def survey(self, group: str) -> GroupSurvey:
        """The records of ``group``: live instances, stale records, files refused as records. Deletes nothing.

        Example::

            ConsumerInstances(lakehouse).survey("credits").live
        """
        now = self.clock()
        live, stale = [], []
        records, refused = self._records(group)
        for record in sorted(records, key=lambda record: record.instance_id):
            if _is_live(record, now):
                live.append(record)
            else:
                stale.append(record)
        return GroupSurvey(live, stale, sorted(refused, key=lambda refusal: refusal.key))

    def is_live(self, group: str, instance_id: str) -> bool:
        """Whether ``instance_id``'s own record, read now, says it is live (as :meth:`survey` judges).

        Example::

            ConsumerInstances(lakehouse).is_live("credits", "9c1e…")  # True
        """
        record = self._read_record(group, self._key(group, instance_id))
        if not isinstance(record, ProducerInstance):
            return False
        return _is_live(record, self.clock())

    def _group_dir(self, group: str) -> str:
        return f"{self.lakehouse.consumer_dir(group)}/_instances"


def _is_live(record: ProducerInstance, now: float) -> bool:
    return now - record.last_seen <= LIVE_FOR_HEARTBEATS * record.heartbeat_s and not process_gone(asdict(record))


class ConsumerGroup:
    """The records of consumer group ``group`` in ``lakehouse`` (see the module's docstring)."""

    def __init__(self, lakehouse: Union[str, Lakehouse], group: str, clock: Callable[[], float] = None):
        import time

        self.lakehouse = Lakehouse.at(lakehouse)
        self.files = self.lakehouse.files
        self.group = group
        self.clock = clock or time.time
        self.instances = ConsumerInstances(self.lakehouse, clock=self.clock)
        self.directory = self.lakehouse.consumer_dir(group)

    def grant(self) -> Optional[GroupGrant]:
        """The group's grant, or ``None`` if an operator never added the group; :class:`CorruptInputError` if
        the file is not a grant.

        Example::

            ConsumerGroup(lakehouse, "credits").grant()  # GroupGrant(group='credits', topics=('ORDER_TOPIC',), ...)
        """
        try:
            found = self.files.read(f"{self.directory}/{GRANT_FILE}", max_bytes=64 * 1024)
        except FileTooLargeError as error:
            raise CorruptInputError(f"consumer group {self.group!r}'s grant: {error}") from None
        if found is None:
            return None
        try:
            raw = json.loads(found.data)
            topics = raw["topics"]
            if (raw.get("group") != self.group or not isinstance(topics, list)
                    or not all(isinstance(t, str) and t for t in topics)
                    or not _is_int(raw.get("shares")) or not 1 <= raw["shares"] <= MAX_SHARES):
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):
            raise CorruptInputError(f"consumers/{self.group}/{GRANT_FILE} is not consumer group {self.group!r}'s "
                                    "grant: an operator writes it again with `txcoord add-consumer-group`") from None
        return GroupGrant(self.group, tuple(topics), raw["shares"], str(raw.get("granted_by", "")),
                          str(raw.get("granted_at", "")))

    def write_grant(self, topics: Iterable[str], shares: int, operator: str) -> GroupGrant:
        """Record (replacing any) the group's grant: an operator's write. The number of shares is fixed once the
        group has progress: a new number is refused then.

        Example::

            ConsumerGroup(lakehouse, "credits").write_grant(["ORDER_TOPIC"], 16, "alice@ops")
        """
        current = self._current_grant_or_none()
        if current is not None and current.shares != shares and self.files.directories(f"{self.directory}/progress"):
            raise AccessDeniedError(f"consumer group {self.group!r} has progress in {current.shares} shares a topic; "
                                    f"its shares cannot change to {shares}")
        grant = GroupGrant(self.group, tuple(dict.fromkeys(topics)), shares, operator,
                           dt.datetime.fromtimestamp(self.clock(), dt.timezone.utc).isoformat())
        self.files.put(f"{self.directory}/{GRANT_FILE}", json.dumps(asdict(grant)).encode())
        return grant

    def require_grant(self, topics: Iterable[str]) -> GroupGrant:
        """The group's grant if it covers every one of ``topics``; else :class:`AccessDeniedError` naming the grant.

        Example::

            ConsumerGroup(lakehouse, "credits").require_grant(["ORDER_TOPIC"]).shares  # 16
        """
        grant = self.grant()
        topics = list(topics)
        if grant is None:
            raise AccessDeniedError(f"consumer group {self.group!r} has no grant (consumers/{self.group}/{GRANT_FILE}): "
                                    f"an operator adds it with `txcoord add-consumer-group {self.group} --topics "
                                    f"{' '.join(topics)}`")
        for topic in topics:
            refusal = grant.refusal(topic)
            if refusal:
                raise AccessDeniedError(refusal)
        return grant

    def claim_share(self, topic: str, share: int, instance_id: str, live: set[str]) -> Optional[str]:
        """Take ``share`` of ``topic`` for ``instance_id``: created if no claim is there, kept if it names this
        instance, replaced (conditionally) if it names one neither in ``live`` nor live by its record read after
        the claim, or is no claim (a released one: :meth:`release_share`); the claim's version, or ``None`` when
        another live instance holds it or won the race.

        Example::

            group.claim_share("ORDER_TOPIC", 3, "9c1e…", live={"9c1e…"})  # '5d41…'
        """
        key = self._claim_key(topic, share)
        claim = json.dumps({"instance_id": instance_id, "nonce": uuid.uuid4().hex}).encode()
        try:
            current = self.files.read(key, max_bytes=4096)
        except FileTooLargeError:
            return None  # no claim of anyone's, but not to be overwritten blindly: an operator looks
        if current is None:
            return self.files.create(key, claim)
        owner = claim_owner(current.data)
        if owner == instance_id:
            return current.version
        if owner in live:
            return None
        # ``live`` was surveyed before this claim was read: an instance announces itself before it claims, so
        # a claim written since the survey names an instance whose record is live now (two instances starting
        # together each saw only itself).
        # A claim's bytes are untrusted: a name no instance could have is not looked up as a record key.
        if owner is not None and 0 < len(owner) <= 256 and self.instances.is_live(self.group, owner):
            return None
        return self.files.replace(key, claim, current.version)

    def share_owner(self, topic: str, share: int) -> Optional[str]:
        """The instance ``share`` of ``topic``'s claim names, or ``None``.

        Example::

            group.share_owner("ORDER_TOPIC", 3)  # '9c1e…'
        """
        try:
            current = self.files.read(self._claim_key(topic, share), max_bytes=4096)
        except FileTooLargeError:
            return None
        return None if current is None else claim_owner(current.data)

    def release_share(self, topic: str, share: int, instance_id: str, claim_version: str) -> bool:
        """Give up ``instance_id``'s claim of ``share`` of ``topic``, the claim at ``claim_version`` (as
        :meth:`claim_share` returned it): replaced by a released claim, which names no instance, only if it is
        still at that version. A claim another instance wrote since is left alone (a delete cannot be made
        conditional on object storage: a read, then a delete, could remove a claim written in between). Whether
        the claim was released (``False``: it had changed or was gone).

        Example::

            version = group.claim_share("ORDER_TOPIC", 3, "9c1e…", live={"9c1e…"})
            group.release_share("ORDER_TOPIC", 3, "9c1e…", version)  # True
        """
        released = json.dumps({"released_by": instance_id, "nonce": uuid.uuid4().hex}).encode()
        return self.files.replace(self._claim_key(topic, share), released, claim_version) is not None

    def progress(self, topic: str, share: int) -> tuple[Optional[ShareProgress], Optional[str]]:
        """The progress of ``share`` of ``topic`` and its file's version (``(None, None)``: never saved);
        :class:`CorruptInputError` naming the file if it is not a progress record.

        Example::

            progress, version = group.progress("ORDER_TOPIC", 3)
            progress.version  # 42: every message of the share before version 42 is handled
        """
        key = self._progress_key(topic, share)
        try:
            found = self.files.read(key, max_bytes=_MAX_RECORD_BYTES)
        except FileTooLargeError as error:
            raise CorruptInputError(f"{key}: {error}") from None
        if found is None:
            return None, None
        try:
            return ShareProgress.parse(found.data), found.version
        except CorruptInputError as error:
            raise CorruptInputError(f"{key} is not a share's progress ({error}): the group stops here; an operator "
                                    f"moves it on with `txcoord consumer-groups reset {self.group} --topic "
                                    f"{topic} --to ...`, which writes every share's progress anew") from None

    def save_progress(self, topic: str, share: int, progress: ShareProgress, version: Optional[str],
                      writer: str) -> Optional[str]:
        """Write ``progress`` if the file is still at ``version`` (``None``: absent); its new version, or ``None``
        if another writer changed it meanwhile (the share is someone else's now).

        Example::

            version = group.save_progress("ORDER_TOPIC", 3, progress, version, "9c1e…")
        """
        key, data = self._progress_key(topic, share), progress.to_json(writer, self.clock())
        return self.files.create(key, data) if version is None else self.files.replace(key, data, version)

    def overwrite_progress(self, topic: str, share: int, progress: ShareProgress, writer: str) -> None:
        """Write ``progress`` whatever was there: an operator's reset, with every instance stopped.

        Example::

            group.overwrite_progress("ORDER_TOPIC", 3, ShareProgress(version=0), "alice@ops")
        """
        self.files.put(self._progress_key(topic, share), progress.to_json(writer, self.clock()))

    def start_version(self, topic: str, choose: Callable[[], int]) -> int:
        """Where the group started on ``topic``: recorded by its first instance to read the topic (``choose()``,
        made once), the same for every share and instance afterwards.

        Example::

            group.start_version("ORDER_TOPIC", lambda: 0)  # 0, or what the first instance chose
        """
        key = f"{self.directory}/progress/{topic}/_start.json"
        found = self.files.read(key, max_bytes=4096)
        if found is None:
            self.files.create(key, json.dumps({"version": choose(), "nonce": uuid.uuid4().hex}).encode())
            found = self.files.read(key, max_bytes=4096)
        try:
            version = json.loads(found.data)["version"]
            if not _is_int(version) or version < 0:
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):
            raise CorruptInputError(f"{key} is not where the group started: `txcoord consumer-groups reset` "
                                    "writes it anew") from None
        return version

    def set_start_version(self, topic: str, version: int) -> None:
        """Record ``version`` as where the group starts on ``topic`` (an operator's reset).

        Example::

            group.set_start_version("ORDER_TOPIC", 0)
        """
        self.files.put(f"{self.directory}/progress/{topic}/_start.json",
                       json.dumps({"version": version, "nonce": uuid.uuid4().hex}).encode())

    def _claim_key(self, topic: str, share: int) -> str:
        return f"{self.directory}/shares/{topic}/{share}.claim"

    def _progress_key(self, topic: str, share: int) -> str:
        return f"{self.directory}/progress/{topic}/{share}.json"

    def _current_grant_or_none(self) -> Optional[GroupGrant]:
        try:
            return self.grant()
        except CorruptInputError:
            return None

