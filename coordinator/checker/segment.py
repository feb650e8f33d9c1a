"""What one checker batch reads: a segment of every commit log, and its clock.

The commit logs (:mod:`coordinator.commit_logs`) are append-only, one small commit per group
commit. A :class:`Segment` names, for each log, the versions a batch covers, and the batch's
**clock** (the wall clock when Spark planned it). How far a log has grown is found by looking for
its next versions' ``_delta_log/<version>.json`` files (a commit exists whole or not at all), so a
trigger costs a few ``stat`` calls per log rather than a Delta snapshot rebuild.

:meth:`Segment.records` reads the segment on the driver: the data files its versions added, each
record with the log it came from, the version it entered with and when that version was
committed (the log file's modification time, which is what Delta calls the commit's timestamp).
Compaction commits (``dataChange=false``) add no records and are skipped, as Delta's own change
feed does. Each record also carries its commit file's sha256 and size as read, which the batch
keeps (:func:`commits_read`, ``system/commits_read``) so that a commit rewritten since can be told.
A data file outside the log's own directory is never read (a writer could otherwise
make another group's records, or any file the checker can read, appear in its own log). What a
log's writer wrote is untrusted bytes (docs/design.md#hostile-input): a commit that cannot be read, or that
names a client protocol this checker does not know (:func:`~coordinator.protocol.protocol_refusal`), stands as
one record whose ``refusal`` says why, and so does each data file that cannot be, which the batch refuses;
nothing of one log costs another.

The commits of the different logs are merged by commit time (ties by log, then version), each
log's own commits staying in version order; ``commit_rank`` numbers them in that order. With the
batch's id it gives every commit a place in one order across all logs and batches (its *sequence*,
:mod:`coordinator.checker.context`), the same every time the batch is replayed.

Needs no JVM: the Spark source (:mod:`.source`), recovery and ``txcoord upgrade`` share it.

Example::

    segment = Segment({"groups/g/commit_log": 3}, {"groups/g/commit_log": 5}, clock_us)
    segment.records(Lakehouse("lakehouse")).num_rows
"""

from __future__ import annotations

import heapq
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.checker.context import kept
from coordinator.commit_logs import CommitLogRef, CommitLogs, Layout, committed
from coordinator.doorbells import GroupWatch
from coordinator.exceptions import CorruptInputError, FileTooLargeError
from coordinator.lakehouse import Lakehouse, delta_log_file
from coordinator.lakehouse.deltalog import MAX_COMMIT_FILE_BYTES, added_files, commit_actions, commit_digest
from coordinator.protocol import MAX_COMMIT_BODY_BYTES, protocol_refusal
from coordinator.storage import FileStore, read_all
from coordinator.tables import COMMIT_LOG

__all__ = ["MAX_VERSIONS_PER_BATCH", "RECORD_SCHEMA", "CommitRead", "Segment", "committed_run", "commits_read", "grown_to",
           "read_commits", "tick"]

#: A backlog is read in bounded steps: at most this many commit-log versions per batch, over all logs.
#: Below 2**11, so that a commit's rank in its batch fits below :data:`~.context.COMMITS_PER_BATCH`.
MAX_VERSIONS_PER_BATCH = 2000
#: Versions read at once on object storage, each its commit file then its data file: a trigger of a hundred
#: versions from several busy logs waits for two round trips per wave of reads.
SEGMENT_READS = 64

#: Bounds on a data file a commit adds, checked before its records are read: a producer's commit holds
#: bodies of at most ``MAX_COMMIT_BODY_BYTES`` together, and each record's other columns take a few
#: hundred bytes. A file beyond them is refused unread (a decompression bomb by its footer).
MAX_DATA_FILE_BYTES = 2 * MAX_COMMIT_BODY_BYTES
MAX_DATA_FILE_ROWS = 1_000_000
MAX_DATA_FILE_UNCOMPRESSED_BYTES = 4 * MAX_COMMIT_BODY_BYTES
_REASON_CHARS = 512

