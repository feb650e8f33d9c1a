"""A consumer group's records in its own prefix, ``consumers/<group>/``, with the conditional writes that keep
each one single-writer (:mod:`coordinator.storage`).

* ``_grant.json``: the topics the group may read and how many shares each topic is split into, written by
  operators only (``txcoord add-consumer-group``); the storage lets the group read it, never write it;
* ``_instances/<instance>.json``: each live instance's record (:mod:`coordinator.consumer.instances`);
* ``shares/<topic>/<share>.claim``: which instance handles a share now, taken by a conditional create, or a
  conditional replace of a claim naming an instance that is not live or released by its instance
  (:meth:`ConsumerGroup.claim_share`); given up by a conditional replace with a released claim
  (:meth:`ConsumerGroup.release_share`), so that a release never removes a claim written since;
* ``progress/<topic>/<share>.json``: the share's position and retry state (:class:`ShareProgress`), replaced
  only if unchanged since its holder read or wrote it, so an instance that lost its share cannot write over
  its successor's; ``progress/<topic>/_start.json``: where the group started on the topic (and how many
  messages the topic held before it), fixed once;
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

from coordinator.consumer.instances import ConsumerInstances
from coordinator.control.instances import claim_owner, json_object
from coordinator.exceptions import AccessDeniedError, CorruptInputError, FileTooLargeError
from coordinator.lakehouse import Lakehouse
from coordinator.lakehouse.slots import key_hash

__all__ = ["DEFAULT_SHARES", "GRANT_FILE", "MAX_ERROR_CHARS", "MAX_SHARES", "REDRIVE_SOURCE",
           "ConsumerGroup", "GroupGrant", "ShareProgress", "dead_letter_id", "share_of", "share_owners"]

#: Shares a topic is split into when ``txcoord add-consumer-group`` is not told: the most instances of a group
#: that can share one topic's work.
DEFAULT_SHARES = 16
MAX_SHARES = 1024
GRANT_FILE = "_grant.json"
#: The name under ``progress/`` and ``shares/`` of the group's redrive table, consumed like a topic of its own
#: (``~`` is in no topic's name).
REDRIVE_SOURCE = "~redrive"


def share_of(keys: Optional[str], msg_id: str, shares: int) -> int:
    """The share of a message: a stable hash of its ``keys``, or of its ``msg_id`` when it has none, so that
    the messages of one key are always in one share (and handled in order by one instance).

    Example::

        share_of("order-42", "9f2c…", 16)  # 11, on every host and every run
    """
    return key_hash(keys, msg_id) % shares


def share_owners(group: str, topic: str, shares: int, live: Iterable[str]) -> list[Optional[str]]:
    """Which of the ``live`` instances should hold each of the ``shares`` of ``topic``: rendezvous hashing with
    bounded loads. Shares in order, each goes to the instance its hash ranks first among those with room, where
    each has room for ``shares // len(live)`` and ``shares % len(live)`` of them for one more: every instance
    computes the same answer from the same live set, and each holds its part, give or take one (plain rendezvous
    hashing spread them by chance, and the group went at the pace of the busiest: docs/performance-log.md#consumers).
    ``None`` each when none is live.

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
    """A share's progress in one source (a topic, or the group's redrive table), as its record says.

    The share's messages are read in the topic's order; ``(version, offset)`` is where the next read begins: every
    message of the share before it was read, and is handled unless it is listed in ``unhandled`` (version ->
    queue offsets: read and not handled yet, at most ``consumer_max_buffered`` of them). So the record lists what
    is still to do, never what is done, and stays as small as that however far the share moves past a message
    that keeps failing. ``retrying`` holds, by ``(version, queue offset)``, each unhandled message that failed:
    ``attempts`` made, ``due_ms`` (epoch milliseconds) of the next, the ``error`` of the last (at most
    :data:`MAX_ERROR_CHARS`), and ``dead`` once it used up its attempts (its dead letter being written).
    Messages with a queue offset below ``floor`` count as handled (a reset to an offset). ``epoch`` counts the
    operators' resets of the source: part of each dead letter's identity (:func:`dead_letter_id`).
    ``topic_rows_before``: how many messages (of every share) the source holds in versions before ``version``,
    when known: what the lag is counted from. ``batch``: the checker batch of the last version read. While
    ``snapshot`` is set, version ``snapshot`` means the topic's snapshot at that version, read from checker batch
    ``snapshot_from_batch`` on (``consumer_position_gone``: :mod:`coordinator.consumer.share`). ``gone``: the
    last time a version the share needed was gone: ``at_ms``, the ``version`` needed, the ``policy`` followed and its
    ``outcome`` (what ``describe`` shows).

    Records written before this form (``format`` 1: a watermark, and the offsets handled past it) are read as
    ``version`` = the watermark with those offsets in ``skip``, and their retries keyed by offset alone
    (version -1); written back in this form.
    """

    version: int
    offset: int = 0
    floor: int = 0
    unhandled: dict[int, list[int]] = field(default_factory=dict)
    retrying: dict[tuple[int, int], dict] = field(default_factory=dict)
    epoch: int = 0
    topic_rows_before: Optional[int] = None
    skip: dict[int, list[int]] = field(default_factory=dict)
    snapshot: Optional[int] = None
    snapshot_from_batch: Optional[int] = None
    batch: Optional[int] = None
    gone: Optional[dict] = None

    @property
    def position(self) -> int:
        """The oldest version with a message of the share not handled (or not read) yet."""
        return min(self.unhandled, default=self.version)

    def to_json(self, writer: str, now: float) -> bytes:
        """The record's bytes, naming its writer and time (which makes every write's content unique)."""
        record = {"format": PROGRESS_FORMAT, "version": self.version, "offset": self.offset, "floor": self.floor,
                  "epoch": self.epoch, "topic_rows_before": self.topic_rows_before, "batch": self.batch,
                  "snapshot": self.snapshot, "snapshot_from_batch": self.snapshot_from_batch, "gone": self.gone,
                  "unhandled": {str(version): offsets for version, offsets in sorted(self.unhandled.items()) if offsets},
                  "retrying": [{"version": version, "offset": offset, **retry}
                               for (version, offset), retry in sorted(self.retrying.items())],
                  "written_by": writer, "written_at": now, "nonce": uuid.uuid4().hex}
        if self.skip:
            record["skip"] = {str(version): offsets for version, offsets in self.skip.items()}
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> "ShareProgress":
        """The record in ``data``, held to its shape: :class:`CorruptInputError` saying what is wrong.

        Example::

            ShareProgress.parse(b'{"format": 2, "version": 3, ...}').version  # 3
        """
        raw = json_object(data)
        if raw.get("format", 1) == 1:
            return cls._parse_first_format(raw)
        if raw.get("format") != PROGRESS_FORMAT:
            raise CorruptInputError(f"format {raw.get('format')!r} is not one this version reads ({PROGRESS_FORMAT})"[:300])
        _require_counts(raw, ("version", "offset", "floor", "epoch"))
        for name in ("topic_rows_before", "batch", "snapshot", "snapshot_from_batch"):
            if raw.get(name) is not None and not (_is_int(raw[name]) and raw[name] >= 0):
                raise CorruptInputError(f"{name} is not a whole number of the right sign: {raw[name]!r}"[:300])
        gone = raw.get("gone")
        if gone is not None and not (isinstance(gone, dict) and _is_int(gone.get("at_ms")) and _is_int(gone.get("version"))
                                     and isinstance(gone.get("policy"), str) and isinstance(gone.get("outcome"), str)):
            raise CorruptInputError("gone is not {at_ms, version, policy, outcome}")
        unhandled, retrying = _offsets_by_version(raw.get("unhandled"), "unhandled"), raw.get("retrying")
        if not isinstance(retrying, list) or not all(
                isinstance(retry, dict) and _is_int(retry.get("version")) and _is_int(retry.get("offset"))
                and _is_retry(retry) for retry in retrying):
            raise CorruptInputError("retrying is not a list of {version, offset, attempts, due_ms, error, dead}")
        return cls(raw["version"], raw["offset"], raw["floor"], unhandled,
                   {(retry["version"], retry["offset"]): _retry_state(retry) for retry in retrying}, raw["epoch"],
                   raw.get("topic_rows_before"), _offsets_by_version(raw.get("skip", {}), "skip"), raw.get("snapshot"),
                   raw.get("snapshot_from_batch"), raw.get("batch"),
                   None if gone is None else {name: gone[name] for name in ("at_ms", "version", "policy", "outcome")})

    @classmethod
    def _parse_first_format(cls, raw: dict) -> "ShareProgress":
        _require_counts(raw, ("version", "floor"))
        retrying = raw.get("retrying")
        if not isinstance(retrying, dict) or not all(_is_digits(offset) and _is_retry(retry)
                                                     for offset, retry in retrying.items()):
            raise CorruptInputError("retrying is not a map of queue offsets to {attempts, due_ms, error, dead}")
        return cls(raw["version"], 0, raw["floor"],
                   retrying={(-1, int(offset)): _retry_state(retry) for offset, retry in retrying.items()},
                   skip=_offsets_by_version(raw.get("done"), "done"))


#: The form of the progress records this version writes (:class:`ShareProgress`).
PROGRESS_FORMAT = 2
#: A failed message's error is kept to this many characters in its share's record.
MAX_ERROR_CHARS = 500
#: The largest progress record the group reads: what MAX_CONSUMER_BUFFERED messages, each failed with an error of
#: MAX_ERROR_CHARS, take at most, so a record the group wrote is never refused by the group.
MAX_PROGRESS_BYTES = 64 * 1024 * 1024


def _require_counts(raw: dict, names: tuple[str, ...]) -> None:
    for name in names:
        if not _is_int(raw.get(name)) or raw[name] < (-1 if name == "version" else 0):
            raise CorruptInputError(f"{name} is not a whole number of the right sign: {raw.get(name)!r}"[:300])


def _offsets_by_version(value: object, name: str) -> dict[int, list[int]]:
    if not isinstance(value, dict) or not all(
            _is_digits(version) and isinstance(offsets, list) and all(map(_is_int, offsets))
            for version, offsets in value.items()):
        raise CorruptInputError(f"{name} is not a map of versions to lists of queue offsets")
    return {int(version): list(offsets) for version, offsets in value.items()}


def _retry_state(retry: dict) -> dict:
    return {"attempts": retry["attempts"], "due_ms": retry["due_ms"], "error": retry["error"],
            "dead": retry.get("dead", False)}


def dead_letter_id(source: str, version: int, queue_offset: int, msg_id: str, epoch: int) -> str:
    """The identity of the dead letter a message becomes: where it was read (``source``, its ``version`` there
    and its queue offset), its id, and the source's ``epoch`` (resets so far). Written once whoever writes it
    (a crash before its share's save, the share's next holder), and never the same for two deliveries: a reset
    that delivers the message again starts a new epoch, and a redrive delivers it from another source version.

    Example::

        dead_letter_id("ORDER_TOPIC", 12, 977, "9f2c", 0)  # 'ORDER_TOPIC.12.977.9f2c.0'
    """
    return f"{source}.{version}.{queue_offset}.{msg_id}.{epoch}"


def _start_record(version: int, epoch: int, rows_before: Optional[int]) -> bytes:
    return json.dumps({"version": version, "epoch": epoch, "topic_rows_before": rows_before,
                       "nonce": uuid.uuid4().hex}).encode()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_digits(text: object) -> bool:
    return isinstance(text, str) and text.isdigit() and len(text) < 20


def _is_retry(retry: object) -> bool:
    return (isinstance(retry, dict) and _is_int(retry.get("attempts")) and retry["attempts"] >= 0
            and _is_int(retry.get("due_ms")) and isinstance(retry.get("error"), (str, type(None)))
            and isinstance(retry.get("dead", False), bool))


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

    def claim_share(self, topic: str, share: int, instance_id: str, live: set[str],
                    decide_within_s: float = float("inf")) -> Optional[str]:
        """Take ``share`` of ``topic`` for ``instance_id``: created if no claim is there, kept if it names this
        instance, replaced (conditionally) if it names one neither in ``live`` nor live by its record read after
        the claim, or is no claim (a released one: :meth:`release_share`); the claim's version, or ``None`` when
        another live instance holds it or won the race. A claim naming another instance is replaced only within
        ``decide_within_s`` of reading that instance's record: an instance back from a pause renews its record,
        waits that long, and then reads its claims back (:mod:`coordinator.consumer.membership`), so a replace
        decided on its record as it was before cannot land after it looked.

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
        decided = self.clock()
        if owner is not None and 0 < len(owner) <= 256 and self.instances.is_live(self.group, owner):
            return None
        if self.clock() - decided > decide_within_s:
            return None  # decided on a record read too long ago: looked at again next time
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

    def holds(self, topic: str, share: int, instance_id: str, claim_version: Optional[str]) -> bool:
        """Whether ``instance_id``'s claim of ``share`` of ``topic`` is still the one at ``claim_version``: no
        other instance replaced it since (a claim's every write has a new version).

        Example::

            group.holds("ORDER_TOPIC", 3, "9c1e…", version)  # True
        """
        try:
            current = self.files.read(self._claim_key(topic, share), max_bytes=4096)
        except FileTooLargeError:
            return False
        return (current is not None and current.version == claim_version
                and claim_owner(current.data) == instance_id)

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
            found = self.files.read(key, max_bytes=MAX_PROGRESS_BYTES)
            if found is None:
                return None, None
            return ShareProgress.parse(found.data), found.version
        except (CorruptInputError, FileTooLargeError) as error:
            raise CorruptInputError(f"{key} is not a share's progress ({error}): the share stops here, the rest of "
                                    f"the group goes on; an operator stops the group's instances and moves the "
                                    f"topic on with `txcoord consumer-groups reset {self.group} --topic {topic} "
                                    f"--to ...`, which writes every share's progress anew") from None

    def save_progress(self, topic: str, share: int, progress: ShareProgress, version: Optional[str],
                      writer: str) -> Optional[str]:
        """Write ``progress`` if the file is still at ``version`` (``None``: absent); its new version, or ``None``
        if another writer changed it meanwhile (the share is someone else's now).

        Example::

            version = group.save_progress("ORDER_TOPIC", 3, progress, version, "9c1e…")
        """
        key, data = self._progress_key(topic, share), progress.to_json(writer, self.clock())
        return self.files.create(key, data) if version is None else self.files.replace(key, data, version)

    def start(self, topic: str, choose: Callable[[], int],
              rows_before: Optional[Callable[[int], Optional[int]]] = None) -> ShareProgress:
        """The progress a share of ``topic`` with no record starts from: where the group started on the topic
        (recorded by its first instance to read it, ``choose()`` made once, the same for every share and
        instance afterwards), in the topic's current epoch (:meth:`reset_start`). ``rows_before(version)``: how
        many messages the topic holds before the version chosen, recorded with it as every share's
        ``topic_rows_before`` (what the group's lag is counted from; ``None``: not known).

        Example::

            group.start("ORDER_TOPIC", lambda: 0).version  # 0, or what the first instance chose
        """
        recorded = self.recorded_start(topic)
        if recorded is None:
            version = choose()
            rows = rows_before(version) if rows_before is not None else None
            self.files.create(self._start_key(topic), _start_record(version, 0, rows))
            recorded = self.recorded_start(topic)
        return recorded

    def recorded_start(self, topic: str) -> Optional[ShareProgress]:
        """Where the group started on ``topic`` (:meth:`start`), as recorded; ``None`` before its first instance
        chose.

        Example::

            group.recorded_start("ORDER_TOPIC")  # ShareProgress(version=0, epoch=0, topic_rows_before=0, ...)
        """
        key = self._start_key(topic)
        found = self.files.read(key, max_bytes=4096)
        if found is None:
            return None
        try:
            raw = json.loads(found.data)
            version, epoch, rows_before = raw["version"], raw.get("epoch", 0), raw.get("topic_rows_before")
            if not (_is_int(version) and version >= 0 and _is_int(epoch) and epoch >= 0
                    and (rows_before is None or _is_int(rows_before) and rows_before >= 0)):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise CorruptInputError(f"{key} is not where the group started: `txcoord consumer-groups reset` "
                                    "writes it anew") from None
        return ShareProgress(version, epoch=epoch, topic_rows_before=rows_before)

    def reset_start(self, topic: str, version: int, floor: int, writer: str,
                    topic_rows_before: Optional[int] = None) -> ShareProgress:
        """An operator's reset, with every instance stopped: every share of ``topic`` starts again at ``version``
        (messages below queue offset ``floor`` taken as handled), in a new epoch, so that a message delivered
        again and dead again is a new dead letter. ``topic_rows_before``: how many messages the topic holds before
        ``version``, if known. Returns the progress every share was given.

        Example::

            group.reset_start("ORDER_TOPIC", 0, 0, "alice@ops").epoch  # 1 after the first reset
        """
        try:
            epoch = self.start(topic, lambda: version).epoch + 1
        except CorruptInputError:
            epoch = 1 + max((progress.epoch for progress in self._readable_progress(topic)), default=0)
        start = ShareProgress(version, floor=floor, epoch=epoch, topic_rows_before=topic_rows_before)
        self.files.put(self._start_key(topic), _start_record(version, epoch, topic_rows_before))
        for number in range(self.grant().shares):
            self.files.put(self._progress_key(topic, number), start.to_json(writer, self.clock()))
        return start

    def _readable_progress(self, topic: str) -> list[ShareProgress]:
        found = []
        for number in range(self.grant().shares):
            try:
                progress, _ = self.progress(topic, number)
            except CorruptInputError:
                continue
            if progress is not None:
                found.append(progress)
        return found

    def _start_key(self, topic: str) -> str:
        return f"{self.directory}/progress/{topic}/_start.json"

    def _claim_key(self, topic: str, share: int) -> str:
        return f"{self.directory}/shares/{topic}/{share}.claim"

    def _progress_key(self, topic: str, share: int) -> str:
        return f"{self.directory}/progress/{topic}/{share}.json"

    def _current_grant_or_none(self) -> Optional[GroupGrant]:
        try:
            return self.grant()
        except CorruptInputError:
            return None

