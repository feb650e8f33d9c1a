"""A lakehouse's health at a glance, read without a JVM (delta-rs and two small files).

What ``txcoord status`` prints and ``notebooks/health.ipynb`` plots: pending
transactions and their ages, checks issued and due, discards, rejections, whether
a live checker holds the lakehouse's lease, its last recorded batch (``system/metrics``)
and how far it lags behind the commit logs.

Example::

    from coordinator.ops.status import read_status
    status = read_status(CoordinatorConfig.load("conf/coordinator.toml"))
    status.pending_transactions, status.checker_alive, status.lag_versions
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Optional, Union

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.commit_logs import CommitLogs
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import lease_record, standby_checkers
from coordinator.control.processes import process_gone
from coordinator.control.progress import CheckerProgress
from coordinator.lakehouse import LEASE_KEY, Lakehouse, require_lakehouse, topic_names
from coordinator.ops.discarded import committed_since
from coordinator.ops.pending import pending_transactions
from coordinator.tables import CHECK_REQUESTS, DISCARDED, METRICS, REJECTED

__all__ = ["Status", "delivery_latencies", "last_batch", "read_lease", "read_metrics", "read_status"]

UTC = dt.timezone.utc


@dataclass(frozen=True)
class Status:
    """The lakehouse's state at ``generated_at``. Ages and lags are in seconds."""

    lakehouse: str
    generated_at: dt.datetime
    pending_transactions: int
    oldest_pending_age_s: Optional[float]
    checks_due: int
    checks_issued: int
    discarded: int  # transactions discarded, including those committed since by an operator
    recovered: int  # discarded transactions an operator committed since
    rejected: int
    rejected_by_reason: dict[str, int]
    checker_alive: bool
    checker_holder: Optional[str]  # "host pid N", from the lease
    checker_process_gone: bool  # the lease names a process of this host that no longer runs
    standby_checkers: list[str]  # "host pid N" of each checker standing by to take the lease over
    lease_renewed_age_s: Optional[float]
    last_batch_id: Optional[int]
    last_batch_age_s: Optional[float]
    last_batch_duration_ms: Optional[int]
    commit_log_versions: int  # versions written to the commit logs, over every log
    lag_versions: Optional[int]  # of those, the ones the checker has not read (None: it never recorded a batch)
    lag_s: Optional[float]  # age of the oldest of those versions
    pending_ages_s: list[float] = field(repr=False, default_factory=list)

    def to_dict(self) -> dict:
        """Everything but the per-transaction ages, JSON-ready (times in ISO 8601).

        Example::

            json.dumps(status.to_dict())
        """
        values = asdict(self)
        values.pop("pending_ages_s")
        values["generated_at"] = self.generated_at.isoformat()
        return values


def read_status(config: CoordinatorConfig, now: Optional[dt.datetime] = None) -> Status:
    """Read the lakehouse of ``config`` and summarise it; timing rules (checks due) are ``config``'s.

    Raises :class:`~coordinator.lakehouse.LakehouseNotFoundError` if there is no ``system/half``.

    Example::

        read_status(config).checks_due  # pending transactions whose next check (or discard) is due now
    """
    lakehouse = require_lakehouse(Lakehouse.of(config))
    now = now or dt.datetime.now(UTC)
    pending = pending_transactions(config, now=now)
    ages = sorted(transaction.age_s for transaction in pending)
    requests = lakehouse.read(CHECK_REQUESTS, ["transaction_id"])
    discarded = sorted(set(lakehouse.read(DISCARDED, ["transaction_id"]).column(0).to_pylist()))
    rejected_reasons = Counter(lakehouse.read(REJECTED, ["reason"]).column("reason").to_pylist())
    lease = read_lease(lakehouse)
    # Renewed after ``now`` was taken (it is read afterwards) counts as just renewed.
    lease_age = None if lease is None else max(0.0, now.timestamp() - lease["renewed_at"])
    gone = lease is not None and process_gone(lease)
    last = last_batch(lakehouse)
    written, lag_versions, lag_s = _lag(lakehouse, now)
    return Status(
        lakehouse=lakehouse.root,
        generated_at=now,
        pending_transactions=len(pending),
        oldest_pending_age_s=ages[-1] if ages else None,
        checks_due=sum(transaction.next_step_at <= now for transaction in pending),
        checks_issued=requests.num_rows,
        discarded=len(discarded),
        recovered=len(committed_since(lakehouse, discarded)),
        rejected=sum(rejected_reasons.values()),
        rejected_by_reason=dict(rejected_reasons.most_common()),
        checker_alive=lease is not None and lease_age < lease["ttl_s"] and not gone,
        checker_holder=None if lease is None else f"{lease['host']} pid {lease['pid']}",
        checker_process_gone=gone,
        standby_checkers=[f"{r['host']} pid {r['pid']}" for r in standby_checkers(lakehouse, now.timestamp)],
        lease_renewed_age_s=lease_age,
        last_batch_id=None if last is None else last["batch_id"],
        last_batch_age_s=None if last is None else (now - last["finished_at"]).total_seconds(),
        last_batch_duration_ms=None if last is None else last["duration_ms"],
        commit_log_versions=written,
        lag_versions=lag_versions,
        lag_s=lag_s,
        pending_ages_s=ages,
    )


