"""The commit logs of a lakehouse, and who writes each: a record's writer is the log it is stored in.

Every producer group appends to commit logs of its own, and operators' decisions (``txcoord
resolve``) go to ``operators/commit_log``. A group's first log is ``groups/<group>/commit_log``;
each further instance of the group running at the same time writes one more,
``groups/<group>/commit_log.<n>`` (n from 1 to :data:`LOGS_PER_GROUP` - 1), claimed for as long as
it runs (:meth:`coordinator.control.instances.ProducerInstances.claim_log`), so a group's instances
append side by side instead of racing for the versions of one log (a Delta log takes one version at
a time). Its logs are numbered without gaps: an instance makes the logs below its own before it
writes, so a reader finds them all by looking for the next one (:meth:`CommitLogs.discover`). The storage's own
permissions say who may write each one (docs/operations.md#tenancy lists the grants), so the
checker never takes a writer's identity from a column the writer filled in: it takes it from the
log (:class:`CommitLogRef`), and refuses a record whose columns claim otherwise
(:mod:`coordinator.checker.provenance`).

A lakehouse made before logs were per group has one log every group shared, ``system/commit_log``.
``txcoord upgrade`` retires it (:func:`coordinator.ops.tenancy.upgrade`): the checker still reads
what was written there before the upgrade, trusting its columns as before, and refuses, with the
reason, whatever arrives there afterwards. The lakehouse's **layout** record
(``system/_layout.json``, :class:`Layout`) says whether this has been done, and up to which version
the shared log is trusted.

Example::

    logs = CommitLogs(Lakehouse("lakehouse"))
    [ref.key for ref in logs.discover()]   # ['groups/order_group/commit_log', 'operators/commit_log']
    CommitLogRef.of("groups/order_group/commit_log.3").group   # 'order_group'
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Iterable, Mapping, NamedTuple, Optional


from coordinator.doorbells import GroupWatch, group_of_doorbell
from coordinator.exceptions import InvalidArgumentError, OutdatedLakehouseError
from coordinator.lakehouse import (GROUPS_KEY, LAYOUT_KEY, OPERATORS_LOG_KEY, SHARED_LOG_KEY, Lakehouse, delta_log_file,
                                   group_key, group_of_key)
from coordinator.storage import FileStore, read_all

__all__ = ["CURRENT_LAYOUT", "LOGS_PER_GROUP", "CommitLogRef", "CommitLogs", "Lag", "Layout", "committed",
           "versions_written"]

#: The layout this version writes: commit logs of each group's own, and the operators' own.
CURRENT_LAYOUT = 2
#: The most commit logs of one group: as many instances of a group append side by side; more share them.
LOGS_PER_GROUP = 64
_LOG_NAME = "commit_log"


@dataclass(frozen=True, order=True)
class CommitLogRef:
    """One commit log, by its key under the lakehouse's root, and who writes it.

    Example::

        CommitLogRef.of("groups/order_group/commit_log").group   # 'order_group'
        CommitLogRef.of("operators/commit_log").is_operators      # True
    """

    key: str

    @classmethod
    def of(cls, key: str) -> "CommitLogRef":
        """The log at ``key``; :class:`InvalidArgumentError` for a key that is no commit log's."""
        ref = cls(key)
        if not (ref.is_operators or ref.is_shared or ref.group is not None):
            raise InvalidArgumentError(f"{key!r} is not a commit log of a lakehouse")
        return ref

    @classmethod
    def of_group(cls, group: str, number: int = 0) -> "CommitLogRef":
        """Commit log ``number`` of producer group ``group`` (its first, ``commit_log``, by default).

        Example::

            CommitLogRef.of_group("order_group", 2).key   # 'groups/order_group/commit_log.2'
        """
        if not 0 <= number < LOGS_PER_GROUP:
            raise InvalidArgumentError(f"a group's commit logs are numbered 0 to {LOGS_PER_GROUP - 1}, not {number}")
        name = _LOG_NAME if number == 0 else f"{_LOG_NAME}.{number}"
        return cls(f"{GROUPS_KEY}/{group_key(group)}/{name}")

    @classmethod
    def operators(cls) -> "CommitLogRef":
        """The operators' commit log."""
        return cls(OPERATORS_LOG_KEY)

    @property
    def group(self) -> Optional[str]:
        """The producer group whose own log this is; ``None`` for the operators' and the shared log."""
        parts = self.key.split("/")
        if len(parts) == 3 and parts[0] == GROUPS_KEY and _log_number(parts[2]) is not None:
            return group_of_key(parts[1])
        return None

    @property
    def number(self) -> Optional[int]:
        """Which of its group's logs this is (0 for ``commit_log``); ``None`` if it is no group's."""
        return _log_number(self.key.rsplit("/", 1)[-1]) if self.group is not None else None

    @property
    def is_operators(self) -> bool:
        """Whether this is the operators' log, which only operators may write."""
        return self.key == OPERATORS_LOG_KEY

    @property
    def is_shared(self) -> bool:
        """Whether this is the commit log every group shared before each had its own (retired)."""
        return self.key == SHARED_LOG_KEY

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class Layout:
    """What ``system/_layout.json`` records: the layout's number and, for a lakehouse upgraded from
    the shared commit log, the first version of that log written after the upgrade (``None``: it
    never had one)."""

    version: int = CURRENT_LAYOUT
    shared_log_end: Optional[int] = None


