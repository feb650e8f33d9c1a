"""Reading a topic's Delta table version by version, as files, with no JVM and no snapshot.

The checker appends each batch's messages for a topic as one commit (one data file, its rows in
``queue_offset`` order; :mod:`coordinator.checker.delivery`), so the topic's delivery order is its
versions in order, and ``queue_offset`` within a version. ``queue_offset`` alone is not that order: a
message withheld while its topic could not be written lands in a later version than messages with higher
offsets. A consumer reads a version's commit file (``_delta_log/<version>.json``), then the data files it
added with new data (a compaction's, ``dataChange=false``, are skipped, as Delta's change feed skips them),
each straight from the storage; how far the table has grown is found by probing the next commit file, one
request per poll, as the checker finds new commit-log versions. The probe is a GET (priced as a HEAD on S3), and
the commit file it finds is kept for the read: on object storage the found version's data files are read at
once beside the probe of the version after it, so a new version costs the reader two round trips, not four.

A version that log cleanup has removed, or whose data file vacuum removed, cannot be read:
:class:`~coordinator.exceptions.PositionGoneError` says so. The table's snapshot at a version still holds its
messages (:meth:`TopicLog.snapshot_share_rows`, read by delta-rs): what a share reads then
(``consumer_position_gone``, :mod:`coordinator.consumer.share`).

Example::

    log = TopicLog(Lakehouse("lakehouse").files, "topics/ORDER_TOPIC")
    log.latest()                               # 41
    [row["queue_offset"] for row in log.rows(41)]   # [977, 978, 979]
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections import OrderedDict
from typing import Mapping, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.exceptions import CorruptInputError, FileTooLargeError, PositionGoneError, one_line
from coordinator.lakehouse.delta import open_table
from coordinator.lakehouse.deltalog import MAX_COMMIT_FILE_BYTES, added_files, commit_actions, commit_record_count
from coordinator.lakehouse.reads import query_snapshot
from coordinator.storage import FileStore, read_all
from coordinator.tables import TOPIC

__all__ = ["CACHED_VERSIONS", "TopicLog"]

#: Versions a log keeps (as read, and the rows of the shares converted from them), for the shares that read them
#: one after another: at least this many, and more while they hold at most CACHED_ROWS rows, since each share
#: reads ahead until it holds ``consumer_max_buffered`` messages, over more versions the smaller they are, and a
#: version evicted before the last share read it is read again.
CACHED_VERSIONS = 16
CACHED_ROWS = 100_000
#: Versions one :meth:`TopicLog.latest` reads the rows of beside the probe of the next (object storage only:
#: on a local disk a read is no round trip); commit files it found and kept for :meth:`TopicLog.rows`.
_READ_FOUND = 2
_KEPT_COMMITS = 64
_COMMIT = re.compile(r"(\d{20})\.json")


class TopicLog:
    """The versions of the Delta table at key ``table`` of ``files`` (a topic, or a group's redrive table)."""

    def __init__(self, files: FileStore, table: str, storage: Optional[Mapping[str, str]] = None):
        self.files = files
        self.table = table.rstrip("/")
        self._storage = storage  # delta-rs's options for the table's store, for snapshot reads
        self._snapshot: Optional[tuple[int, _Version]] = None  # the last snapshot read, by version
        self._latest: Optional[int] = None
        self._cache: OrderedDict[int, _Version] = OrderedDict()
        self._cached_rows = 0
        self._commits: OrderedDict[int, Optional[bytes]] = OrderedDict()  # found by a probe, not read yet
        #: Probes made (GETs of a next commit file), for tests that count a consumer's requests.
        self.probes = 0
        self._reading: dict[int, threading.Event] = {}  # versions read_ahead is reading: set once they are read
        self._lock = threading.Lock()

    @property
    def known(self) -> Optional[int]:
        """The newest version the last :meth:`latest` found (``None`` before one), with no request."""
        return self._latest

    def listed(self) -> dict[int, int]:
        """Every commit version in the table's log now, with when it was written (epoch milliseconds).

        Example::

            TopicLog(files, "topics/T").listed()  # {0: 1717000000000, 1: 1717000000500}
        """
        listed = self.files.modified(f"{self.table}/_delta_log")
        versions = {}
        for key, modified in listed.items():
            match = _COMMIT.fullmatch(key.rsplit("/", 1)[-1])
            if match:
                versions[int(match.group(1))] = modified
        return versions

    def latest(self) -> int:
        """The table's newest version (-1: no table yet): listed once, then found by probing the next commit file
        (version 0 while there is no table: a GET, where listing again cost a LIST, 12.5 times the price on S3).
        A commit file found is kept for :meth:`rows`; on object storage the rows of the first versions found are
        read at once, beside the probe of the next version (a round trip each, one after another, was most of a
        new message's wait at 25 ms a request).

        Example::

            TopicLog(files, "topics/T").latest()  # 41
        """
        with self._lock:
            if self._latest is None:
                self._latest = max(self.listed(), default=-1)
            found = self._probe(self._latest + 1)
            read_ahead = _READ_FOUND if self.files.remote else 0
            while found is not False:
                version = self._latest = self._latest + 1
                if read_ahead and version not in self._cache and found is not None:
                    read_ahead -= 1
                    table, found = read_all(lambda read: read(), [lambda: self._table_or_none(version, found),
                                                                  lambda: self._probe(version + 1)], remote=True)
                    if table is not None:  # else read again by rows(), which says what is wrong with it
                        self._remember(version, _Version(table))
                    continue
                self._keep(version, found)
                found = self._probe(version + 1)
            return self._latest

    def _probe(self, version: int) -> "bytes | None | bool":
        """The commit file of ``version``: its bytes, ``None`` if it exists but is too large to keep, ``False`` if
        there is none yet."""
        self.probes += 1
        try:
            commit = self.files.read(f"{self.table}/_delta_log/{version:020d}.json", max_bytes=MAX_COMMIT_FILE_BYTES)
        except FileTooLargeError:
            return None
        return False if commit is None else commit.data

    def _keep(self, version: int, commit: Optional[bytes]) -> None:
        self._commits[version] = commit
        while len(self._commits) > _KEPT_COMMITS:
            self._commits.popitem(last=False)

    def _table_or_none(self, version: int, commit: Optional[bytes]) -> Optional[pa.Table]:
        try:
            return self._read(version, commit)
        except Exception:  # noqa: BLE001 - read again by rows(), on the reader's thread, where it is reported
            return None

    def read_ahead(self, first: int, last: int) -> None:
        """On object storage, start reading the versions ``first`` to ``last`` not read yet, at once and in the
        background (a round trip or two each: one after another, between the reader's steps, they were most of a
        consumer's time catching up); :meth:`rows` of one waits for it. Nothing on a local disk. A version that
        cannot be read is left for :meth:`rows` to say why.

        Example::

            log.read_ahead(12, 19)   # versions 12 to 19 being read, at most CONCURRENT_READS at once
        """
        if not self.files.remote:
            return
        with self._lock:
            wanted = [(version, self._commits.pop(version, None)) for version in range(first, last + 1)
                      if version not in self._cache and version not in self._reading]
            if not wanted:
                return
            read = threading.Event()
            for version, _ in wanted:
                self._reading[version] = read
        threading.Thread(target=self._read_in_background, args=(wanted, read), daemon=True,
                         name=f"read-ahead-{self.table}").start()

    def _read_in_background(self, wanted: list[tuple[int, Optional[bytes]]], read: threading.Event) -> None:
        try:
            tables = read_all(lambda item: self._table_or_none(*item), wanted, remote=True)
            with self._lock:
                for (version, _), table in zip(wanted, tables):
                    if table is not None:
                        self._remember(version, _Version(table))
        finally:
            with self._lock:
                for version, _ in wanted:
                    self._reading.pop(version, None)
            read.set()

    def earliest(self) -> int:
        """The oldest version whose commit the log still holds (0 until log cleanup removes some).

        Example::

            TopicLog(files, "topics/T").earliest()  # 0
        """
        return min(self.listed(), default=0)

    def first_at(self, when_ms: int) -> int:
        """The first version committed at or after ``when_ms`` (epoch milliseconds); one past the newest if none.

        Example::

            TopicLog(files, "topics/T").first_at(1717000000000)  # 12
        """
        listed = self.listed()
        later = [version for version, modified in listed.items() if modified >= when_ms]
        return min(later) if later else max(listed, default=-1) + 1

    def rows(self, version: int) -> list[dict]:
        """The messages version ``version`` added, in ``queue_offset`` order, each a dict of the topic's columns
        (``properties`` a dict). Raises :class:`PositionGoneError` if the log no longer holds the version.

        Example::

            TopicLog(files, "topics/T").rows(3)[0]["msg_id"]  # '9f2c…'
        """
        return self._version(version).rows()

    def share_rows(self, version: int, number: int, shares: int, share_of) -> list[dict]:
        """The :meth:`rows` of ``version`` in share ``number`` of ``shares`` by ``share_of(keys, msg_id, shares)``,
        in ``queue_offset`` order. Only the rows of the shares asked for are converted, each once: an instance
        holding half a topic's shares converts half of each version.

        Example::

            TopicLog(files, "topics/T").share_rows(3, 5, 16, share_of)   # the rows of share 5 of 16
        """
        return self._version(version).share_rows(number, shares, share_of)

    def known_count(self, version: int) -> int:
        """How many messages version ``version`` added, as far as known with no request: from its rows if read,
        else from its commit's statistics (``numRecords``) if a probe found it; 0 if neither.

        Example::

            TopicLog(files, "topics/T").known_count(42)  # 250
        """
        with self._lock:
            cached = self._cache.get(version)
            if cached is not None:
                return cached.table.num_rows
            commit = self._commits.get(version)
        return 0 if commit is None else commit_record_count(commit)

    def row_count(self, version: int) -> int:
        """How many messages version ``version`` added (read as :meth:`rows` reads it).

        Example::

            TopicLog(files, "topics/T").row_count(3)  # 250
        """
        return self._version(version).table.num_rows

    def batch_of(self, version: int) -> Optional[int]:
        """The checker batch that wrote version ``version`` (its rows' ``batch_id``), or ``None`` if none says.

        Example::

            TopicLog(files, "topics/T").batch_of(3)  # 1207
        """
        table = self._version(version).table
        if "batch_id" not in table.column_names or table.num_rows == 0:
            return None
        return pc.max(table.column("batch_id")).as_py()

    def snapshot_share_rows(self, version: int, number: int, shares: int, share_of) -> list[dict]:
        """The rows of share ``number`` of ``shares`` in the table's snapshot at ``version``: every message the
        table held then, whichever versions added them and however compaction rewrote their files, in
        queue-offset order (a key's order). Read by delta-rs, once a version.

        Example::

            TopicLog(files, "topics/T", storage).snapshot_share_rows(41, 5, 16, share_of)
        """
        if self._snapshot is None or self._snapshot[0] != version:
            try:
                table = query_snapshot(open_table(self.files.location(self.table), version, self._storage),
                                       TOPIC.arrow_schema())
            except Exception as error:  # noqa: BLE001 - delta-rs's own errors: the snapshot is gone too
                raise PositionGoneError(f"{self.table}: its snapshot at version {version} cannot be read "
                                        f"({one_line(error)})") from None
            self._snapshot = (version, _Version(table.sort_by("queue_offset")))
        return self._snapshot[1].share_rows(number, shares, share_of)

    def snapshot_row_count(self, version: int) -> Optional[int]:
        """How many messages the table's snapshot at ``version`` holds, if :meth:`snapshot_share_rows` read it last
        (else ``None``): every message of the versions up to it.

        Example::

            log.snapshot_row_count(41)  # 1000250
        """
        return self._snapshot[1].table.num_rows if self._snapshot is not None and self._snapshot[0] == version else None

    def _version(self, version: int) -> "_Version":
        with self._lock:
            reading = self._reading.get(version)
        if reading is not None:
            reading.wait()
        with self._lock:
            cached = self._cache.get(version)
            if cached is not None:
                self._cache.move_to_end(version)
                return cached
            commit = self._commits.pop(version, None)
        read = _Version(self._read(version, commit))
        with self._lock:
            self._remember(version, read)
            return self._cache.get(version, read)

    def _remember(self, version: int, read: "_Version") -> None:
        """Cache ``read`` as ``version`` (the lock held)."""
        if version in self._cache:
            return
        self._cache[version] = read
        self._cached_rows += read.table.num_rows
        while len(self._cache) > CACHED_VERSIONS and self._cached_rows > CACHED_ROWS:
            self._cached_rows -= self._cache.popitem(last=False)[1].table.num_rows

    def _read(self, version: int, commit: Optional[bytes] = None) -> pa.Table:
        """The rows ``version`` added, from ``commit`` (its commit file, as a probe found it) or its file read now."""
        if commit is None:
            key = f"{self.table}/_delta_log/{version:020d}.json"
            try:
                found = self.files.read(key, max_bytes=MAX_COMMIT_FILE_BYTES)
            except FileTooLargeError as error:
                raise CorruptInputError(f"{self.table} version {version}: {error}") from None
            if found is None:
                raise PositionGoneError(f"{self.table} no longer holds version {version} (its log was cleaned up "
                                        "past it): `txcoord consumer-groups reset` moves the group to a version it "
                                        "holds")
            commit = found.data
        return self._table_of(version, commit)

    def _table_of(self, version: int, commit: bytes) -> pa.Table:
        paths = []
        for added in added_files(commit_actions(commit)):
            if added.path is None:
                raise CorruptInputError(f"{self.table} version {version}: {added.refusal}")
            paths.append(added.path)

        def read_file(path: str) -> pa.Table:
            found = self.files.read(f"{self.table}/{path}")
            if found is None:
                raise PositionGoneError(f"{self.table} version {version}: its data file {path} is gone (vacuumed)")
            # One file, one thread: read_table goes through the datasets layer and its thread pool, many times
            # slower on a version's small file (docs/performance-log.md#consumers).
            return pq.ParquetFile(pa.BufferReader(found.data)).read(use_threads=False)

        tables = read_all(read_file, paths, remote=self.files.remote)
        if not tables:
            return pa.table({"keys": pa.array([], pa.string()), "msg_id": pa.array([], pa.string()),
                             "queue_offset": pa.array([], pa.int64())})
        table = pa.concat_tables(tables, promote_options="default")
        missing = _SHARED_COLUMNS.difference(table.column_names)
        if missing:
            raise CorruptInputError(f"{self.table} version {version}: no column {', '.join(sorted(missing))}")
        return table.sort_by("queue_offset")


#: The columns a version's rows are shared out and ordered by.
_SHARED_COLUMNS = frozenset({"keys", "msg_id", "queue_offset"})


class _Version:
    """A version's rows as read, and converted to dicts only as asked: whole, or the rows of one share."""

    __slots__ = ("table", "_rows", "_positions", "_share_rows")

    def __init__(self, table: pa.Table):
        self.table = table
        self._rows: Optional[list[dict]] = None
        self._positions: dict[int, list[list[int]]] = {}  # shares → each share's row positions
        self._share_rows: dict[tuple[int, int], list[dict]] = {}

    def rows(self) -> list[dict]:
        if self._rows is None:
            self._rows = _pylist(self.table)
        return self._rows

    def share_rows(self, number: int, shares: int, share_of) -> list[dict]:
        # Set once, then only read: two threads converting one share at once agree, and one answer stays.
        converted = self._share_rows.get((number, shares))
        if converted is None:
            positions = self._positions.get(shares)
            if positions is None:
                positions = [[] for _ in range(shares)]
                table = self.table
                for position, (keys, msg_id) in enumerate(zip(table.column("keys").to_pylist(),
                                                                table.column("msg_id").to_pylist())):
                    positions[share_of(keys, msg_id, shares)].append(position)
                self._positions[shares] = positions
            taken = positions[number]
            if not taken:
                converted = []
            elif len(taken) == self.table.num_rows:
                converted = self.rows()
            else:
                converted = _pylist(self.table.take(taken))
            self._share_rows[number, shares] = converted
        return converted


_UNIT_US = {"s": 1_000_000, "ms": 1000, "us": 1}


def _pylist(table: pa.Table) -> list[dict]:
    """``table.to_pylist(maps_as_pydicts="strict")``, column by column: pyarrow makes each timestamp a datetime
    several times slower than a timedelta added to the epoch, and a topic has two a row."""
    columns = []
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        kind = column.type
        if pa.types.is_timestamp(kind) and kind.unit in _UNIT_US and column.null_count < len(column):
            first = next(value for value in column if value.is_valid).as_py()
            epoch = dt.datetime(1970, 1, 1, tzinfo=first.tzinfo)
            scale = _UNIT_US[kind.unit]
            columns.append([None if value is None else epoch + dt.timedelta(microseconds=value * scale)
                            for value in column.cast(pa.int64()).to_pylist()])
        elif pa.types.is_map(kind):
            columns.append([None if pairs is None else _strict_dict(pairs) for pairs in column.to_pylist()])
        else:
            columns.append(column.to_pylist())
    names = table.column_names
    return [dict(zip(names, values)) for values in zip(*columns)]


def _strict_dict(pairs: list[tuple]) -> dict:
    converted = dict(pairs)
    if len(converted) != len(pairs):  # as maps_as_pydicts="strict" refuses a map with a key twice
        raise CorruptInputError("a message's properties hold a key twice")
    return converted