def read_lease(lakehouse: Union[str, Lakehouse]) -> Optional[dict]:
    """The checker lease of ``lakehouse`` (owner, host, pid, renewed_at, ttl_s), or ``None`` if none is held.

    Example::

        read_lease("lakehouse")  # {'host': 'vm', 'pid': 4242, 'renewed_at': 1795310357.0, 'ttl_s': 30.0, ...}
    """
    record = lease_record(Lakehouse.at(lakehouse).files.read(LEASE_KEY))
    return None if record is None or record.get("released") else record


def read_metrics(lakehouse: Union[str, Lakehouse], columns: Optional[list[str]] = None,
                 since: Optional[dt.datetime] = None) -> pa.Table:
    """Every batch the checker recorded in ``system/metrics`` (those finished at ``since`` or later,
    if given: the files' statistics leave the older ones unread), by batch id; empty if the table
    does not exist.

    Example::

        read_metrics("lakehouse", ["batch_id", "duration_ms"]).to_pandas().plot(x="batch_id")
    """
    lakehouse = Lakehouse.at(lakehouse)
    if not lakehouse.exists(METRICS):
        return METRICS.arrow_schema().empty_table().select(columns or METRICS.column_names)
    where = files = None
    if since is not None:
        where = pc.field("finished_at") >= since
        # Statistics keep timestamps to the millisecond, truncated: a file's true maximum may be up to 1 ms above.
        files = f"finished_at >= '{(since - dt.timedelta(milliseconds=1)).isoformat()}'"
    table = lakehouse.read(METRICS, columns, where, files=files)
    return table.sort_by("batch_id") if "batch_id" in table.column_names else table


def last_batch(lakehouse: Union[str, Lakehouse]) -> Optional[dict]:
    """The checker's latest recorded batch (a ``system/metrics`` row), or ``None``.

    Reads one file: the one whose statistics hold the highest batch id (the table gains a file
    per batch, thousands an hour until ``txcoord maintain`` compacts them).

    Example::

        last_batch("lakehouse")["duration_ms"]
    """
    lakehouse = Lakehouse.at(lakehouse)
    if not lakehouse.exists(METRICS):
        return None
    highest = pc.max(pa.table(lakehouse.table(METRICS).get_add_actions(flatten=True)).column("max.batch_id")).as_py()
    if highest is None:
        return None
    rows = lakehouse.read(METRICS, filter=pc.field("batch_id") == highest, files=f"batch_id >= {highest}")
    return rows.slice(rows.num_rows - 1).to_pylist()[0] if rows.num_rows else None


def delivery_latencies(lakehouse: Union[str, Lakehouse]) -> pa.Table:
    """Commit→visible latency of every delivered message whose batch ``system/metrics`` recorded.

    From when the deciding END entered the commit log (``commit_timestamp``) to the end
    of the batch that wrote the message to its topic; columns ``topic``,
    ``transaction_id``, ``batch_id``, ``latency_ms``.

    Example::

        delivery_latencies("lakehouse").column("latency_ms").to_pylist()  # [2310, 2310, 4120, ...]
    """
    lakehouse = Lakehouse.at(lakehouse)
    finished = dict(zip(*read_metrics(lakehouse, ["batch_id", "finished_at"]).to_pydict().values()))
    rows = []
    for topic in topic_names(lakehouse):
        columns = ["topic", "transaction_id", "batch_id", "commit_timestamp"]
        for row in lakehouse.read(f"topics/{topic}", columns).to_pylist():
            if row["batch_id"] in finished:
                latency = finished[row["batch_id"]] - row["commit_timestamp"]
                rows.append(row | {"latency_ms": int(latency.total_seconds() * 1000)})
    schema = pa.schema([("topic", pa.string()), ("transaction_id", pa.string()), ("batch_id", pa.int64()),
                        ("latency_ms", pa.int64())])
    return pa.Table.from_pylist([{k: r[k] for k in schema.names} for r in rows], schema=schema)


def _lag(lakehouse: Lakehouse, now: dt.datetime) -> tuple[int, Optional[int], Optional[float]]:
    """Versions written over every commit log; of those, how many the checker has not read
    (``None`` before it recorded a batch); and the age of the oldest unread one."""
    progress = CheckerProgress(lakehouse).load()
    lag = CommitLogs(lakehouse).lag({} if progress is None else progress.next_versions, now.timestamp())
    if progress is None or progress.last_batch is None:
        return lag.written_versions, None, None
    return lag.written_versions, lag.unread_versions, lag.seconds