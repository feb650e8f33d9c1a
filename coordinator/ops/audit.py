"""One transaction's whole life, from every table that mentions it, in time order (no JVM).

Shared by ``txcoord inspect TRANSACTION_ID`` and ``notebooks/transaction_audit.ipynb``.
The steps, and where each comes from:

===================  ==========================  ===========================================
step                 table                       time
===================  ==========================  ===========================================
half sent            ``groups/<G>/commit_log``   the message's born timestamp
half stored          ``system/half``             when the half entered the commit log
end request          the group's or operators'   the END's born timestamp (state, check id)
                     ``commit_log``
check requested      ``system/check_requests``   the checker's batch clock
resolved             ``system/op``               when the deciding END entered the commit log
delivered            ``topics/<TOPIC>``          end of the delivering batch (``system/metrics``),
                                                 else when the commit entered the commit log
discarded            ``system/discarded``        the checker's batch clock
rejected             ``system/rejected``         when the refused record entered the commit log
commit read          ``system/commits_read``     when the commit entered its log: the sha256 the
                                                 checker read of each commit holding the
                                                 transaction's records, compared with the file now
commit rewritten     ``system/commits_read``     the same, for a commit whose bytes changed since
                                                 the checker read it (its rows shown may not be
                                                 what the checker decided on)
log unreadable       a group's ``commit_log``    now: the log could not be read (its other
                                                 steps come from the checker's tables)
===================  ==========================  ===========================================

Example::

    for event in transaction_timeline("lakehouse", "3f2a…"):
        print(event.at, event.step, event.detail)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Union

import pyarrow.compute as pc

from coordinator.commit_logs import CommitLogs
from coordinator.exceptions import AccessDeniedError, FileTooLargeError, one_line
from coordinator.lakehouse import Lakehouse, delta_log_file, require_lakehouse, topic_names
from coordinator.lakehouse.deltalog import MAX_COMMIT_FILE_BYTES, check_commits, commit_digest
from coordinator.ops.status import read_metrics
from coordinator.protocol import (OPERATOR_PROPERTY, OPERATOR_REASON_PROPERTY, Outcome, is_operators_check,
                                  RecordKind)
from coordinator.tables import CHECK_REQUESTS, COMMITS_READ, DISCARDED, HALF, OP, REJECTED, TableDef

__all__ = ["Event", "PENDING", "STEPS", "outcome", "transaction_timeline"]

#: What :func:`outcome` says of a transaction with no op row yet.
PENDING = "PENDING"

#: The steps of a transaction's life, in the order they happen (ties in time keep this order).
STEPS = ("half sent", "half stored", "end request", "commit read", "commit rewritten", "check requested", "resolved",
         "delivered", "discarded", "rejected", "log unreadable")


@dataclass(frozen=True)
class Event:
    """One step of a transaction's life: when, what, which table says so, and the particulars."""

    at: dt.datetime
    step: str
    table: str
    detail: str

    def to_dict(self) -> dict:
        """JSON-ready (the time in ISO 8601)."""
        return asdict(self) | {"at": self.at.isoformat()}


def _commit_log_rows(lakehouse: Lakehouse, rows: Callable[[str, list[str]], list[dict]],
                     transaction_id: str) -> tuple[list[tuple[str, dict]], dict[str, str]]:
    """The transaction's records in the commit logs, each with its log: its group's log (every group's
    while the checker has not taken it in), the operators' and the retired shared one; and the logs
    that could not be read, with why (a group writes its own log: it may hold anything)."""
    groups = {r["producer_group"] for r in rows(HALF.name, ["producer_group"])}
    logs = CommitLogs(lakehouse).discover()
    if groups:
        logs = [ref for ref in logs if ref.group is None or ref.group in groups]
    columns = ["kind", "msg_id", "message_index", "message_count", "topic", "state", "check_id", "born_timestamp",
               "producer_group", "properties"]
    found, unreadable = [], {}
    for ref in logs:
        try:
            check_commits(lakehouse.files, ref.key)  # bytes delta-rs would choke on are refused first
            found.extend((ref.key, r) for r in rows(ref.key, columns))
        except Exception as error:  # this log's bytes, whatever they are, must not hide the others' records
            unreadable[ref.key] = one_line(error)
    return found, unreadable


