"""Operating consumer groups (no JVM): granting a group its topics, describing where it is, moving it, and acting
on its dead letters. What ``txcoord add-consumer-group``, ``consumer-groups`` and ``dead-letters`` do.

Each action is recorded with who did it in the group's ``operator_actions`` table, which only operators write
(as ``txcoord resolve`` records its operator in the operators' own commit log): the storage, not a column,
says an operator did it. A redrive appends the dead letters' messages to the group's ``redrive`` table, which
the group's instances consume like a topic of their own, attempts counted afresh.

Example::

    add_consumer_group(config, "credits", ["ORDER_TOPIC"])
    describe_consumer_group(config, "credits").topics[0].lag_messages   # 0
    redrive_dead_letters(config, "credits", msg_ids=["9f2c…"])          # the dead letters redriven
"""

from __future__ import annotations

import datetime as dt
import getpass
import re
import socket
import uuid
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional, Sequence

import pyarrow as pa

from coordinator.config import CoordinatorConfig, parse_start_time
from coordinator.consumer.group import (DEFAULT_SHARES, MAX_SHARES, REDRIVE_SOURCE, ConsumerGroup, GroupGrant,
                                        ShareProgress, share_of)
from coordinator.consumer.topic_log import TopicLog
from coordinator.exceptions import ConsumerStateError, CorruptInputError, InvalidArgumentError, MessageValidationError
from coordinator.lakehouse import CONSUMERS_KEY, Lakehouse, create_table, group_of_key, read_table
from coordinator.names import NAME_MAX_LENGTH, validate_name
from coordinator.tables import CONSUMER_ACTIONS, REDRIVE

__all__ = ["GroupDescription", "TopicPosition", "add_consumer_group", "consumer_group_grants", "describe_consumer_group",
           "discard_dead_letters", "open_dead_letters", "operator_actions", "redrive_dead_letters", "reset_consumer_group"]

_PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]-]+")


def _operator(operator: Optional[str]) -> str:
    return operator or f"{getpass.getuser()}@{socket.gethostname()}"


def add_consumer_group(config: CoordinatorConfig, group: str, topics: Sequence[str], shares: Optional[int] = None,
                       operator: Optional[str] = None) -> GroupGrant:
    """Grant consumer group ``group`` the ``topics`` (names or shell-style patterns), each split into ``shares``
    (default: the group's current number, else :data:`DEFAULT_SHARES`); create its operators' table. Replaces
    the group's earlier grant; the shares cannot change once the group has progress.

    Example::

        add_consumer_group(config, "credits", ["ORDER_TOPIC", "AUDIT_*"]).shares  # 16
    """
    try:
        validate_name("consumer group", group)
    except MessageValidationError as error:
        raise InvalidArgumentError(str(error)) from None
    topics = list(topics)
    bad = [topic for topic in topics if not isinstance(topic, str) or len(topic) > NAME_MAX_LENGTH
           or not _PATTERN.fullmatch(topic)]
    if not topics or bad:
        raise InvalidArgumentError(f"give topic names or patterns (letters, digits, _ and -, with * ? [ ]), got "
                                   f"{', '.join(map(repr, bad or topics)) or 'none'}")
    lakehouse = Lakehouse.of(config)
    records = ConsumerGroup(lakehouse, group)
    current = records.grant() if records.files.exists(f"{records.directory}/_grant.json") else None
    shares = shares if shares is not None else (current.shares if current else DEFAULT_SHARES)
    if not 1 <= shares <= MAX_SHARES:
        raise InvalidArgumentError(f"shares must be 1 to {MAX_SHARES}, got {shares}")
    create_table(CONSUMER_ACTIONS, lakehouse.consumer_table(group, "operator_actions"), lakehouse.storage)
    return records.write_grant(topics, shares, _operator(operator))


