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

import json
import re
from typing import NamedTuple, Optional
from urllib.parse import unquote

from coordinator.exceptions import CorruptInputError

__all__ = ["DATA_PATH_PATTERN", "MAX_COMMIT_FILE_BYTES", "AddedFile", "added_files", "commit_actions"]

#: The largest commit file read. A producer's commit is one ``add`` and its commit info (well under a
#: kilobyte); a compaction's lists every file it replaces. A larger one is refused unread.
MAX_COMMIT_FILE_BYTES = 16 * 1024 * 1024
#: A data file an ``add`` may name, decoded once: ``/``-separated names of letters, digits, ``_``, ``-``,
#: ``=`` and ``.`` (what delta-rs and Spark write), none of them ``.`` or ``..``.
DATA_PATH_PATTERN = r"[A-Za-z0-9_=.-]+(/[A-Za-z0-9_=.-]+)*"

_DATA_PATH = re.compile(DATA_PATH_PATTERN)
_REASON_CHARS = 512


class AddedFile(NamedTuple):
    """A data file a commit added with new data: its path in the table's directory, or the reason it
    cannot be read (``path`` is then ``None``)."""

    path: Optional[str]
    refusal: Optional[str] = None


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
        actions.append(action)
    return actions


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
            files.append(AddedFile(path))
        else:
            files.append(AddedFile(None, _short(f"data file outside the commit log's directory: {add['path']}")))
    return files


def _short(text: object) -> str:
    return str(text)[:_REASON_CHARS]