class CommitLogs:
    """The commit logs of one lakehouse (see the module's documentation)."""

    def __init__(self, lakehouse: Lakehouse):
        self.lakehouse = lakehouse

    def discover(self, layout: Optional[Layout] = None, known: Iterable[str] = (),
                 watch: Optional[GroupWatch] = None) -> list[CommitLogRef]:
        """Every commit log the checker reads, sorted: each group's (a directory under ``groups/``: its
        first log whether or not it has a first version yet, and each further one that has), the
        operators', and the retired shared one if the lakehouse was upgraded from it.

        One listing of ``groups/``, then for each group an existence check of the first commit of the
        log after its highest one found so far (``known``: keys of logs found before; the logs below a
        known one are taken as found), repeated while one is there: once per group in the steady state,
        the groups at once on object storage. With a ``watch`` (the checker's, on object storage), the
        listing's doorbells start its round, and only the groups it probes are looked at past their
        known logs (:mod:`coordinator.doorbells`), the listing being the watch's last when it is recent.
        The layout is read unless ``layout`` is given (it is known already: only ``txcoord upgrade``
        changes it, under the lease).

        Example::

            CommitLogs(Lakehouse("lakehouse")).discover()
        """
        files = self.lakehouse.files
        highest: dict[str, int] = {}
        for key in known:
            ref = CommitLogRef(key)
            if ref.group is not None:
                name = ref.key.split("/")[1]
                highest[name] = max(highest.get(name, 0), ref.number)

        def logs_of(name: str) -> list[CommitLogRef]:
            first = CommitLogRef(f"{GROUPS_KEY}/{name}/{_LOG_NAME}")
            group = first.group
            if group is None:
                return []
            number = highest.get(name, 0)
            while (group in probed and number + 1 < LOGS_PER_GROUP
                   and committed(files, CommitLogRef.of_group(group, number + 1).key, 0)):
                number += 1
            return [CommitLogRef.of_group(group, n) for n in range(number + 1)]

        listing = files.listing(GROUPS_KEY) if watch is None else watch.listing(lambda: files.listing(GROUPS_KEY))
        groups = [group_of_key(name) for name in listing.directories]
        if watch is None:
            probed = frozenset(groups)
        else:
            bells = {group: tag for name, tag in listing.files.items() if (group := group_of_doorbell(name)) is not None}
            probed = watch.start_round(groups, bells)
        names = listing.directories
        refs = [ref for logs in read_all(logs_of, names, remote=not self.lakehouse.is_local) for ref in logs]
        refs.append(CommitLogRef(OPERATORS_LOG_KEY))
        if (layout or self.layout()).shared_log_end is not None:
            refs.append(CommitLogRef(SHARED_LOG_KEY))
        return sorted(refs)

    def groups(self) -> list[str]:
        """The producer groups that have a directory under ``groups/``, sorted by name."""
        return sorted(group_of_key(name) for name in self.lakehouse.files.directories(GROUPS_KEY))

    def path(self, ref: CommitLogRef) -> str:
        """The location of the log ``ref``."""
        return self.lakehouse.key_path(ref.key)

    def layout(self) -> Layout:
        """The lakehouse's layout: read from ``system/_layout.json``; a lakehouse without the record
        has the current layout unless it holds the shared commit log (then
        :class:`OutdatedLakehouseError`: it needs ``txcoord upgrade``)."""
        stored = self.lakehouse.files.read(LAYOUT_KEY)
        if stored is not None:
            return Layout(**json.loads(stored.data))
        if self.lakehouse.files.exists(f"{SHARED_LOG_KEY}/{delta_log_file(0)}"):
            raise OutdatedLakehouseError(
                f"{self.lakehouse.root} was made by an earlier txcoord, whose producer groups share one commit log "
                f"({SHARED_LOG_KEY}); run `txcoord upgrade --config FILE` once (docs/operations.md#upgrading)")
        return Layout()

    def lag(self, read: Mapping[str, int], now_s: Optional[float] = None) -> "Lag":
        """How far the logs are ahead of a reader that has read each log's versions below ``read[key]``
        (the checker's progress): versions written over every log, those not read yet, and the age at
        ``now_s`` (default: now) of the oldest of those.

        Each log's latest version is found by probing for its commit files from the reader's
        position on (a few existence checks, however long the log): opening the logs' Delta tables
        would replay every commit since their last checkpoint, which a busy log makes slow
        (the checker's metrics endpoint computes this at every scrape).

        Example::

            CommitLogs(lakehouse).lag(CheckerProgress(lakehouse).load().next_versions).unread_versions
        """
        now_s = time.time() if now_s is None else now_s
        files = self.lakehouse.files
        written, unread, oldest_ms = 0, 0, None
        for ref in self.discover():
            first_unread = read.get(ref.key, 0)
            versions = versions_written(files, ref.key, first_unread)
            written += versions
            if first_unread < versions:
                unread += versions - first_unread
                commit = files.read(f"{ref.key}/{delta_log_file(first_unread)}")
                if commit is not None:
                    oldest_ms = commit.modified_ms if oldest_ms is None else min(oldest_ms, commit.modified_ms)
        return Lag(written, unread, 0.0 if oldest_ms is None else max(0.0, now_s - oldest_ms / 1000))

    def record_layout(self, layout: Layout) -> None:
        """Write ``system/_layout.json``."""
        self.lakehouse.files.put(LAYOUT_KEY, json.dumps({"version": layout.version,
                                                         "shared_log_end": layout.shared_log_end}).encode())