def consumer_group_grants(lakehouse: Lakehouse) -> tuple[list[GroupGrant], list[str]]:
    """The grants of the consumer groups under ``consumers/``, by group, and why each grant that could not be
    read was refused (a directory without a grant is no group yet, and is passed over).

    Example::

        grants, refused = consumer_group_grants(Lakehouse.of(config))
        {grant.group: grant.topics for grant in grants}  # {'credits': ('ORDER_TOPIC',)}
    """
    grants, refused = [], []
    for name in sorted(group_of_key(key) for key in lakehouse.files.directories(CONSUMERS_KEY)):
        try:
            grant = ConsumerGroup(lakehouse, name).grant()
        except CorruptInputError as error:
            refused.append(str(error))
            continue
        if grant is not None:
            grants.append(grant)
    return grants, refused


@dataclass(frozen=True)
class TopicPosition:
    """Where a consumer group is in one topic: the oldest version it has not finished (``position``), the
    messages left to handle and how long the oldest has waited (seconds), how many are being retried, and
    ``shares``: each share's own position (its version)."""

    topic: str
    position: int
    latest_version: int
    lag_messages: int
    lag_seconds: float
    retrying: int
    shares: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupDescription:
    """What ``txcoord consumer-groups describe`` shows of a group."""

    group: str
    topics: list[TopicPosition]
    live_instances: list[str]
    open_dead_letters: int
    grant: Optional[GroupGrant]

    def to_dict(self) -> dict:
        """As JSON-ready values.

        Example::

            json.dumps(describe_consumer_group(config, "credits").to_dict())
        """
        return asdict(self)


def describe_consumer_group(config: CoordinatorConfig, group: str,
                            now: Optional[dt.datetime] = None) -> GroupDescription:
    """Where ``group`` is in each topic of its grant that has a table (and its redrive table), its live
    instances and its open dead letters. Reads every version the group has not finished: costs as much as
    its lag.

    Example::

        [(t.topic, t.position, t.lag_messages) for t in describe_consumer_group(config, "credits").topics]
    """
    lakehouse = Lakehouse.of(config)
    records = ConsumerGroup(lakehouse, group)
    grant = records.grant()
    now = now or dt.datetime.now(dt.timezone.utc)
    positions = []
    if grant is not None:
        for source in _sources(lakehouse, records, grant):
            positions.append(_position(lakehouse, records, grant, source, now))
    live = [record.instance_id for record in records.instances.live(group)]
    return GroupDescription(group, positions, live, len(open_dead_letters(config, group)), grant)


def _sources(lakehouse: Lakehouse, records: ConsumerGroup, grant: GroupGrant) -> list[str]:
    """What :func:`describe_consumer_group` reports on: each source with progress, and each granted topic with a
    table. ``topics/`` is listed only for a grant with patterns: the group's own account may list its topics alone."""
    found = set(lakehouse.files.directories(f"{records.directory}/progress"))
    named = [topic for topic in grant.topics if not any(c in topic for c in "*?[")]
    found |= {topic for topic in named if lakehouse.files.directories(f"topics/{topic}")}
    if len(named) < len(grant.topics):
        found |= {topic for topic in lakehouse.files.directories("topics") if grant.refusal(topic) is None}
    return sorted(found)


def _position(lakehouse: Lakehouse, records: ConsumerGroup, grant: GroupGrant, source: str,
              now: dt.datetime) -> TopicPosition:
    log = TopicLog(lakehouse.files, _source_table(lakehouse, records.group, source))
    latest = log.latest()
    start = None
    lag, retrying, oldest, shares = 0, 0, None, {}
    for number in range(grant.shares):
        progress, _ = records.progress(source, number)
        if progress is None:
            if start is None:
                start = _recorded_start(records, source, log)
            progress = ShareProgress(start)
        shares[number] = progress.version
        retrying += len(progress.retrying)
        for version in range(progress.version, latest + 1):
            done = set(progress.done.get(version, ()))
            for row in log.rows(version):
                if (share_of(row["keys"], row["msg_id"], grant.shares) == number and row["queue_offset"] >= progress.floor
                        and row["queue_offset"] not in done):
                    lag += 1
                    stamp = row["commit_timestamp"]
                    oldest = stamp if oldest is None or (stamp is not None and stamp < oldest) else oldest
    seconds = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    return TopicPosition(source, min(shares.values(), default=0), latest, lag, seconds, retrying, shares)


