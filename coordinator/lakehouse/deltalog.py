"""Reading a Delta commit (``_delta_log/<version>.json``) that somebody else wrote: untrusted bytes.

A commit is newline-delimited JSON, one action per line (the Delta protocol). What a writer put in
a log it may write is held to the protocol's shape here, each rule with a reason: a commit that is
too large, not UTF-8 JSON objects, or whose ``add`` lacks a path is :class:`CorruptInputError`
(the whole version is refused, for that log alone); an ``add`` whose path is not a plain file of the
table's own directory (``..``, an absolute URI, an encoding that still holds ``%`` once decoded, a
character outside :data:`DATA_PATH_PATTERN`) is refused by itself.

Example::

    actions = commit_actions(store.read(delta_log_file(3), max_bytes=MAX_COMMIT_FILE_BYTES).data)
    [(file.path, file.refusal) for file in added_files(actions)]   # [('part-0.parquet', None)]
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import NamedTuple, Optional
from urllib.parse import unquote

from coordinator.exceptions import CorruptInputError, FileTooLargeError
from coordinator.storage import FileStore, read_all

__all__ = ["DATA_PATH_PATTERN", "MAX_ACTION_DEPTH", "MAX_COMMIT_FILE_BYTES", "AddedFile", "added_files", "added_statistics",
           "check_commits", "commit_actions", "commit_digest", "commit_record_count", "file_record_count",
           "parsed_statistics"]

#: The largest commit file read. A producer's commit is one ``add`` and its commit info (well under a
#: kilobyte); a compaction's lists every file it replaces. A larger one is refused unread.
MAX_COMMIT_FILE_BYTES = 16 * 1024 * 1024
#: A data file an ``add`` may name, decoded once: ``/``-separated names of letters, digits, ``_``, ``-``,
#: ``=`` and ``.`` (what delta-rs and Spark write), none of them ``.`` or ``..``.
DATA_PATH_PATTERN = r"[A-Za-z0-9_=.-]+(/[A-Za-z0-9_=.-]+)*"

#: How deeply an action may nest (a Delta action nests four or five levels). delta-rs's parser overflows its
#: stack on a line nested some thousands deep and the process dies of SIGSEGV: such a log is refused before
#: any delta-rs reader opens it (:func:`check_commits`).
MAX_ACTION_DEPTH = 32

_DATA_PATH = re.compile(DATA_PATH_PATTERN)
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet")
_COMMIT = re.compile(r"(\d{20})\.json")
_REASON_CHARS = 512


class AddedFile(NamedTuple):
    """A data file a commit added with new data: its path in the table's directory, or the reason it
    cannot be read (``path`` is then ``None``)."""

    path: Optional[str]
    refusal: Optional[str] = None
    #: Its ``size`` and ``tags`` as the add action gives them (untrusted: checked by whoever uses them).
    size: object = None
    tags: object = None


def commit_actions(data: bytes) -> list[dict]:
    """The actions of one commit file, in order; :class:`CorruptInputError` if it is not one JSON
    object a line (blank lines are skipped).

    Example::

        commit_actions(b'{"commitInfo": {}}\\n{"add": {"path": "a.parquet"}}')  # [{'commitInfo': {}}, {...}]
    """
    actions = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except (ValueError, RecursionError) as error:  # RecursionError: nested too deep to parse
            raise CorruptInputError(f"line {number} is not JSON: {_short(error)}") from None
        if not isinstance(action, dict):
            raise CorruptInputError(f"line {number} is not a JSON object")
        if _may_nest_deeper(line) and _depth(action) > MAX_ACTION_DEPTH:
            raise CorruptInputError(f"line {number} nests deeper than {MAX_ACTION_DEPTH} levels")
        actions.append(action)
    return actions


def commit_digest(data: bytes) -> str:
    """The sha256 of a commit file's exact bytes, in hex: what the checker records of each commit it reads
    (``system/commits_read``), and what ``txcoord inspect`` compares with the file as it is now.

    Example::

        commit_digest(b'{"commitInfo": {}}')  # 'bab339d8…', 64 hex digits
    """
    return hashlib.sha256(data).hexdigest()


def check_commits(files: FileStore, table: str) -> dict[int, bytes]:
    """Refuse, before a delta-rs reader opens the Delta table at key ``table`` of ``files``, a table whose log
    a delta-rs reader would choke on: :class:`CorruptInputError` naming the first commit since the latest
    checkpoint that is not one (too large, not JSON objects, nested too deep). What delta-rs reads of a
    table is its latest checkpoint and the commits after it; those are read here too (at once on object
    storage), and returned by version, for whoever reads them next (a checkpoint).

    Example::

        check_commits(lakehouse.files, "groups/order_group/commit_log")   # {1201: b'{"add": ...', ...} or CorruptInputError
    """
    names = [key.rsplit("/", 1)[-1] for key in files.list(f"{table}/_delta_log")]
    checkpoints = [int(match.group(1)) for match in map(_CHECKPOINT.fullmatch, names) if match]
    since = max(checkpoints, default=-1)
    commits = sorted(version for version in (int(m.group(1)) for m in map(_COMMIT.fullmatch, names) if m)
                     if version > since)

    def check(version: int) -> Optional[bytes]:
        key = f"{table}/_delta_log/{version:020d}.json"
        try:
            found = files.read(key, max_bytes=MAX_COMMIT_FILE_BYTES)
        except FileTooLargeError as error:
            raise CorruptInputError(f"version {version}: {error}") from None
        if found is None:
            return None
        try:
            commit_actions(found.data)
        except CorruptInputError as error:
            raise CorruptInputError(f"version {version}: {error}") from None
        return found.data

    return {version: data for version, data in zip(commits, read_all(check, commits, remote=files.remote))
            if data is not None}


def _may_nest_deeper(line: bytes) -> bool:
    """Whether a JSON line could nest deeper than :data:`MAX_ACTION_DEPTH`: each level opens a bracket, so a line
    of fewer opening brackets (those in strings counted too) cannot, and its parsed actions need no walk."""
    return line.count(b"{") + line.count(b"[") > MAX_ACTION_DEPTH


def _depth(value: object) -> int:
    """How deeply ``value`` (parsed JSON) nests: 1 for a flat object."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in value.values())
        elif isinstance(value, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in value)
    return deepest