def _log_number(name: str) -> Optional[int]:
    """Which of a group's logs the directory ``name`` is: 0 for ``commit_log``, n for ``commit_log.<n>``
    (written as :meth:`CommitLogRef.of_group` writes it); ``None`` for any other name."""
    if name == _LOG_NAME:
        return 0
    prefix, dot, number = name.partition(".")
    if prefix == _LOG_NAME and dot and number.isascii() and number.isdigit() and not number.startswith("0"):
        return int(number) if int(number) < LOGS_PER_GROUP else None
    return None


def committed(files: FileStore, key: str, version: int) -> bool:
    """Whether commit log ``key`` (relative to ``files``' root) has version ``version``: its log file exists."""
    return files.exists(f"{key}/{delta_log_file(version)}")


def versions_written(files: FileStore, key: str, known: int = 0) -> int:
    """How many versions commit log ``key`` has (its latest + 1), knowing it has at least ``known``:
    doubling steps past the last version found, then halving back (about 2·log2 of the distance in
    existence checks).

    Example::

        versions_written(lakehouse.files, "groups/order_group/commit_log", known=1200)  # e.g. 1234
    """
    if not committed(files, key, known):
        return known
    present, step = known, 1
    while committed(files, key, present + step):
        present, step = present + step, step * 2
    absent = present + step
    while absent - present > 1:
        middle = (present + absent) // 2
        present, absent = (middle, absent) if committed(files, key, middle) else (present, middle)
    return present + 1


class Lag(NamedTuple):
    """What :meth:`CommitLogs.lag` finds."""

    written_versions: int  # over every commit log
    unread_versions: int  # of those, the ones not read yet
    seconds: float  # the age of the oldest unread version (0 when none)