def _recorded_start(records: ConsumerGroup, source: str, log: TopicLog) -> int:
    found = records.files.read(f"{records.directory}/progress/{source}/_start.json", max_bytes=4096)
    return records.start_version(source, lambda: 0) if found is not None else log.earliest()


def _source_table(lakehouse: Lakehouse, group: str, source: str) -> str:
    return f"{lakehouse.consumer_dir(group)}/redrive" if source == REDRIVE_SOURCE else f"topics/{source}"


def reset_consumer_group(config: CoordinatorConfig, group: str, topic: str, to: str,
                         operator: Optional[str] = None) -> int:
    """Move ``group``'s position in ``topic`` to ``to``: ``earliest``, ``latest`` (past every message now), an ISO
    time with its zone (the first version committed then or after), or a queue offset (every message below it
    taken as handled); every share's retries dropped. Refused (:class:`ConsumerStateError`) while an instance of
    the group is live. Returns the version the group starts from.

    Example::

        reset_consumer_group(config, "credits", "ORDER_TOPIC", "2025-06-01T00:00:00+00:00")  # 17
    """
    lakehouse = Lakehouse.of(config)
    records = ConsumerGroup(lakehouse, group)
    grant = records.require_grant([topic])
    live = records.instances.live(group)
    if live:
        raise ConsumerStateError(f"consumer group {group!r} has {len(live)} live instance(s) "
                                 f"({', '.join(i.instance_id for i in live)}): stop them, then reset")
    log = TopicLog(lakehouse.files, f"topics/{topic}")
    floor = 0
    if to == "earliest":
        version = log.earliest()
    elif to == "latest":
        version = log.latest() + 1
    elif parse_start_time(to) is not None:
        version = log.first_at(int(parse_start_time(to).timestamp() * 1000))
    elif to.isdigit():
        floor = int(to)
        version = next((v for v in range(log.earliest(), log.latest() + 1)
                        if any(row["queue_offset"] >= floor for row in log.rows(v))), log.latest() + 1)
    else:
        raise InvalidArgumentError(f"--to is earliest, latest, an ISO time with its zone or a queue offset, got {to!r}")
    who = _operator(operator)
    for number in range(grant.shares):
        records.overwrite_progress(topic, number, ShareProgress(version, floor), who)
    records.set_start_version(topic, version)
    _record_actions(lakehouse, group, [{"action": "RESET", "topic": topic,
                                        "detail": f"--to {to}: version {version}, queue offsets from {floor}"}], who)
    return version


def open_dead_letters(config: CoordinatorConfig, group: str) -> list[dict]:
    """``group``'s dead letters no operator has redriven or discarded yet, oldest first, each a dict of
    ``consumers/<group>/dead_letters``'s columns.

    Example::

        [(d["msg_id"], d["attempts"], d["last_error"]) for d in open_dead_letters(config, "credits")]
    """
    lakehouse = Lakehouse.of(config)
    path = lakehouse.consumer_table(group, "dead_letters")
    if not lakehouse.exists(f"{lakehouse.consumer_dir(group)}/dead_letters"):
        return []
    dead = read_table(path, storage=lakehouse.storage).to_pylist(maps_as_pydicts="strict")
    closed = set(_actions(lakehouse, group).column("dead_letter_id").to_pylist())
    return sorted((d for d in dead if d["dead_letter_id"] not in closed), key=lambda d: (d["dead_at"], d["dead_letter_id"]))


def operator_actions(config: CoordinatorConfig, group: str, limit: int = 50) -> list[dict]:
    """The ``limit`` latest actions operators took on ``group`` (redrives, discards, resets), newest first, each a
    dict of ``consumers/<group>/operator_actions``'s columns: who did what, when, and why.

    Example::

        [(a["action"], a["operator"]) for a in operator_actions(config, "credits")]  # [('REDRIVE', 'alice@ops')]
    """
    lakehouse = Lakehouse.of(config)
    if not lakehouse.exists(f"{lakehouse.consumer_dir(group)}/operator_actions"):
        return []
    rows = read_table(lakehouse.consumer_table(group, "operator_actions"), storage=lakehouse.storage).to_pylist()
    return sorted(rows, key=lambda a: (a["acted_at"], a["action_id"]), reverse=True)[:limit]


