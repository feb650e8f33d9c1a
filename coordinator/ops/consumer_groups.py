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
                                        ShareProgress)
from coordinator.consumer.topic_log import TopicLog
from coordinator.exceptions import (ConsumerStateError, CorruptInputError, InvalidArgumentError, MessageValidationError,
                                    PositionGoneError)
from coordinator.lakehouse import CONSUMERS_KEY, Lakehouse, create_table, group_of_key, open_table, read_table
from coordinator.lakehouse.row_counts import RowCounts
from coordinator.names import NAME_MAX_LENGTH, validate_name
from coordinator.storage import read_all
from coordinator.tables import CONSUMER_ACTIONS, REDRIVE

__all__ = ["GroupDescription", "TopicPosition", "add_consumer_group", "consumer_group_grants", "describe_consumer_group",
           "discard_dead_letters", "open_dead_letters", "operator_actions", "redrive_dead_letters", "reset_consumer_group"]

_PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]-]+")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


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
    messages left to handle (from the log's statistics, as near as :func:`_position` says) and how long the
    oldest has waited (seconds), how many are being retried, and ``shares``: each share's own position (its
    version)."""

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


def describe_consumer_group(config: CoordinatorConfig, group: str, now: Optional[dt.datetime] = None,
                            row_counts: Optional[dict[str, RowCounts]] = None) -> GroupDescription:
    """Where ``group`` is in each topic of its grant that has a table (and its redrive table), its live
    instances and its open dead letters. Reads no message: each topic's lag comes from the group's progress
    records and the topic log's statistics (:func:`_position`), a few requests whatever the lag. ``row_counts``:
    each source's :class:`RowCounts` by table, kept by a caller that describes again (the checker's metrics), so
    that each call reads only what was committed since the last.

    Example::

        [(t.topic, t.position, t.lag_messages) for t in describe_consumer_group(config, "credits").topics]
    """
    lakehouse = Lakehouse.of(config)
    records = ConsumerGroup(lakehouse, group)
    grant = records.grant()
    now = now or dt.datetime.now(dt.timezone.utc)
    row_counts = {} if row_counts is None else row_counts
    positions = []
    if grant is not None:
        with_progress = set(lakehouse.files.directories(f"{records.directory}/progress"))
        for source in _sources(lakehouse, grant, with_progress):
            table = _source_table(lakehouse, group, source)
            counts = row_counts.setdefault(table, RowCounts(lakehouse.files, table))
            latest = counts.latest()
            if source in with_progress or latest >= 0:
                positions.append(_position(records, grant, source, now, counts, latest))
    live = [record.instance_id for record in records.instances.live(group)]
    return GroupDescription(group, positions, live, len(open_dead_letters(config, group)), grant)


def _sources(lakehouse: Lakehouse, grant: GroupGrant, with_progress: set[str]) -> list[str]:
    """What :func:`describe_consumer_group` may report on: each source with progress, each topic the grant names
    (reported if it has a table: its log is listed anyway, where a listing of its directory would go through
    every data file), and each topic under ``topics/`` its patterns match (listed only for a grant with patterns:
    the group's own account may list its topics alone)."""
    named = [topic for topic in grant.topics if not any(c in topic for c in "*?[")]
    found = with_progress | set(named)
    if len(named) < len(grant.topics):
        found |= {topic for topic in lakehouse.files.directories("topics") if grant.refusal(topic) is None}
    return sorted(found)


def _position(records: ConsumerGroup, grant: GroupGrant, source: str, now: dt.datetime, counts: RowCounts,
              latest: int) -> TopicPosition:
    """Where the group is in ``source``, from its shares' progress records and the source log's statistics.

    A share's messages not handled yet are those its record lists as read and not handled in versions before the
    one it is in, and its part of the messages of the versions from that one on: the source's rows up to its
    newest version (:class:`RowCounts`: its newest checkpoint's ``numRecords`` and those of the commits since)
    less the rows before the share's version (the record's ``topic_rows_before``, else counted from the log), over
    the number of shares (``latest``: the source's newest version). Exact when every share is at the start of one version; otherwise as near as the keys'
    hash spreads those versions' messages evenly. Over by the messages a share read of the version it stopped
    inside (its buffer was full) and by those below a reset's queue offset; a share reading a snapshot after its
    position was gone counts only the versions from the snapshot's on."""
    if latest < 0:  # no table (a redrive table before the first redrive): nothing to read, nothing read yet
        return TopicPosition(source, 0, latest, 0, 0.0, 0, dict.fromkeys(range(grant.shares), 0))
    found = read_all(lambda number: records.progress(source, number)[0], list(range(grant.shares)),
                     remote=records.files.remote)
    if None in found:
        start = _recorded_start(records, source, counts)
        found = [start if progress is None else progress for progress in found]
    known = {progress.version - 1: progress.topic_rows_before for progress in found
             if progress.topic_rows_before is not None}
    total = counts.through(latest, known)
    unread, listed, oldest = 0, 0, None
    for progress in found:
        behind = 0
        if progress.version <= latest:
            before = progress.topic_rows_before
            behind = max(0, total - (counts.through(progress.version - 1, known) if before is None else before))
        unread += behind
        # Offsets listed in the version the share is in are among that version's rows, counted above.
        before_position = sum(len(offsets) for version, offsets in progress.unhandled.items()
                              if version < progress.version)
        listed += before_position
        if behind or before_position:
            oldest = progress.position if oldest is None else min(oldest, progress.position)
    lag = -(-unread // grant.shares) + listed  # a share's part of a version rounded up: never 0 while one is left
    seconds = 0.0 if oldest is None else _waited(counts, oldest, now)
    positions = {number: progress.position for number, progress in enumerate(found)}
    return TopicPosition(source, min(positions.values(), default=0), latest, lag, seconds,
                         sum(len(progress.retrying) for progress in found), positions)


def _waited(counts: RowCounts, version: int, now: dt.datetime) -> float:
    """How long the oldest message of ``version`` (or, if the log no longer holds it, of the oldest version it
    holds) has waited since its commit, in seconds, to the millisecond (as the log's statistics keep it)."""
    oldest = counts.oldest_ms(version)
    if oldest is None:
        oldest = counts.oldest_ms(counts.earliest())
    if oldest is None:
        return 0.0
    return max(0, (now - _EPOCH) // dt.timedelta(milliseconds=1) - oldest) / 1000


def _recorded_start(records: ConsumerGroup, source: str, counts: RowCounts) -> ShareProgress:
    """Where a share with no record starts: where the group started on ``source``, else the oldest version its
    log holds (as a consumer starting at ``earliest`` would)."""
    recorded = records.recorded_start(source)
    if recorded is not None:
        return recorded
    earliest = counts.earliest()
    return ShareProgress(earliest, topic_rows_before=0 if earliest == 0 else None)


def _source_table(lakehouse: Lakehouse, group: str, source: str) -> str:
    return f"{lakehouse.consumer_dir(group)}/redrive" if source == REDRIVE_SOURCE else f"topics/{source}"


def reset_consumer_group(config: CoordinatorConfig, group: str, topic: str, to: str,
                         operator: Optional[str] = None) -> int:
    """Move ``group``'s position in ``topic`` to ``to``: ``earliest``, ``latest`` (past every message now), an ISO
    time with its zone (the first version committed then or after), or a queue offset (every message below it
    taken as handled); every share's retries dropped. The topic starts a new epoch: a message delivered again and
    dead again is a new dead letter, whatever became of the earlier one. Dead letters are untouched. Refused
    (:class:`ConsumerStateError`) while an instance of the group is live. Returns the version the group starts
    from.

    Example::

        reset_consumer_group(config, "credits", "ORDER_TOPIC", "2025-06-01T00:00:00+00:00")  # 17
    """
    lakehouse = Lakehouse.of(config)
    records = ConsumerGroup(lakehouse, group)
    records.require_grant([topic])
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
    epoch = records.reset_start(topic, version, floor, who, _rows_before(lakehouse, topic, version)).epoch
    _record_actions(lakehouse, group, [{"action": "RESET", "topic": topic,
                                        "detail": f"--to {to}: version {version}, queue offsets from {floor}, "
                                                  f"epoch {epoch}"}], who)
    return version


def _rows_before(lakehouse: Lakehouse, topic: str, version: int) -> Optional[int]:
    """How many messages ``topic`` holds before ``version``, from its log's statistics, for a reset's records (what
    the group's lag is counted from); ``None`` if its log no longer holds what it takes to count them."""
    try:
        return RowCounts(lakehouse.files, f"topics/{topic}").before(version)
    except PositionGoneError:
        return None


def open_dead_letters(config: CoordinatorConfig, group: str) -> list[dict]:
    """``group``'s dead letters no operator has redriven or discarded yet, oldest first, each a dict of
    ``consumers/<group>/dead_letters``'s columns.

    Example::

        [(d["msg_id"], d["attempts"], d["last_error"]) for d in open_dead_letters(config, "credits")]
    """
    lakehouse = Lakehouse.of(config)
    dead = _dead_letters(lakehouse, group)
    closed = set(_actions(lakehouse, group).column("dead_letter_id").to_pylist())
    return sorted((d for d in dead if d["dead_letter_id"] not in closed), key=lambda d: (d["dead_at"], d["dead_letter_id"]))


def _dead_letters(lakehouse: Lakehouse, group: str) -> list[dict]:
    if not lakehouse.exists(f"{lakehouse.consumer_dir(group)}/dead_letters"):
        return []
    return read_table(lakehouse.consumer_table(group, "dead_letters"),
                      storage=lakehouse.storage).to_pylist(maps_as_pydicts="strict")


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
    afresh. Returns the dead letters redriven.

    Each is closed first by a ``REDRIVE`` action naming the operator, committed with an application transaction
    named after the dead letter (``txcoord-close.<id>``), so that of two operators acting at once, or a redrive
    and a discard, the first commit closes it and the other closes nothing of it (and redrives only the rest).
    Its message is then appended to the group's redrive table (once, however many of its dead letters are
    redriven together), recorded by an application transaction of its own (``txcoord-redrive.<id>``): a redrive interrupted between the two is completed by the next redrive or
    discard of the group's dead letters, and none is appended twice.

    Example::

        redrive_dead_letters(config, "credits", ["9f2c…"])  # [{'dead_letter_id': 'ORDER_TOPIC.3.977.9f2c.0', ...}]
    """
    lakehouse = Lakehouse.of(config)
    closed = _close(config, lakehouse, group, "REDRIVE", msg_ids, operator, reason)
    _complete_redrives(lakehouse, group)
    return closed


def discard_dead_letters(config: CoordinatorConfig, group: str, msg_ids: Optional[Iterable[str]] = None,
                         operator: Optional[str] = None, reason: str = "") -> list[dict]:
    """Close ``group``'s open dead letters of ``msg_ids`` (``None``: all) for good, by a ``DISCARD`` action naming
    the operator (once each, as :func:`redrive_dead_letters` closes them). Returns the dead letters discarded.

    Example::

        discard_dead_letters(config, "credits", ["9f2c…"], reason="refunded by hand")
    """
    lakehouse = Lakehouse.of(config)
    _complete_redrives(lakehouse, group)
    return _close(config, lakehouse, group, "DISCARD", msg_ids, operator, reason)


def _close(config: CoordinatorConfig, lakehouse: Lakehouse, group: str, action: str,
           msg_ids: Optional[Iterable[str]], operator: Optional[str], reason: str) -> list[dict]:
    """Close the chosen open dead letters by ``action``, each once: a commit refused because another operator
    closed one of them first is made again for the rest, until none is left."""
    wanted = None if msg_ids is None else set(msg_ids)
    chosen = _chosen(config, group, wanted)
    closed: list[dict] = []
    while chosen:
        if _record_actions(lakehouse, group, [_closing(action, d, reason) for d in chosen], _operator(operator),
                           [(f"txcoord-close.{d['dead_letter_id']}", 0) for d in chosen]) is not None:
            closed += chosen
            break
        still_open = {d["dead_letter_id"] for d in open_dead_letters(config, group)}
        chosen = [d for d in chosen if d["dead_letter_id"] in still_open]
    return closed


def _complete_redrives(lakehouse: Lakehouse, group: str) -> None:
    """Append to the redrive table the message of each dead letter a ``REDRIVE`` action closed and the table does
    not record yet (an operator's redrive interrupted between its two commits)."""
    actions = _actions(lakehouse, group)
    redriven = {identity for identity, action in zip(actions.column("dead_letter_id").to_pylist(),
                                                     actions.column("action").to_pylist()) if action == "REDRIVE"}
    if not redriven:
        return
    path = lakehouse.consumer_table(group, "redrive")
    create_table(REDRIVE, path, lakehouse.storage)
    table = open_table(path, storage=lakehouse.storage)
    missing = [d for d in _dead_letters(lakehouse, group) if d["dead_letter_id"] in redriven
               and table.transaction_version(f"txcoord-redrive.{d['dead_letter_id']}") is None]
    if not missing:
        return
    # A message dead twice (delivered again by a reset) is delivered once more, not once for each of its dead
    # letters: in one version of the redrive table each queue offset is one message, as in a topic's.
    once = {(d["topic"], d["queue_offset"]): d for d in missing}.values()
    rows = [{name: d.get(name) for name in REDRIVE.column_names} | {"batch_id": None} for d in once]
    for row in rows:
        row["properties"] = None if row["properties"] is None else list(row["properties"].items())
    from coordinator.appender import DeltaAppender

    with DeltaAppender(path, storage=lakehouse.storage) as appender:
        appender.append(pa.Table.from_pylist(rows, schema=REDRIVE.arrow_schema()),
                        app_transactions=[(f"txcoord-redrive.{d['dead_letter_id']}", 0) for d in missing])


def _chosen(config: CoordinatorConfig, group: str, wanted: Optional[set[str]]) -> list[dict]:
    found = open_dead_letters(config, group)
    if wanted is None:
        return found
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


def _record_actions(lakehouse: Lakehouse, group: str, actions: list[dict], operator: str,
                    app_transactions: Sequence[tuple[str, int]] = ()) -> Optional[int]:
    """Append ``actions`` by ``operator`` to the group's operators' table, in one commit recording
    ``app_transactions``; its version, or ``None`` if one of them was recorded already (nothing written)."""
    now = dt.datetime.now(dt.timezone.utc)
    rows = [{name: action.get(name) for name in CONSUMER_ACTIONS.column_names}
            | {"action_id": uuid.uuid4().hex, "operator": operator, "acted_at": now} for action in actions]
    path = lakehouse.consumer_table(group, "operator_actions")
    create_table(CONSUMER_ACTIONS, path, lakehouse.storage)
    from coordinator.appender import DeltaAppender

    with DeltaAppender(path, storage=lakehouse.storage) as appender:
        return appender.append(pa.Table.from_pylist(rows, schema=CONSUMER_ACTIONS.arrow_schema()),
                               app_transactions=app_transactions)