def added_files(actions: list[dict]) -> list[AddedFile]:
    """The data files ``actions`` added with new data (``dataChange`` not false: a compaction's files
    are skipped, as Delta's change feed skips them), each with its path or the reason it is refused;
    :class:`CorruptInputError` for an ``add`` that is not an object with a string ``path``.

    Example::

        added_files([{"add": {"path": "../other/x.parquet"}}])[0].refusal   # 'data file outside ...'
    """
    files = []
    for action in actions:
        add = action.get("add")
        if add is None:
            continue
        if not isinstance(add, dict) or not isinstance(add.get("path"), str):
            raise CorruptInputError("an add action without a string path")
        if add.get("dataChange", True) is False:
            continue
        path = unquote(add["path"])
        if _DATA_PATH.fullmatch(path) and not {".", ".."} & set(path.split("/")):
            files.append(AddedFile(path, size=add.get("size"), tags=add.get("tags")))
        else:
            files.append(AddedFile(None, _short(f"data file outside the commit log's directory: {add['path']}")))
    return files


def added_statistics(actions: list[dict]) -> list[dict]:
    """The statistics (``numRecords``, ``minValues``, ...) of each data file ``actions`` added with new data
    (``dataChange`` not false), each as its ``add`` gives them; a file without them, or whose are not a JSON
    object, gives none (statistics are estimates, never a refusal).

    Example::

        added_statistics([{"add": {"path": "a.parquet", "stats": "{\\"numRecords\\": 3}"}}])  # [{'numRecords': 3}]
    """
    found = []
    for action in actions:
        add = action.get("add")
        if isinstance(add, dict) and add.get("dataChange", True) is not False:
            stats = parsed_statistics(add.get("stats"))
            if stats is not None:
                found.append(stats)
    return found


def parsed_statistics(text: object) -> Optional[dict]:
    """A data file's statistics (an ``add``'s ``stats``, in a commit or a checkpoint) as a dict; ``None`` if
    ``text`` is not a JSON object.

    Example::

        parsed_statistics('{"numRecords": 3}')  # {'numRecords': 3}
    """
    if not isinstance(text, str):
        return None
    try:
        stats = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return stats if isinstance(stats, dict) else None


def file_record_count(stats: dict) -> int:
    """How many rows a data file holds by its statistics (``numRecords``); 0 when they do not say.

    Example::

        file_record_count({"numRecords": 3})  # 3
    """
    records = stats.get("numRecords")
    return records if isinstance(records, int) and not isinstance(records, bool) and records > 0 else 0


def commit_record_count(data: bytes) -> int:
    """How many rows the data files a commit's ``data`` added hold, by their statistics (``numRecords``): 0 for
    a file without them, and for a commit that is not one (the count is an estimate, never a refusal).

    Example::

        commit_record_count(b'{"add": {"path": "a.parquet", "stats": "{\\"numRecords\\": 3}"}}')  # 3
    """
    try:
        actions = commit_actions(data)
    except CorruptInputError:
        return 0
    return sum(map(file_record_count, added_statistics(actions)))


def _short(text: object) -> str:
    return str(text)[:_REASON_CHARS]