def redrive_dead_letters(config: CoordinatorConfig, group: str, msg_ids: Optional[Iterable[str]] = None,
                         operator: Optional[str] = None, reason: str = "") -> list[dict]:
    """Deliver ``group``'s open dead letters of ``msg_ids`` (``None``: all) to its listener again, attempts counted
    afresh: their messages appended to the group's redrive table, then each closed by a ``REDRIVE`` action
    naming the operator. Returns the dead letters redriven.

    Example::

        redrive_dead_letters(config, "credits", ["9f2c…"])  # [{'dead_letter_id': 'ORDER_TOPIC.3.1', ...}]
    """
    chosen = _chosen(config, group, msg_ids)
    if not chosen:
        return []
    lakehouse = Lakehouse.of(config)
    path = lakehouse.consumer_table(group, "redrive")
    create_table(REDRIVE, path, lakehouse.storage)
    rows = [{name: d.get(name) for name in REDRIVE.column_names} | {"batch_id": None} for d in chosen]
    for row in rows:
        row["properties"] = None if row["properties"] is None else list(row["properties"].items())
    from coordinator.appender import DeltaAppender

    with DeltaAppender(path, storage=lakehouse.storage) as appender:
        appender.append(pa.Table.from_pylist(rows, schema=REDRIVE.arrow_schema()))
    _record_actions(lakehouse, group, [_closing("REDRIVE", d, reason) for d in chosen], _operator(operator))
    return chosen


def discard_dead_letters(config: CoordinatorConfig, group: str, msg_ids: Optional[Iterable[str]] = None,
                         operator: Optional[str] = None, reason: str = "") -> list[dict]:
    """Close ``group``'s open dead letters of ``msg_ids`` (``None``: all) for good, by a ``DISCARD`` action naming
    the operator. Returns the dead letters discarded.

    Example::

        discard_dead_letters(config, "credits", ["9f2c…"], reason="refunded by hand")
    """
    chosen = _chosen(config, group, msg_ids)
    if chosen:
        _record_actions(Lakehouse.of(config), group, [_closing("DISCARD", d, reason) for d in chosen],
                        _operator(operator))
    return chosen


def _chosen(config: CoordinatorConfig, group: str, msg_ids: Optional[Iterable[str]]) -> list[dict]:
    found = open_dead_letters(config, group)
    if msg_ids is None:
        return found
    wanted = set(msg_ids)
    missing = wanted - {d["msg_id"] for d in found}
    if missing:
        raise InvalidArgumentError(f"consumer group {group!r} has no open dead letter of message(s) "
                                   f"{', '.join(sorted(missing))}")
    return [d for d in found if d["msg_id"] in wanted]


def _closing(action: str, dead: dict, reason: str) -> dict:
    return {"action": action, "dead_letter_id": dead["dead_letter_id"], "msg_id": dead["msg_id"],
            "topic": dead["topic"], "detail": reason or None}


def _actions(lakehouse: Lakehouse, group: str) -> pa.Table:
    """The operators' actions on ``group`` (none while their table is absent: a read creates nothing, so that a
    viewer's account, which may not write it, reads the dead letters too)."""
    if not lakehouse.exists(f"{lakehouse.consumer_dir(group)}/operator_actions"):
        return CONSUMER_ACTIONS.arrow_schema().empty_table().select(["dead_letter_id", "action"])
    return read_table(lakehouse.consumer_table(group, "operator_actions"), ["dead_letter_id", "action"],
                      storage=lakehouse.storage)


def _record_actions(lakehouse: Lakehouse, group: str, actions: list[dict], operator: str) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    rows = [{name: action.get(name) for name in CONSUMER_ACTIONS.column_names}
            | {"action_id": uuid.uuid4().hex, "operator": operator, "acted_at": now} for action in actions]
    path = lakehouse.consumer_table(group, "operator_actions")
    create_table(CONSUMER_ACTIONS, path, lakehouse.storage)
    from coordinator.appender import DeltaAppender

    with DeltaAppender(path, storage=lakehouse.storage) as appender:
        appender.append(pa.Table.from_pylist(rows, schema=CONSUMER_ACTIONS.arrow_schema()))