_COMMIT_LOG_SCHEMA = COMMIT_LOG.arrow_schema()
#: A commit's records when it added none (the log's creation, a compaction). Not ``Schema.empty_table()``: that
#: imports pandas, which the read-ahead worker otherwise never needs, inside its first read of a backlog
#: (docs/performance-log.md#backlog-drain).
_NO_RECORDS = pa.Table.from_batches([], schema=_COMMIT_LOG_SCHEMA)
#: A checker record: a commit-log record, the log and version it entered with, when that version was
#: committed, its commit's rank in the batch and the commit file's sha256 and size as read (null if it
#: could not be read); or a clock tick. ``refusal`` is set on a record that cannot be read at all (a data
#: file outside its log).
RECORD_SCHEMA = pa.schema([*_COMMIT_LOG_SCHEMA, pa.field("commit_log", pa.string()),
                           pa.field("commit_version", pa.int64()), pa.field("commit_rank", pa.int64()),
                           pa.field("commit_sha256", pa.string()), pa.field("commit_bytes", pa.int64()),
                           pa.field("refusal", pa.string()),
                           pa.field("stored_timestamp", pa.timestamp("us", tz="UTC")),
                           pa.field("is_heartbeat", pa.bool_())])


def grown_to(lakehouse: Lakehouse, starts: Mapping[str, int], budget: int = MAX_VERSIONS_PER_BATCH,
             layout: Optional[Layout] = None, watch: Optional[GroupWatch] = None) -> dict[str, int]:
    """For each log (every one :meth:`CommitLogs.discover` finds, with ``layout`` if it is known, and
    those in ``starts``): the first version at or after its start (0 for a new log) that is not
    committed yet, at most ``budget`` versions on over all logs. With a ``watch`` (on object storage),
    the logs of the groups it lets sleep, and between two of its listings the logs of no group (the
    operators'), are not probed: they stay at their start this time (:mod:`coordinator.doorbells`).

    The budget is shared fairly: each log may first take an equal part, then the logs that had
    more take what the others left.

    Example::

        grown_to(Lakehouse("lakehouse"), {"groups/g/commit_log": 3})  # {'groups/g/commit_log': 5, ...}
    """
    keys = sorted(set(starts) | {ref.key for ref in CommitLogs(lakehouse).discover(layout, known=starts, watch=watch)})
    ends = {key: starts.get(key, 0) for key in keys}
    # One client for every log: building one per log cost each trigger (docs/performance-log.md#many-producer-groups).
    files = lakehouse.files
    if watch is not None:  # the groups it probes; the logs of no group when it listed
        keys = [key for key in keys
                if (group := CommitLogRef(key).group) in watch.probing or (group is None and watch.listed)]
    open_logs = _grown_at_all(files, keys, ends)
    first_probed = set(open_logs)
    remote = not lakehouse.is_local
    while budget > 0 and open_logs:
        share = max(1, budget // len(open_logs))
        round_logs = open_logs[:budget]  # each takes at most its share: together at most the budget

        def taken_by(key: str) -> int:
            known = 1 if key in first_probed else 0  # its first new version was found above
            return known + committed_run(files, key, ends[key] + known, share - known, remote=remote)

        # The logs side by side on object storage: busy logs' listings one after another were a round trip each.
        taken = dict(zip(round_logs, read_all(taken_by, round_logs, remote=remote)))
        first_probed.difference_update(round_logs)
        for key in round_logs:
            ends[key] += taken[key]
            budget -= taken[key]
        open_logs = [key for key in round_logs if taken[key] == share]
    if watch is not None:
        grown = {group: False for group in watch.probing}
        for key in keys:
            if (group := CommitLogRef(key).group) is not None and (ends[key] > starts.get(key, 0) or key not in starts):
                grown[group] = True
        watch.end_round(grown)
    return ends


#: The first round of :func:`committed_run`'s probes on object storage; each next round doubles, up to
#: :data:`_CONCURRENT_PROBES`.
_FIRST_PROBES = 4


def committed_run(files: FileStore, key: str, start: int, limit: int, remote: bool) -> int:
    """How many versions of log ``key`` from ``start`` on are committed, one after another, at most ``limit``.

    On S3, one listing of the log's commit files from ``start`` answers it (a request, whatever the
    versions found). On other object storage a probe is a round trip: the versions are probed in rounds of
    concurrent probes, each twice as many as the last, so a trigger that finds n new versions waits for
    about log2(n) rounds instead of n probes in a row. On a local disk, one by one.

    Example::

        committed_run(lakehouse.files, "groups/g/commit_log", start=5, limit=100, remote=True)  # e.g. 3
    """
    if not remote:
        found = 0
        while found < limit and committed(files, key, start + found):
            found += 1
        return found
    listed = _listed_run(files, key, start, limit)
    if listed is not None:
        return listed
    found, width = 0, _FIRST_PROBES
    with ThreadPoolExecutor(max_workers=_CONCURRENT_PROBES) as probes:
        while found < limit:
            versions = range(start + found, start + found + min(width, limit - found))
            present = list(probes.map(lambda version: committed(files, key, version), versions))
            run = present.index(False) if False in present else len(present)
            found += run
            if run < len(present):
                break
            width = min(width * 2, _CONCURRENT_PROBES)
    return found


def _listed_run(files: FileStore, key: str, start: int, limit: int) -> Optional[int]:
    """:func:`committed_run` from one listing of the log's ``_delta_log/`` that starts at version ``start``
    (checkpoints and other files listed beside the commits take room too: a short page is listed again
    from where it ended); ``None`` where the storage cannot start a listing there."""
    found, after = 0, f"{key}/{delta_log_file(start)[:-len('.json')]}"
    while found < limit:
        page = min(1000, 2 * (limit - found) + 8)
        keys = files.list_after(f"{key}/_delta_log", after, max_keys=page)
        if keys is None:
            return None if found == 0 else found
        for listed in keys:
            name = listed.rsplit("/", 1)[-1]
            if name.endswith(".json") and len(name) == 25 and name[:20].isdigit():
                if int(name[:20]) != start + found:
                    return found  # a gap: the next version is not committed yet
                found += 1
                if found == limit:
                    return found
        if len(keys) < page:
            return found  # the listing's end
        after = keys[-1]
    return found


#: Logs probed at once. On S3 a probe is a request, and against AWS S3 a round trip long enough that many
#: groups' probes one after the other would add seconds to every trigger (docs/performance-log.md#many-producer-groups).
_CONCURRENT_PROBES = 16


def _grown_at_all(files: FileStore, keys: list[str], ends: Mapping[str, int]) -> list[str]:
    """The logs of ``keys`` (in that order) whose version ``ends[log]`` exists: one probe each, concurrently."""
    if len(keys) <= 1:
        return [key for key in keys if committed(files, key, ends[key])]
    with ThreadPoolExecutor(max_workers=min(_CONCURRENT_PROBES, len(keys))) as probes:
        found = probes.map(lambda key: committed(files, key, ends[key]), keys)
        return [key for key, exists in zip(keys, found) if exists]


@dataclass(frozen=True)
class Segment:
    """What one micro-batch covers: for each commit log, versions ``starts[log]`` up to (not
    including) ``ends[log]``, and its clock (the wall clock when Spark planned it)."""

    starts: Mapping[str, int]
    ends: Mapping[str, int]
    clock_us: int = 0

    @property
    def versions(self) -> int:
        """How many commit-log versions the segment covers, over all logs."""
        return sum(end - self.starts.get(key, 0) for key, end in self.ends.items())

    def records(self, lakehouse: Lakehouse, read: Optional[Mapping[tuple[str, int], CommitRead]] = None) -> pa.Table:
        """The segment's records, in merged commit order, then its clock tick: what the checker's batch
        decides over. The commits in ``read`` (by log and version: :func:`read_commits`'s, made earlier)
        are not read again.

        Example::

            segment.records(Lakehouse("lakehouse")).column("commit_log")
        """
        read = read or {}
        wanted = {key: (self.starts.get(key, 0), end) for key, end in self.ends.items() if end > self.starts.get(key, 0)}
        missing = {key: [version for version in range(*span) if (key, version) not in read] for key, span in wanted.items()}
        commits = {**read, **_read_versions(lakehouse, missing)}
        in_order = heapq.merge(*([(commits[key, version].modified_ms, key, version) for version in range(*wanted[key])]
                                 for key in sorted(wanted)))
        parts, refusals, meta = [], [], []  # meta: per commit, (key, version, rank, modified µs, rows, sha256, bytes)
        for rank, (modified_ms, key, version) in enumerate(in_order):
            commit = commits[key, version]
            parts.append(commit.rows)
            refusals.extend(commit.refusals)
            meta.append((key, version, rank, modified_ms * 1000, commit.rows.num_rows, commit.sha256, commit.size))
        # One chunk per column, not one per commit: every step after takes, filters and groups it, at a
        # cost that grows with the chunks (docs/performance-log.md#the-records-in-one-chunk).
        return pa.concat_tables([_with_origin(parts, refusals, meta), tick(self.clock_us)]).combine_chunks()

    def to_json(self) -> str:
        """The segment as Spark carries it in a batch's row."""
        return json.dumps({"starts": dict(self.starts), "ends": dict(self.ends), "clock_us": self.clock_us},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Segment":
        raw = json.loads(text)
        return cls(raw["starts"], raw["ends"], raw["clock_us"])


class CommitRead(NamedTuple):
    """One commit-log version as read: when it was committed, the records it added, for each the
    reason it cannot be read, if any, and the sha256 and size of the commit file's bytes (``None``
    when there were none to read: gone, a directory, too large)."""

    modified_ms: int
    rows: pa.Table
    refusals: list[Optional[str]]
    sha256: Optional[str] = None
    size: Optional[int] = None


def read_commits(lakehouse: Lakehouse, starts: Mapping[str, int], ends: Mapping[str, int]) -> dict[tuple[str, int], CommitRead]:
    """Every commit of each log from ``starts[log]`` (0 for a log not in it) up to ``ends[log]``, by
    ``(log, version)``: what :meth:`Segment.records` reads, for a reader ahead of it (:mod:`.readahead`).

    Example::

        read_commits(lakehouse, {"groups/g/commit_log": 3}, {"groups/g/commit_log": 5})[("groups/g/commit_log", 3)].rows
    """
    return _read_versions(lakehouse, {key: list(range(starts.get(key, 0), end)) for key, end in ends.items()})


def _read_versions(lakehouse: Lakehouse, versions: Mapping[str, list[int]]) -> dict[tuple[str, int], CommitRead]:
    """Each of ``versions`` read: on object storage many at once (each commit's file, then its data
    files), on a local disk one after another (a thread per read costs more than the read)."""
    stores = {key: FileStore.at(lakehouse.key_path(key), lakehouse.storage) for key, wanted in versions.items() if wanted}
    wanted = [(key, version) for key in stores for version in versions[key]]
    return dict(zip(wanted, read_all(lambda read: _read_commit(stores[read[0]], read[1]), wanted,
                                     remote=not lakehouse.is_local, at_once=SEGMENT_READS)))


def _read_commit(store: FileStore, version: int) -> CommitRead:
    """One version of a commit log: its records, or, if its commit cannot be read, one record refusing
    it whole; a data file that cannot be read is one record refusing that file. What is refused costs
    only the log it is in, and comes out the same every time the version is read."""
    try:
        commit = store.read(delta_log_file(version), max_bytes=MAX_COMMIT_FILE_BYTES)
    except FileTooLargeError as error:
        return _refused(error.modified_ms, f"commit cannot be read: {error}")
    except IsADirectoryError:  # on a local disk a writer may put a directory where a commit belongs
        return _refused(0, f"commit {delta_log_file(version)} is a directory")
    if commit is None:  # gone since it was found (removed by hand): the time it was committed is gone too
        return _refused(0, f"commit {delta_log_file(version)} is gone")
    digest = {"sha256": commit_digest(commit.data), "size": len(commit.data)}
    try:
        actions = commit_actions(commit.data)
        files = added_files(actions)
    except CorruptInputError as error:
        return _refused(commit.modified_ms, f"commit cannot be read: {error}")._replace(**digest)
    unsupported = protocol_refusal(next((action["commitInfo"] for action in actions if "commitInfo" in action), None))
    if unsupported is not None:  # its records may mean what this checker cannot tell: refused whole, unread
        return _refused(commit.modified_ms, unsupported)._replace(**digest)
    parts, refusals = [], []
    for file in files:
        refusal = file.refusal
        if refusal is None:
            try:
                part = _data_file_rows(store, file.path)
            except CorruptInputError as error:
                refusal = str(error)
            else:
                parts.append(part)
                refusals.extend([None] * part.num_rows)
        if refusal is not None:
            parts.append(_null_record())
            refusals.append(refusal[:_REASON_CHARS])
    return CommitRead(commit.modified_ms, pa.concat_tables(parts) if parts else _NO_RECORDS,
                      refusals, **digest)


def _refused(modified_ms: int, reason: str) -> CommitRead:
    return CommitRead(modified_ms, _null_record(), [reason[:_REASON_CHARS]])


def _data_file_rows(store: FileStore, path: str) -> pa.Table:
    """The records of one data file (the commit log's columns), read within the bounds above;
    :class:`CorruptInputError` if it is missing, too large, not Parquet or not of the commit log's columns."""
    try:
        found = store.read(path, max_bytes=MAX_DATA_FILE_BYTES)
    except FileTooLargeError as error:
        raise CorruptInputError(f"data file too large: {error}") from None
    except IsADirectoryError:
        raise CorruptInputError(f"data file {path} is a directory") from None
    if found is None:
        raise CorruptInputError(f"data file {path} is missing")
    try:
        # A producer commits small files, often one per version: ParquetFile reads one at a
        # fraction of read_table's cost, which sets up a dataset for every file.
        file = pq.ParquetFile(pa.BufferReader(found.data))
        _within_bounds(file.metadata, path)
        present = set(file.schema_arrow.names)  # schema_arrow converts the footer's schema on every call
        missing = [name for name in COMMIT_LOG.column_names if name not in present]
        if missing:
            raise CorruptInputError(f"data file {path} lacks the commit log's column(s) {', '.join(missing)}")
        return _commit_log_rows(file.read(columns=COMMIT_LOG.column_names, use_threads=False))
    except CorruptInputError:
        raise
    # What reading untrusted bytes as Parquet may raise: none of it is the storage's failure.
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError, RecursionError) as error:
        raise CorruptInputError(f"data file {path} cannot be read as commit-log records: {error}") from None


def _within_bounds(metadata: pq.FileMetaData, path: str) -> None:
    """Refuse a file whose footer claims more rows or more bytes once decompressed than any commit
    of a producer holds (a decompression bomb), before any of its pages is read."""
    if metadata.num_rows > MAX_DATA_FILE_ROWS:
        raise CorruptInputError(f"data file {path} holds {metadata.num_rows} rows; at most {MAX_DATA_FILE_ROWS} are read")
    uncompressed = sum(metadata.row_group(index).total_byte_size for index in range(metadata.num_row_groups))
    if uncompressed > MAX_DATA_FILE_UNCOMPRESSED_BYTES:
        raise CorruptInputError(f"data file {path} decompresses to {uncompressed} bytes; at most "
                           f"{MAX_DATA_FILE_UNCOMPRESSED_BYTES} are read")


def _with_origin(parts: list[pa.Table], refusals: list[Optional[str]], meta: list[tuple]) -> pa.Table:
    """The commits' records with the columns saying where each came from: one value per commit, repeated
    for each of its records in C++ (run-end decoding), not in Python lists as long as the records."""
    if not parts:
        return RECORD_SCHEMA.empty_table()
    data = pa.concat_tables(parts)
    # A run per commit with records (a run's end must lie past the one before: a commit of none has no run).
    of_commits = [commit for commit in meta if commit[4]]
    run_ends = pc.cumulative_sum(pa.array([commit[4] for commit in of_commits], pa.int64()))

    def per_record(index: int, arrow_type: pa.DataType) -> pa.Array:
        values = pa.array([commit[index] for commit in of_commits], arrow_type)
        return pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(run_ends, values))

    for name, index, arrow_type in (("commit_log", 0, pa.string()), ("commit_version", 1, pa.int64()),
                                    ("commit_rank", 2, pa.int64()), ("commit_sha256", 5, pa.string()),
                                    ("commit_bytes", 6, pa.int64())):
        data = data.append_column(name, per_record(index, arrow_type))
    data = data.append_column("refusal", pa.array(refusals, pa.string()))
    stored = per_record(3, pa.int64())
    data = data.append_column("stored_timestamp", stored.cast(RECORD_SCHEMA.field("stored_timestamp").type))
    return data.append_column("is_heartbeat", pa.repeat(False, data.num_rows))