def transaction_timeline(lakehouse: Union[str, Lakehouse], transaction_id: str) -> list[Event]:
    """Every recorded step of ``transaction_id``, oldest first; ``[]`` if no table knows it.

    Raises :class:`~coordinator.lakehouse.LakehouseNotFoundError` if there is no lakehouse.

    Example::

        [e.step for e in transaction_timeline("lakehouse", txn)]
        # ['half sent', 'half stored', 'end request', 'resolved', 'delivered']
    """
    lakehouse = require_lakehouse(lakehouse)

    def rows(table: Union[TableDef, str], columns: list[str]) -> list[dict]:
        if not lakehouse.exists(table):
            return []
        return lakehouse.read(table, columns, pc.field("transaction_id") == transaction_id).to_pylist()

    events: list[Event] = []
    records, unreadable = _commit_log_rows(lakehouse, rows, transaction_id)
    now = dt.datetime.now(dt.timezone.utc)
    events.extend(Event(now, "log unreadable", log, reason) for log, reason in sorted(unreadable.items()))
    for log, r in records:
        if r["kind"] == RecordKind.HALF:
            events.append(Event(r["born_timestamp"], "half sent", log,
                                f"message {r['message_index'] + 1}/{r['message_count']} to {r['topic']} "
                                f"(msg_id {r['msg_id']}, group {r['producer_group']})"))
        else:
            properties = dict(r["properties"] or ())
            if is_operators_check(r["check_id"]):
                origin = (f"from operator {properties.get(OPERATOR_PROPERTY)} ({r['check_id']}): "
                          f"{properties.get(OPERATOR_REASON_PROPERTY)}")
            else:
                origin = f"answering check {r['check_id']}" if r["check_id"] else "from the producer"
            events.append(Event(r["born_timestamp"], "end request", log, f"{r['state']} {origin}"))
    for r in rows(HALF, ["queue_offset", "topic", "stored_timestamp", "immunity_ms", "batch_id"]):
        events.append(Event(r["stored_timestamp"], "half stored", HALF.name,
                            f"queue offset {r['queue_offset']} ({r['topic']}), immunity {r['immunity_ms']} ms, batch {r['batch_id']}"))
    for r in rows(CHECK_REQUESTS, ["check_id", "check_times", "requested_at", "batch_id"]):
        events.append(Event(r["requested_at"], "check requested", CHECK_REQUESTS.name,
                            f"check {r['check_times']} ({r['check_id']}), batch {r['batch_id']}"))
    for r in rows(OP, ["half_offset", "outcome", "resolved_at", "check_id", "batch_id"]):
        if is_operators_check(r["check_id"]):
            by = f"by the operator ({r['check_id']})"
        elif r["check_id"]:
            by = f"by check {r['check_id']}"
        else:
            by = "by the producer" if r["outcome"] != Outcome.DISCARD else "by the checker"
        events.append(Event(r["resolved_at"], "resolved", OP.name,
                            f"{r['outcome']} {by} (half offset {r['half_offset']}), batch {r['batch_id']}"))
    finished = _batch_end_times(lakehouse)
    for topic in topic_names(lakehouse):
        for r in rows(f"topics/{topic}", ["msg_id", "queue_offset", "commit_timestamp", "batch_id"]):
            events.append(Event(finished.get(r["batch_id"], r["commit_timestamp"]), "delivered", f"topics/{topic}",
                                f"msg_id {r['msg_id']} (queue offset {r['queue_offset']}), batch {r['batch_id']}"))
    for r in rows(DISCARDED, ["half_offset", "check_times", "reason", "discarded_at", "batch_id"]):
        events.append(Event(r["discarded_at"], "discarded", DISCARDED.name,
                            f"{r['reason']} ({r['check_times']} check(s), half offset {r['half_offset']}), batch {r['batch_id']}"))
    for r in rows(REJECTED, ["kind", "state", "check_id", "reason", "stored_timestamp", "batch_id"]):
        what = r["kind"] if r["state"] is None else f"{r['kind']} {r['state']}"
        events.append(Event(r["stored_timestamp"], "rejected", REJECTED.name, f"{what} refused: {r['reason']}, batch {r['batch_id']}"))
    events.extend(_commits_compared(lakehouse, rows(COMMITS_READ, ["commit_log", "commit_version", "sha256", "bytes",
                                                                   "stored_timestamp", "batch_id"])))
    return sorted(events, key=lambda e: (e.at, STEPS.index(e.step)))


