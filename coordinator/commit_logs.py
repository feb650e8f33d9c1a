"""The commit logs of a lakehouse, and who writes each: a record's writer is the log it is stored in.

Every producer group appends to a commit log of its own, ``groups/<group>/commit_log``, and
operators' decisions (``txcoord resolve``) go to ``operators/commit_log``. The storage's own
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
    CommitLogRef.of("groups/order_group/commit_log").group   # 'order_group'
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional


from coordinator.exceptions import InvalidArgumentError, OutdatedLakehouseError
from coordinator.lakehouse import (GROUPS_KEY, LAYOUT_KEY, OPERATORS_LOG_KEY, SHARED_LOG_KEY, Lakehouse, delta_log_file,
                                   group_key, group_of_key)
from coordinator.storage import FileStore

__all__ = ["CURRENT_LAYOUT", "CommitLogRef", "CommitLogs", "Lag", "Layout", "committed", "versions_written"]

#: The layout this version writes: one commit log per group, and the operators' own.
CURRENT_LAYOUT = 2


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
    def of_group(cls, group: str) -> "CommitLogRef":
        """The commit log of producer group ``group``."""
        return cls(f"{GROUPS_KEY}/{group_key(group)}/commit_log")

    @classmethod
    def operators(cls) -> "CommitLogRef":
        """The operators' commit log."""
        return cls(OPERATORS_LOG_KEY)

    @property
    def group(self) -> Optional[str]:
        """The producer group whose own log this is; ``None`` for the operators' and the shared log."""
        parts = self.key.split("/")
        if len(parts) == 3 and parts[0] == GROUPS_KEY and parts[2] == "commit_log":
            return group_of_key(parts[1])
        return None

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

    def discover(self, layout: Optional[Layout] = None) -> list[CommitLogRef]:
        """Every commit log the checker reads, sorted: each group's (a directory under ``groups/``,
        whether or not its log has a first version yet), the operators', and the retired shared one
        if the lakehouse was upgraded from it. One listing of ``groups/``, and the layout read unless
        ``layout`` is given (it is known already: only ``txcoord upgrade`` changes it, under the lease).

        Example::

            CommitLogs(Lakehouse("lakehouse")).discover()
        """
        refs = [CommitLogRef(f"{GROUPS_KEY}/{name}/commit_log")
                for name in self.lakehouse.files.directories(GROUPS_KEY)]
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
