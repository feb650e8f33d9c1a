"""Delta checkpoints carried forward from the previous checkpoint and the commits since.

A checkpoint is a table's state at a version in one Parquet file: its protocol and metadata, the
files it holds (``add``), the files removed within their retention (``remove``) and each
application's last transaction (``txn``). delta-rs's ``create_checkpoint`` rebuilds the state
from scratch: it loads the previous checkpoint and replays every commit since on a runtime of
several hundred threads, then writes the whole state. A busy producer checkpoints its commit log
often, and on two cores that CPU made the checker's slowest batches
(docs/performance-log.md#figures-quoted-elsewhere-before). The state changes little between two checkpoints: this module
takes the previous checkpoint's rows, drops the files removed since and the tombstones and
transactions superseded or expired, adds the commits' own actions, and writes the result in the
previous checkpoint's schema, all in Arrow: a fraction of the CPU for the same checkpoint, on the
calling thread. It reads the commits since the previous checkpoint (side by side on object storage) unless
its caller has read them already.

What it cannot carry forward it leaves to delta-rs: a table with no checkpoint yet, a checkpoint
in several parts, one whose schema asks for parsed statistics or partition values, or commits
since that change anything but files and application transactions (a protocol, metadata or
domain change, say).

Example::

    write_delta_checkpoint("lakehouse/groups/order_group/commit_log", 2000)
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Mapping, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.lakehouse.delta import DEFAULT_DELETED_FILE_RETENTION, open_table, parse_interval
from coordinator.lakehouse.deltalog import commit_actions
from coordinator.lakehouse.paths import delta_checkpoint_file, delta_log_file
from coordinator.lakehouse.slots import parquet_file
from coordinator.storage import FileStore, read_all

__all__ = ["last_delta_checkpoint", "write_delta_checkpoint"]

_log = logging.getLogger("coordinator.lakehouse.checkpoints")

_LAST_CHECKPOINT = "_delta_log/_last_checkpoint"
#: The actions a carried-forward checkpoint takes in from the commits since the previous one.
_FILE_ACTIONS = {"add", "remove", "txn"}
#: Actions no checkpoint holds: they are skipped.
_NOT_CHECKPOINTED = {"commitInfo", "cdc"}
#: Checkpoint columns this module fills; a checkpoint with any other kind of row is rebuilt by delta-rs.
_CARRIED_COLUMNS = {"add", "remove", "txn", "metaData", "protocol", "domainMetadata", "sidecar"}
#: Struct fields derived from others (``delta.checkpoint.writeStatsAsStruct``), which this module does not derive.
_DERIVED_FIELDS = {"stats_parsed", "partitionValues_parsed"}


def write_delta_checkpoint(path: str, version: int, storage: Optional[Mapping[str, str]] = None,
                     now_ms: Optional[int] = None, commits: Optional[Mapping[int, bytes]] = None) -> bool:
    """Write the checkpoint of the Delta table at ``path`` (a directory, or an object-store URI reached
    with ``storage``) at ``version``: carried forward from the previous one when it can be (see the
    module's docstring), through delta-rs otherwise. Tombstones older than the table's
    ``delta.deletedFileRetentionDuration`` at ``now_ms`` (default: now) are left out. ``commits``: commit
    files already read, by version (:func:`~coordinator.lakehouse.deltalog.check_commits`'), not read
    again. Return whether it was carried forward. A table whose newest checkpoint is at ``version`` or
    later is left alone.

    Example::

        write_delta_checkpoint("lakehouse/system/op", 300)   # True: from the checkpoint at 200
    """
    files = FileStore.at(path, storage)
    previous = last_delta_checkpoint(files)
    if previous is not None and previous >= version:
        return False
    state = _carried_forward(files, previous, version, time.time() * 1000 if now_ms is None else now_ms, commits or {})
    if state is None:
        open_table(path, version=version, storage=storage).create_checkpoint()
        return False
    content = parquet_file(state)
    files.put(delta_checkpoint_file(version), content)
    newest = last_delta_checkpoint(files)
    if newest is None or newest < version:  # never point readers back to an older checkpoint
        files.put(_LAST_CHECKPOINT, json.dumps({
            "version": version, "size": state.num_rows, "sizeInBytes": len(content),
            "numOfAddFiles": state.num_rows - state.column("add").null_count}).encode())
    return True


def last_delta_checkpoint(files: FileStore, table: str = "") -> Optional[int]:
    """The version of the table's newest checkpoint, as its ``_delta_log/_last_checkpoint`` records it
    (``files`` at the table's root, or ``table`` its key under ``files``); ``None`` if it records none or cannot
    be read.

    Example::

        last_delta_checkpoint(FileStore.at("lakehouse/system/op"))   # 200
        last_delta_checkpoint(Lakehouse("lakehouse").files, "topics/ORDER_TOPIC")   # 1000
    """
    pointer = files.read(f"{table.rstrip('/')}/{_LAST_CHECKPOINT}" if table else _LAST_CHECKPOINT)
    if pointer is None:
        return None
    try:
        return int(json.loads(pointer.data)["version"])
    except (ValueError, KeyError, TypeError):
        return None


def _carried_forward(files: FileStore, previous: Optional[int], version: int, now_ms: float,
                     read: Mapping[int, bytes]) -> Optional[pa.Table]:
    """The state at ``version`` from the checkpoint at ``previous`` and the commits since; ``None`` where
    delta-rs must rebuild it."""
    if previous is None:
        return None
    stored = files.read(delta_checkpoint_file(previous))  # absent if in several parts
    if stored is None:
        return None
    # On this thread alone: pyarrow's threads would release the bytes Python owns after the read returned, and
    # one released as the process exits aborts it (coordinator.lakehouse.reads.query_snapshot).
    state = pq.ParquetFile(pa.BufferReader(stored.data)).read(use_threads=False)
    if not _can_carry(state):
        return None
    changes = _changes(files, previous, version, read)
    if changes is None:
        return None
    added, removed, transactions = changes
    retention = _tombstone_retention(state)
    if retention is None:
        return None
    expired_before_ms = now_ms - retention.total_seconds() * 1000
    superseded = pa.array(list(added) + list(removed), pa.string())
    kept = pc.invert(pc.fill_null(pc.or_(
        pc.is_in(pc.struct_field(state["add"], "path"), superseded),
        pc.or_(pc.is_in(pc.struct_field(state["remove"], "path"), superseded),
               pc.is_in(pc.struct_field(state["txn"], "appId"), pa.array(list(transactions), pa.string()))),
    ), False))
    tombstone_times = pc.struct_field(state["remove"], "deletionTimestamp")
    kept = pc.and_(kept, pc.invert(pc.fill_null(pc.less(tombstone_times, int(expired_before_ms)), False)))
    fresh_removes = [action for action in removed.values() if action.get("deletionTimestamp", now_ms) >= expired_before_ms]
    new_rows = ([{"add": action} for action in added.values()] + [{"remove": action} for action in fresh_removes]
                + [{"txn": action} for action in transactions.values()])
    return pa.concat_tables([state.filter(kept), pa.Table.from_pylist(new_rows, schema=state.schema)])


def _can_carry(state: pa.Table) -> bool:
    """Whether every row of checkpoint ``state`` is of a kind this module carries forward, and no column asks
    for values derived from others."""
    for field in state.schema:
        if field.name not in _CARRIED_COLUMNS and state.column(field.name).null_count < state.num_rows:
            return False
        if pa.types.is_struct(field.type) and _DERIVED_FIELDS & {child.name for child in field.type}:
            return False
    sidecars = state.column("sidecar") if "sidecar" in state.column_names else None
    return sidecars is None or sidecars.null_count == state.num_rows


def _changes(files: FileStore, previous: int, version: int, read: Mapping[int, bytes]) -> Optional[tuple[dict, dict, dict]]:
    """The files added and removed (by path) and the application transactions (by id) of the commits after
    ``previous`` up to ``version`` (those in ``read`` not read again), the later action winning; ``None`` if
    one holds anything else."""
    added: dict[str, dict] = {}
    removed: dict[str, dict] = {}
    transactions: dict[str, dict] = {}
    versions = range(previous + 1, version + 1)
    # Side by side on object storage: a busy commit log's checkpoint follows a thousand commits.
    def commit_of(commit_version: int) -> Optional[bytes]:
        if commit_version in read:
            return read[commit_version]
        found = files.read(delta_log_file(commit_version))
        return None if found is None else found.data

    commits = read_all(commit_of, versions, remote=files.remote)
    for commit_version, commit in zip(versions, commits):
        if commit is None:
            return None
        for action in commit_actions(commit):
            kind = next(iter(action))
            if kind in _NOT_CHECKPOINTED:
                continue
            if kind not in _FILE_ACTIONS or len(action) != 1:
                _log.info("version %d holds a %s action: delta-rs writes this checkpoint", commit_version, kind)
                return None
            body = action[kind]
            if kind == "add":
                removed.pop(body["path"], None)
                added[body["path"]] = body
            elif kind == "remove":
                added.pop(body["path"], None)
                removed[body["path"]] = body
            else:
                transactions[body["appId"]] = body
    return added, removed, transactions


def _tombstone_retention(state: pa.Table) -> Optional[timedelta]:
    """The table's ``delta.deletedFileRetentionDuration`` from the checkpoint's metadata row; ``None`` if it
    cannot be read."""
    metadata = state.filter(pc.is_valid(state["metaData"])).column("metaData").to_pylist()
    if len(metadata) != 1:
        return None
    configuration = dict(metadata[0].get("configuration") or [])
    value = configuration.get("delta.deletedFileRetentionDuration")
    return DEFAULT_DELETED_FILE_RETENTION if value is None else parse_interval(value)