def _null_record() -> pa.Table:
    return pa.table({f.name: pa.nulls(1, f.type) for f in _COMMIT_LOG_SCHEMA}, schema=_COMMIT_LOG_SCHEMA)


def _commit_log_rows(data: pa.Table) -> pa.Table:
    return data if data.schema.equals(_COMMIT_LOG_SCHEMA) else data.cast(_COMMIT_LOG_SCHEMA)


def commits_read(records: pa.Table) -> pa.Table:
    """What the checker read of each commit among ``records`` (a batch's, :data:`RECORD_SCHEMA`): a row per
    commit and run of its records with one transaction id (a null id for records without one), with the commit
    file's sha256, size and commit time, in the columns of ``system/commits_read``. A transaction's records
    in a commit are one run as producers write them; a commit that holds them apart has a row per run, which
    readers take once. A commit whose file could not be read (gone, a directory, too large) has no row.

    Example::

        commits_read(segment.records(lakehouse)).column("sha256")
    """
    # Runs, not a grouping: grouping on the ids costs seconds for a backlog's batch, comparing neighbours does
    # not. Every record carries its commit's own values, so a run's row is the record that begins it, taken as
    # it is: one filter, no table of commits to look each run's commit up in.
    begins_run = pc.or_(_differs(records.column("commit_rank").combine_chunks()),
                        _differs(records.column("transaction_id").combine_chunks()))
    runs = kept(records.select(["commit_log", "commit_version", "transaction_id", "commit_sha256", "commit_bytes",
                                "stored_timestamp"]),  # in a backlog every record begins a run: no copy then
                pc.and_(pc.is_valid(records.column("commit_sha256")), begins_run))
    return runs.rename_columns(["commit_log", "commit_version", "transaction_id", "sha256", "bytes", "stored_timestamp"])


def _differs(values: pa.Array) -> pa.Array:
    """For each row, whether its value differs from the row before's (nulls equal each other; the first row: True)."""
    if len(values) == 0:
        return pa.array([], pa.bool_())
    later, earlier = values.slice(1), values.slice(0, len(values) - 1)
    same = pc.or_(pc.fill_null(pc.equal(later, earlier), False), pc.and_(pc.is_null(later), pc.is_null(earlier)))
    return pa.concat_arrays([pa.array([True]), pc.invert(same)])


def tick(clock_us: int) -> pa.Table:
    """One clock tick, shaped like a record: only ``stored_timestamp`` and ``is_heartbeat`` are set."""
    columns = {f.name: pa.nulls(1, f.type) for f in RECORD_SCHEMA}
    columns["stored_timestamp"] = pa.array([clock_us], pa.int64()).cast(RECORD_SCHEMA.field("stored_timestamp").type)
    columns["is_heartbeat"] = pa.array([True])
    return pa.table(columns, schema=RECORD_SCHEMA)
