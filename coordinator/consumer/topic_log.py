"""Reading a topic's Delta table version by version, as files, with no JVM and no snapshot.

The checker appends each batch's messages for a topic as one commit (one data file, its rows in
``queue_offset`` order; :mod:`coordinator.checker.delivery`), so the topic's delivery order is its
versions in order, and ``queue_offset`` within a version. ``queue_offset`` alone is not that order: a
message withheld while its topic could not be written lands in a later version than messages with higher
offsets. A consumer reads a version's commit file (``_delta_log/<version>.json``), then the data files it
added with new data (a compaction's, ``dataChange=false``, are skipped, as Delta's change feed skips them),
each straight from the storage: of a file the checker wrote by slot (:mod:`coordinator.lakehouse.slots`), only
the row groups of the shares this instance holds (:meth:`TopicLog.want`), with the file's footer, at once; how far
the table has grown is found by probing the next commit file, one
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
from typing import Mapping, NamedTuple, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.exceptions import CorruptInputError, FileTooLargeError, PositionGoneError, one_line
from coordinator.lakehouse.delta import open_table
from coordinator.lakehouse.deltalog import (MAX_COMMIT_FILE_BYTES, added_files, added_statistics, commit_actions,
                                            commit_record_count, file_record_count)
from coordinator.lakehouse.reads import query_snapshot
from coordinator.lakehouse.slots import SLOTS_TAG, SlotIndex, read_row_groups
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
        self._wanted: Optional[_Shares] = None  # the shares whose rows a read fetches; None: every row
        #: Bytes of data files and rows read so far (tests and benchmarks: what an instance reads of a topic).
        self.bytes_read = 0
        self.rows_read = 0
        self._counting = threading.Lock()
        self._lock = threading.Lock()

    @property
    def known(self) -> Optional[int]:
        """The newest version the last :meth:`latest` found (``None`` before one), with no request."""
        return self._latest

    def want(self, numbers: "frozenset[int] | set[int]", shares: int) -> None:
        """From now on read of each version only the rows of shares ``numbers`` of ``shares`` (and whatever else
        lies in the same parts of its files): where the checker wrote a file by slot, the row groups holding them.
        A share asked for later of a version read without it reads that version again.

        Example::

            log.want({3, 11}, 16)   # an instance holding shares 3 and 11 of 16 reads about an eighth of each file
        """
        with self._lock:
            self._wanted = _Shares(frozenset(numbers), shares)

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
                    read, found = read_all(lambda call: call(), [lambda: self._version_or_none(version, found),
                                                                 lambda: self._probe(version + 1)], remote=True)
                    if read is not None:  # else read again by rows(), which says what is wrong with it
                        self._remember(version, read)
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

    def _version_or_none(self, version: int, commit: Optional[bytes]) -> "Optional[_Version]":
        """The version read for the shares wanted now, or ``None`` if it cannot be (off the reader's thread)."""
        try:
            return self._read(version, commit, self._wanted)
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
            versions = read_all(lambda item: self._version_or_none(*item), wanted, remote=True)
            with self._lock:
                for (version, _), found in zip(wanted, versions):
                    if found is not None:
                        self._remember(version, found)
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
        return self._version(version, None).rows()

    def share_rows(self, version: int, number: int, shares: int, share_of) -> list[dict]:
        """The :meth:`rows` of ``version`` in share ``number`` of ``shares`` by ``share_of(keys, msg_id, shares)``,
        in ``queue_offset`` order. Only the rows of the shares asked for are converted, each once: an instance
        holding half a topic's shares converts half of each version.

        Example::

            TopicLog(files, "topics/T").share_rows(3, 5, 16, share_of)   # the rows of share 5 of 16
        """
        return self._version(version, (number, shares)).share_rows(number, shares, share_of)

    def known_count(self, version: int) -> int:
        """How many messages version ``version`` added, as far as known with no request: from its rows if read,
        else from its commit's statistics (``numRecords``) if a probe found it; 0 if neither.

        Example::

            TopicLog(files, "topics/T").known_count(42)  # 250
        """
        with self._lock:
            cached = self._cache.get(version)
            if cached is not None:
                return cached.total_rows
            commit = self._commits.get(version)
        return 0 if commit is None else commit_record_count(commit)

    def row_count(self, version: int) -> int:
        """How many messages version ``version`` added (read as :meth:`rows` reads it).

        Example::

            TopicLog(files, "topics/T").row_count(3)  # 250
        """
        return self._version(version, ()).total_rows

    def batch_of(self, version: int) -> Optional[int]:
        """The checker batch that wrote version ``version`` (its rows' ``batch_id``), or ``None`` if none says.

        Example::

            TopicLog(files, "topics/T").batch_of(3)  # 1207
        """
        return self._version(version, ()).batch

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

    def _version(self, version: int, share: "tuple[int, int] | tuple[()] | None") -> "_Version":
        """Version ``version`` as read, holding the rows of ``share`` (number, shares); every row if ``None``; any
        part of it if ``()``. Read again if what is kept of it lacks them."""
        with self._lock:
            reading = self._reading.get(version)
        if reading is not None:
            reading.wait()
        with self._lock:
            cached = self._cache.get(version)
            if cached is not None and cached.holds(share):
                self._cache.move_to_end(version)
                return cached
            commit = self._commits.pop(version, None)
            wanted = None if share is None else self._wanted if not share else _Shares.joined(self._wanted, *share)
        read = self._read(version, commit, wanted)
        with self._lock:
            self._forget(version)
            self._remember(version, read)
            return read

    def _count(self, bytes_read: int = 0, rows_read: int = 0) -> None:
        with self._counting:  # reads run on several threads at once
            self.bytes_read += bytes_read
            self.rows_read += rows_read

    def _forget(self, version: int) -> None:
        """Drop what is kept of ``version`` (the lock held)."""
        dropped = self._cache.pop(version, None)
        if dropped is not None:
            self._cached_rows -= dropped.table.num_rows

    def _remember(self, version: int, read: "_Version") -> None:
        """Cache ``read`` as ``version`` (the lock held)."""
        if version in self._cache:
            return
        self._cache[version] = read
        self._cached_rows += read.table.num_rows
        while len(self._cache) > CACHED_VERSIONS and self._cached_rows > CACHED_ROWS:
            self._cached_rows -= self._cache.popitem(last=False)[1].table.num_rows

    def _read(self, version: int, commit: Optional[bytes], wanted: "Optional[_Shares]") -> "_Version":
        """The rows ``version`` added (of the shares ``wanted``, ``None``: all), from ``commit`` (its commit file, as
        a probe found it) or its file read now."""
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
        return self._version_of(version, commit, wanted)

    def _version_of(self, version: int, commit: bytes, wanted: "Optional[_Shares]") -> "_Version":
        actions = commit_actions(commit)
        files = []
        for added in added_files(actions):
            if added.path is None:
                raise CorruptInputError(f"{self.table} version {version}: {added.refusal}")
            index = SlotIndex.parse(added.tags.get(SLOTS_TAG), added.size) \
                if wanted is not None and isinstance(added.tags, dict) else None
            row_groups = None if index is None else index.row_groups_for(wanted.numbers, wanted.shares)
            files.append((added.path, index, row_groups))

        def read_file(file: tuple) -> pa.Table:
            path, index, row_groups = file
            key = f"{self.table}/{path}"
            if row_groups is not None:
                ranges = index.ranges_for(row_groups)
                pieces = read_all(lambda span: self.files.read_range(key, *span), ranges, remote=self.files.remote)
                if any(piece is None for piece in pieces):
                    raise PositionGoneError(f"{self.table} version {version}: its data file {path} is gone (vacuumed)")
                self._count(bytes_read=sum(map(len, pieces)))
                try:
                    return read_row_groups(index.size, dict(zip(ranges, pieces)), row_groups)
                except (pa.ArrowException, OSError) as error:
                    raise CorruptInputError(f"{self.table} version {version}: {path}'s slots are not where its "
                                            f"tags say ({one_line(error)})") from None
            found = self.files.read(key)
            if found is None:
                raise PositionGoneError(f"{self.table} version {version}: its data file {path} is gone (vacuumed)")
            self._count(bytes_read=len(found.data))
            # One file, one thread: read_table goes through the datasets layer and its thread pool, many times
            # slower on a version's small file (docs/performance-log.md#consumers).
            return pq.ParquetFile(pa.BufferReader(found.data)).read(use_threads=False)

        tables = read_all(read_file, files, remote=self.files.remote)
        whole = all(row_groups is None for _, _, row_groups in files)
        if not tables:
            table = pa.table({"keys": pa.array([], pa.string()), "msg_id": pa.array([], pa.string()),
                              "queue_offset": pa.array([], pa.int64())})
        else:
            table = pa.concat_tables(tables, promote_options="default")
            missing = _SHARED_COLUMNS.difference(table.column_names)
            if missing:
                raise CorruptInputError(f"{self.table} version {version}: no column {', '.join(sorted(missing))}")
        self._count(rows_read=table.num_rows)
        statistics = added_statistics(actions)
        return _Version(table.sort_by("queue_offset"), None if whole else wanted,
                        table.num_rows if whole else sum(map(file_record_count, statistics)), _batch(table, statistics))


def _batch(table: pa.Table, statistics: list[dict]) -> Optional[int]:
    """The checker batch that wrote a version: its rows' ``batch_id``, or its files' statistics' when none was read."""
    if "batch_id" in table.column_names and table.num_rows:
        return pc.max(table.column("batch_id")).as_py()
    batches = [stats["maxValues"].get("batch_id") for stats in statistics if isinstance(stats.get("maxValues"), dict)]
    batches = [batch for batch in batches if type(batch) is int]
    return max(batches) if batches else None


class _Shares(NamedTuple):
    """Shares ``numbers`` of ``shares``: the rows a read fetches."""

    numbers: frozenset[int]
    shares: int

    @staticmethod
    def joined(wanted: "Optional[_Shares]", number: int, shares: int) -> "_Shares":
        """``wanted`` and share ``number`` of ``shares`` (that share alone if ``wanted`` counts other shares)."""
        if wanted is None or wanted.shares != shares:
            return _Shares(frozenset({number}), shares)
        return _Shares(wanted.numbers | {number}, shares)


#: The columns a version's rows are shared out and ordered by.
_SHARED_COLUMNS = frozenset({"keys", "msg_id", "queue_offset"})


class _Version:
    """A version's rows as read, and converted to dicts only as asked: whole, or the rows of one share."""

    __slots__ = ("table", "read_for", "total_rows", "batch", "_rows", "_positions", "_share_rows")

    def __init__(self, table: pa.Table, read_for: Optional[_Shares] = None, total_rows: Optional[int] = None,
                 batch: Optional[int] = None):
        self.table = table
        self.read_for = read_for  # the shares whose rows were read; None: every row
        self.total_rows = table.num_rows if total_rows is None else total_rows
        self.batch = batch
        self._rows: Optional[list[dict]] = None
        self._positions: dict[int, list[list[int]]] = {}  # shares → each share's row positions
        self._share_rows: dict[tuple[int, int], list[dict]] = {}

    def holds(self, share: "tuple[int, int] | tuple[()] | None") -> bool:
        """Whether the rows read include those of ``share`` (number, shares); of every share if ``None``; ``()``:
        any part will do."""
        if self.read_for is None or share == ():
            return True
        return share is not None and share[1] == self.read_for.shares and share[0] in self.read_for.numbers

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