def _commits_compared(lakehouse: Lakehouse, read: list[dict]) -> list[Event]:
    """For each commit the checker read the transaction's records in (``read``: its ``system/commits_read``
    rows), what it read, compared with the commit file as it is now: ``commit rewritten`` if the bytes differ."""
    events, seen = [], set()
    for r in read:
        commit = (r["commit_log"], r["commit_version"])
        if commit in seen:  # shown once, should two batches' rows name it
            continue
        seen.add(commit)
        name, digest = f"commit {r['commit_version']} of {r['commit_log']}", _short(r["sha256"])
        rewritten, now = _compared(lakehouse, *commit, r["sha256"], r["bytes"])
        if rewritten:
            events.append(Event(r["stored_timestamp"], "commit rewritten", COMMITS_READ.name,
                                f"{name} REWRITTEN since the checker read it (sha256 {digest} read, {now}), "
                                f"batch {r['batch_id']}"))
        else:
            events.append(Event(r["stored_timestamp"], "commit read", COMMITS_READ.name,
                                f"{name} {now} (sha256 {digest}, {r['bytes']} bytes), batch {r['batch_id']}"))
    return events


def _compared(lakehouse: Lakehouse, log: str, version: int, sha256: str, size: int) -> tuple[bool, str]:
    """Whether commit ``version`` of ``log`` is no longer the file the checker read (``sha256``, ``size``
    bytes), and what it is now."""
    try:
        found = lakehouse.files.read(f"{log}/{delta_log_file(version)}", max_bytes=MAX_COMMIT_FILE_BYTES)
    except FileTooLargeError:  # larger than any commit the checker reads: not the one it read
        return True, f"now over {MAX_COMMIT_FILE_BYTES} bytes"
    except IsADirectoryError:
        return True, "now a directory"
    except AccessDeniedError:
        return False, "as the checker read it; not compared now: this account may not read that log"
    except Exception as error:  # the storage's failure, or whatever the log holds: the timeline goes on
        return False, f"as the checker read it; not compared now: {type(error).__name__}"
    if found is None:
        return False, "as the checker read it; its file is gone since (maintenance removes commits the checker is done with)"
    now = commit_digest(found.data)
    if now != sha256:
        return True, f"{_short(now)} now; {size} bytes read, {len(found.data)} now"
    return False, "as the checker read it, unchanged"


def _short(digest: Optional[str]) -> str:
    """A sha256 as shown: its first 16 hex digits (64 bits tell any two commits apart)."""
    return f"{digest[:16]}…" if digest else "(none)"


def outcome(events: list[Event]) -> str:
    """How the transaction ended: ``COMMIT``, ``ROLLBACK``, ``DISCARD``, or ``PENDING`` (no op row yet).
    A discarded transaction that an operator committed afterwards ended ``COMMIT``.

    Example::

        outcome(transaction_timeline("lakehouse", txn))  # 'COMMIT'
    """
    resolved = [e.detail.split()[0] for e in events if e.step == "resolved"]
    if Outcome.COMMIT in resolved:  # a discarded transaction committed since has both
        return Outcome.COMMIT
    return resolved[0] if resolved else PENDING


def _batch_end_times(lakehouse: Lakehouse) -> dict[int, dt.datetime]:
    metrics = read_metrics(lakehouse, ["batch_id", "finished_at"])
    return dict(zip(metrics.column("batch_id").to_pylist(), metrics.column("finished_at").to_pylist()))
