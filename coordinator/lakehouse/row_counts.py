"""How many rows a Delta table that is only appended to (a topic, a consumer group's redrive table) holds through
each of its versions, from its log's own statistics (``numRecords`` of the files each commit added, and of those a
checkpoint holds), never reading a data file.

The rows through version v (every row versions 0 to v added: a compaction moves rows and adds none) are found
from the nearest version whose count is known, before or after it, and the commits in between, read at once on
object storage. A count is known at -1 (none), at each single-file checkpoint the log's listing shows (every file
the table held then, one file to read), at each version this object counted before, and where its caller says:
a consumer's share records how many rows the versions before its position hold. A version's count never changes
once it is committed, so an object kept across calls (the checker's metrics) reads only what was committed
since. The table's newest version is found by listing its log from the newest checkpoint
(``_last_checkpoint``), or from the newest version this object knew: one request on S3, not a listing of the
whole log.

Example::

    counts = RowCounts(Lakehouse("lakehouse").files, "topics/ORDER_TOPIC")
    latest = counts.latest()                            # 1041
    counts.through(latest)                              # 1000250: every message the topic holds
    counts.through(latest, {899: 998000}) - 998000      # the messages of versions 900 to 1041
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections import OrderedDict
from types import MappingProxyType
from typing import Mapping, NamedTuple, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.exceptions import CorruptInputError, FileTooLargeError, PositionGoneError
from coordinator.lakehouse.checkpoints import last_delta_checkpoint
from coordinator.lakehouse.deltalog import (MAX_COMMIT_FILE_BYTES, added_statistics, commit_actions,
                                            file_record_count, parsed_statistics)
from coordinator.lakehouse.paths import delta_checkpoint_file, delta_log_file
from coordinator.storage import FileStore, read_all

__all__ = ["RowCounts"]

_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint\.parquet")
#: Keys a listing request returns at most (S3's page).
_PAGE = 1000
#: Past this many commits to read, the log around the version is listed once for a checkpoint nearer to it.
_FAR = 200
#: Counts kept (a few integers each): many more than a listing page, so a scrape's anchors stay known.
_KEPT_COUNTS = 20_000
_KEPT_TIMES = 1_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class _Commit(NamedTuple):
    """What one commit says of the rows it added: how many, and when the oldest was committed (epoch ms)."""

    rows: int
    oldest_ms: Optional[int]


class RowCounts:
    """The row counts of the Delta table at key ``table`` of ``files`` (see the module's docstring); safe to share
    between threads (a metrics endpoint may serve two scrapes at once)."""

    def __init__(self, files: FileStore, table: str, time_column: str = "commit_timestamp"):
        self.files = files
        self.table = table.rstrip("/")
        self.time_column = time_column
        self._log = f"{self.table}/_delta_log"
        self._latest: Optional[int] = None
        self._checkpoints: set[int] = set()
        self._listed_all = False  # a listing of the whole log was made (where a listing cannot start further on)
        self._looked_around: set[int] = set()
        self._through: OrderedDict[int, int] = OrderedDict()  # rows through a version, from a count of its own
        self._counts: OrderedDict[int, int] = OrderedDict()  # rows a version's commit added
        self._oldest: OrderedDict[int, Optional[int]] = OrderedDict()
        self._lock = threading.Lock()

    def latest(self) -> int:
        """The table's newest version (-1: none yet), listed from the newest version known, or the newest checkpoint.

        Example::

            RowCounts(files, "topics/T").latest()  # 1041
        """
        with self._lock:
            if self._latest is None:
                newest_checkpoint = last_delta_checkpoint(self.files, self.table)
                start = -1 if newest_checkpoint is None else newest_checkpoint
            else:
                start = self._latest
            self._note(self._listed_from(start))
            if self._latest is None:
                self._latest = -1  # no table yet: listed from its start next time, no pointer to read
            return self._latest

    def earliest(self) -> int:
        """The oldest version the log still holds a commit of (0 until log cleanup removes some): the first keys
        of its listing, on a store that can list a few.

        Example::

            RowCounts(files, "topics/T").earliest()  # 0
        """
        first = self.files.list_after(self._log, f"{self._log}/", max_keys=8)
        versions = _commit_versions(first or [])
        return min(versions or _commit_versions(self.files.list(self._log)), default=0)

    def through(self, version: int, known: Mapping[int, int] = MappingProxyType({})) -> int:
        """How many rows versions 0 to ``version`` added (``version`` at most :meth:`latest`'s). ``known``: counts
        the caller knows (version -> rows through it), used where they are nearer than what this object knows,
        and not kept. :class:`PositionGoneError` if a commit it must read is gone (log cleanup) with no count
        known beyond it.

        Example::

            counts.through(1041)               # 1000250
            counts.through(40, {39: 10000})    # 10000 + the rows of version 40
        """
        if version < 0:
            return 0
        with self._lock:
            return self._through_locked(version, known)

    def before(self, version: int) -> int:
        """How many rows the versions before ``version`` added (``version`` past the newest: every row), as
        :meth:`through` counts them.

        Example::

            counts.before(1042)  # 1000250, with 1041 the newest version
        """
        if version <= 0:
            return 0
        known = self._latest
        return self.through(min(version - 1, known if known is not None and version - 1 <= known else self.latest()))

    def oldest_ms(self, version: int) -> Optional[int]:
        """When the oldest row version ``version`` added was committed (epoch milliseconds): the least
        ``time_column`` of its files by their statistics (which keep milliseconds), else the commit's own time;
        ``None`` if the log no longer holds the version. One request, once a version.

        Example::

            RowCounts(files, "topics/T").oldest_ms(1041)  # 1717000000123
        """
        with self._lock:
            if version in self._oldest:
                return self._oldest[version]
        try:
            commit = self._commit(version)
        except PositionGoneError:
            return None
        with self._lock:
            self._keep(self._oldest, version, commit.oldest_ms, _KEPT_TIMES)
        return commit.oldest_ms

    # Finding the newest version and the checkpoints.

    def _listed_from(self, version: int) -> list[str]:
        """The names in the log from ``version``'s files on (everything on a store that cannot list from a key)."""
        after, names = f"{self._log}/{version:020d}" if version >= 0 else f"{self._log}/", []
        while True:
            keys = self.files.list_after(self._log, after, max_keys=_PAGE)
            if keys is None:
                self._listed_all = True
                return _names(self.files.list(self._log))
            names += _names(keys)
            if len(keys) < _PAGE:
                return names
            after = keys[-1]

    def _note(self, names: list[str]) -> None:
        for name in names:
            commit, checkpoint = _COMMIT.fullmatch(name), _CHECKPOINT.fullmatch(name)
            if commit:
                self._latest = max(self._latest if self._latest is not None else -1, int(commit.group(1)))
            elif checkpoint:
                self._checkpoints.add(int(checkpoint.group(1)))

    def _look_around(self, version: int) -> None:
        """List the log once around ``version`` for its checkpoints (the whole log where it cannot start further on)."""
        window = version // (_PAGE // 2)
        if self._listed_all or window in self._looked_around:
            return
        self._looked_around.add(window)
        keys = self.files.list_after(self._log, f"{self._log}/{max(0, version - _PAGE // 2):020d}", max_keys=_PAGE)
        if keys is None:
            self._listed_all = True
            keys = self.files.list(self._log)
        self._note(_names(keys))

    # Counting.

    def _through_locked(self, version: int, known: Mapping[int, int]) -> int:
        base, cost = self._nearest(version, known)
        if cost > _FAR:
            self._look_around(version)
            base, cost = self._nearest(version, known)
        if base in self._checkpoints and base not in self._through and base not in known:
            rows = self._checkpoint_rows(base)
            self._checkpoints.discard(base)  # read once: its count is kept, or it is not one this reads
            if rows is not None:
                self._keep(self._through, base, rows, _KEPT_COUNTS)
            return self._through_locked(version, known)
        # A caller's count is used, not kept: a record another group wrote must not change what this one is told.
        trusted = base == -1 or base in self._through
        rows = 0 if base == -1 else self._through[base] if trusted else known[base]
        step = 1 if base < version else -1
        between = range(base + 1, version + 1) if step == 1 else range(base, version, -1)
        counts = {commit_version: self._counts[commit_version] for commit_version in between
                  if commit_version in self._counts}
        missing = [commit_version for commit_version in between if commit_version not in counts]
        for commit_version, commit in zip(missing, read_all(self._commit, missing, remote=self.files.remote)):
            counts[commit_version] = commit.rows
            self._keep(self._counts, commit_version, commit.rows, _KEPT_COUNTS)
            self._keep(self._oldest, commit_version, commit.oldest_ms, _KEPT_TIMES)
        for commit_version in between:
            rows += step * counts[commit_version]
            if trusted:
                self._keep(self._through, commit_version if step == 1 else commit_version - 1, rows, _KEPT_COUNTS)
        return rows

    def _nearest(self, version: int, known: Mapping[int, int]) -> tuple[int, int]:
        """The count nearest to ``version`` in commits to read (a checkpoint not read yet costs one read more), and
        that cost; of two as near, one this object found (what is counted from it is kept)."""
        below = max((anchor for anchor in self._through if anchor <= version), default=-1)
        above = min((anchor for anchor in self._through if anchor > version), default=None)
        candidates = {anchor: (self._unread(version, anchor), 1) for anchor in known}
        candidates |= {anchor: (self._unread(version, anchor), 0) for anchor in (-1, below, above) if anchor is not None}
        for checkpoint in self._checkpoints:
            candidates.setdefault(checkpoint, (self._unread(version, checkpoint) + 1, 0))
        base, (cost, _) = min(candidates.items(), key=lambda item: item[1])
        return base, cost

    def _unread(self, version: int, anchor: int) -> int:
        """How many commits counting ``version`` from ``anchor`` reads (those not counted before)."""
        between = range(anchor + 1, version + 1) if anchor < version else range(version + 1, anchor + 1)
        return sum(commit_version not in self._counts for commit_version in between)

    def _checkpoint_rows(self, version: int) -> Optional[int]:
        """The rows of every file checkpoint ``version`` holds, by their statistics; ``None`` if it is not a
        single file with them (read as commits instead)."""
        try:
            found = self.files.read(f"{self.table}/{delta_checkpoint_file(version)}")
        except FileTooLargeError:
            return None
        if found is None:
            return None
        try:
            adds = pq.ParquetFile(pa.BufferReader(found.data)).read(columns=["add"]).column("add")
            stats = pc.struct_field(adds, "stats").drop_null().to_pylist()
        except (pa.ArrowException, KeyError):
            return None
        return sum(file_record_count(parsed) for parsed in map(parsed_statistics, stats) if parsed is not None)

    def _commit(self, version: int) -> _Commit:
        """What version ``version``'s commit says of its rows (read now; called on several threads at once)."""
        try:
            found = self.files.read(f"{self.table}/{delta_log_file(version)}", max_bytes=MAX_COMMIT_FILE_BYTES)
        except FileTooLargeError as error:
            raise CorruptInputError(f"{self.table} version {version}: {error}") from None
        if found is None:
            raise PositionGoneError(f"{self.table} no longer holds version {version} (its log was cleaned up past "
                                    "it): its rows cannot be counted from its commit")
        try:
            actions = commit_actions(found.data)
        except CorruptInputError:
            actions = []  # counted as none, as commit_record_count counts it
        stats = added_statistics(actions)
        oldest = [_epoch_ms(s["minValues"].get(self.time_column)) for s in stats if isinstance(s.get("minValues"), dict)]
        oldest = [when for when in oldest if when is not None]
        info = next((action["commitInfo"] for action in actions if isinstance(action.get("commitInfo"), dict)), {})
        stamp = info.get("timestamp")
        committed = stamp if isinstance(stamp, int) and not isinstance(stamp, bool) else found.modified_ms
        return _Commit(sum(map(file_record_count, stats)), min(oldest, default=committed))

    @staticmethod
    def _keep(kept: OrderedDict, version: int, value: Optional[int], most: int) -> None:
        kept[version] = value
        kept.move_to_end(version)
        while len(kept) > most:
            kept.popitem(last=False)


def _names(keys: list[str]) -> list[str]:
    return [key.rsplit("/", 1)[-1] for key in keys]


def _commit_versions(keys: list[str]) -> list[int]:
    return [int(match.group(1)) for match in map(_COMMIT.fullmatch, _names(keys)) if match]


def _epoch_ms(value: object) -> Optional[int]:
    """A statistics timestamp (``2026-12-06T05:26:48.430Z``) as epoch milliseconds; ``None`` if it is not one."""
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return (when - _EPOCH) // dt.timedelta(milliseconds=1)
