"""The real checker job (``spark-submit jobs/checker.py``) as a process of its own, and what it has done,
read where operators read it: ``system/metrics`` (each finished batch), the progress record (the commit-log
versions taken) and the lease (which process holds it, which stand by).

Nothing here reads the checker's log for a figure; the one thing taken from the log is where it serves
its Prometheus metrics (``metrics_port = 0`` picks a free port, which only the log names).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional, Union

from support.environment import REPO_ROOT
from support.deltalog import latest_version
from support.processes import Job, child_environment

if TYPE_CHECKING:
    from coordinator.control.progress import Progress
    from coordinator.lakehouse import Lakehouse

__all__ = ["CheckerJob", "LagSampler", "checker_on_fresh_lakehouse", "first_batch_after", "holds_lease",
           "recorded_batches", "served_metrics_url", "stands_by", "write_config"]

#: What the checker logs (coordinator/checker/exporter.py) once it serves its metrics (``metrics_port`` set).
_METRICS_LINE = re.compile(rb"metrics served at (http://\S+/metrics)")


def recorded_batches(lakehouse: Union[str, Lakehouse], since: float) -> list[dict]:
    """The batches ``system/metrics`` records as started at ``since`` (a ``time.time()``) or later, oldest
    first, with ``started_at`` and ``finished_at`` as ``time.time()`` values too. A batch is recorded just
    after it commits (by a Spark listener): one whose checker was killed at that moment is never recorded.

    Example::

        recorded_batches(lakehouse, since=job.started_wall)[0]["finished_at"] - job.started_wall  # 9.4
    """
    from coordinator.ops.status import read_metrics

    start = dt.datetime.fromtimestamp(since, dt.timezone.utc)
    rows = read_metrics(lakehouse, since=start).to_pylist()
    batches = [row | {"started_at": row["started_at"].timestamp(), "finished_at": row["finished_at"].timestamp()}
               for row in rows if row["started_at"] >= start]
    return sorted(batches, key=lambda row: row["batch_id"])


def first_batch_after(lakehouse: Union[str, Lakehouse], since: float) -> Optional[dict]:
    """The first batch :func:`recorded_batches` finds started at ``since`` or later, ``None`` before one."""
    return next(iter(recorded_batches(lakehouse, since)), None)


def holds_lease(lakehouse: Union[str, Lakehouse], job: Job) -> bool:
    """Whether ``job`` holds ``lakehouse``'s checker lease: the lease names a process of ``job``'s process group
    (spark-submit's JVM runs the checker's Python driver, the process the lease names, as its child)."""
    from coordinator.ops.status import read_lease

    return _in_group(read_lease(lakehouse), job)


def stands_by(lakehouse: Union[str, Lakehouse], job: Job) -> bool:
    """Whether ``job`` stands by for ``lakehouse``'s lease (a checker announces itself in ``system/_standby``
    once its Spark session is up)."""
    from coordinator.control.lease import standby_checkers

    return any(_in_group(record, job) for record in standby_checkers(lakehouse))


def _in_group(record: Optional[dict], job: Job) -> bool:
    if record is None or not job.running:
        return False
    try:
        return os.getpgid(record["pid"]) == job.pid
    except (ProcessLookupError, PermissionError):
        return False


def served_metrics_url(log_path: str) -> Optional[str]:
    """Where the checker that writes ``log_path`` says it serves its Prometheus metrics, ``None`` before it does."""
    with open(log_path, "rb") as log:
        found = _METRICS_LINE.search(log.read())
    return found.group(1).decode() if found else None


class CheckerJob(Job):
    """``spark-submit jobs/checker.py`` on a lakehouse, as deployed, started at once in ``cwd``; its output
    goes to ``log_path``; its settings are its TOML's alone (no ``TXCOORD_*`` variable reaches it). :meth:`start` runs it again once it has ended (a supervisor's restart).

    Example::

        with CheckerJob(config_path, lakehouse, "checker.log") as checker:
            checker.wait_ready(180)
            checker.lag()
    """

    def __init__(self, config_path: str, lakehouse: Union[str, Lakehouse], log_path: str,
                 cwd: Union[str, Path] = REPO_ROOT):
        from coordinator.control.progress import CheckerProgress
        from coordinator.lakehouse import Lakehouse
        from coordinator.spark import spark_submit

        argv, env = spark_submit(REPO_ROOT / "jobs" / "checker.py", "--config", config_path)
        super().__init__(argv, log_path, env=child_environment(env), cwd=cwd)
        self.lakehouse = Lakehouse.at(lakehouse)
        self._progress = CheckerProgress(self.lakehouse)
        self.config_path = config_path
        self.start()

    def progress(self) -> Optional[Progress]:
        """The checker's progress record (``system/_checker_progress.json``), ``None`` before it wrote one."""
        return self._progress.load()

    def holds_lease(self) -> bool:
        """Whether this run holds the lakehouse's lease (:func:`holds_lease`): it takes the lease, then starts
        its streaming query at once."""
        return holds_lease(self.lakehouse, self)

    def stands_by(self) -> bool:
        """Whether this run stands by for the lease (:func:`stands_by`)."""
        return stands_by(self.lakehouse, self)

    def written_versions(self) -> dict[str, int]:
        """How many versions each commit log has (its latest version + 1)."""
        from coordinator.commit_logs import CommitLogs

        return {ref.key: latest_version(self.lakehouse.key_path(ref.key), self.lakehouse.storage) + 1
                for ref in CommitLogs(self.lakehouse).discover()}

    def latest_commit_log_version(self) -> int:
        """Versions written over every commit log, less one (-1 before any)."""
        return sum(self.written_versions().values()) - 1

    def lag(self) -> Optional[int]:
        """Commit-log versions written but not yet taken by a checker batch, over every log."""
        progress = self.progress()
        if progress is None:
            return None
        read = progress.next_versions
        return sum(max(0, written - read.get(key, 0)) for key, written in self.written_versions().items())

    def wait_first_batch(self, since: float, timeout_s: float) -> tuple[float, dict]:
        """Wait until this run holds the lease, then until ``system/metrics`` records a batch started at
        ``since`` (a ``time.time()``) or later; return the ``time.monotonic()`` at which the lease was seen
        held, and that batch. ``RuntimeError`` with the end of its log if the run exits first or
        ``timeout_s`` pass.

        The lease (a small file) is read every 0.1 s, the resolution of that moment; ``system/metrics`` (a
        Delta table) every 0.5 s, to disturb a starting checker less: the batch's end is the time it records,
        whenever it is read.

        Example::

            lease_seen, first = checker.wait_first_batch(killed_wall, 300)
            first["finished_at"] - killed_wall   # the takeover, in seconds
        """
        deadline = time.monotonic() + timeout_s
        lease_seen = self.wait_for(lambda: self.holds_lease() and time.monotonic(), "the lease", timeout_s, poll_s=0.1)
        first = self.wait_for(lambda: first_batch_after(self.lakehouse, since), "its first batch",
                              max(0.0, deadline - time.monotonic()), poll_s=0.5)
        return lease_seen, first

    def wait_ready(self, timeout_s: float) -> float:
        """Wait for this run's first batch (:meth:`wait_first_batch`); the seconds from its start to that batch's
        end. For a run that takes the lease as it starts (no other checker running)."""
        _, first = self.wait_first_batch(self.started_wall, timeout_s)
        return round(first["finished_at"] - self.started_wall, 1)


def write_config(lakehouse: Union[str, Lakehouse], directory: Optional[str] = None,
                 storage: Optional[Mapping[str, str]] = None, **settings) -> str:
    """A coordinator TOML for ``lakehouse`` (its storage settings as the ``[storage]`` table, or
    ``storage`` instead: another route to the same place, a latency proxy's) with ``settings``, written in
    ``directory`` (default: the lakehouse's own, a local one); returns its path."""
    import json

    from coordinator.lakehouse import Lakehouse

    lakehouse = Lakehouse.at(lakehouse)
    directory = directory or lakehouse.root
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "bench.toml")
    # A JSON string is a valid TOML basic string: quotes and backslashes stay safe.
    lines = [f"lakehouse = {json.dumps(lakehouse.root)}"] + [f"{key} = {value}" for key, value in settings.items()]
    storage = lakehouse.storage if storage is None else storage
    if storage:
        lines += ["", "[storage]", *(f"{key} = {json.dumps(value)}" for key, value in storage.items())]
    Path(path).write_text("\n".join(lines) + "\n")
    return path


def checker_on_fresh_lakehouse(requested: Optional[str], benchmark: str, trigger_ms: int,
                               object_store: Optional[Lakehouse] = None, checker_storage: Optional[Mapping[str, str]] = None,
                               **settings) -> tuple[str, CheckerJob]:
    """The checker job on an empty lakehouse, not yet waited for, and the local directory that holds its
    TOML and log: ``requested`` (wiped) or a new temporary directory. That directory is the lakehouse
    too, unless ``object_store`` names an empty lakehouse on object storage (with its storage settings,
    which the harness reads through; the checker's TOML has ``checker_storage`` instead where given: its
    own route, such as a latency proxy).
    ``settings`` go into the TOML beside ``trigger_interval_ms`` (``metrics_port=0``).
    Returns ``(directory, checker)``.

    Example::

        lakehouse, checker = checker_on_fresh_lakehouse(None, "e2e", trigger_ms=200)
    """
    from coordinator.lakehouse import Lakehouse, init_lakehouse

    directory = requested or tempfile.mkdtemp(prefix=f"bench-{benchmark}-")
    if requested:
        shutil.rmtree(directory, ignore_errors=True)
    lakehouse = object_store or Lakehouse(directory)
    init_lakehouse(lakehouse)
    config_path = write_config(lakehouse, directory, storage=checker_storage, trigger_interval_ms=trigger_ms, **settings)
    return directory, CheckerJob(config_path, lakehouse, os.path.join(directory, "checker.log"))


class LagSampler(threading.Thread):
    """Samples the checker's lag (commit-log versions not yet read) once a second from ``t0``, on a fixed
    schedule (a slow read delays the next sample, not every later one), each sample timed when its read
    starts. With ``window_s``, every quarter of that window has a sample (:meth:`quarter`): one whose
    reads all fell outside it gets one as soon as it ends, counted in it, so quarters compare whatever
    the load."""

    def __init__(self, checker: CheckerJob, t0: float, window_s: Optional[float] = None, interval_s: float = 1.0):
        super().__init__(name="lag-sampler", daemon=True)
        self.checker, self.t0, self.window_s, self.interval_s = checker, t0, window_s, interval_s
        self.samples: list[tuple[float, int, int]] = []  # (seconds since t0, lag, latest commit-log version)
        self._quarters: dict[int, list[int]] = {}  # quarter of window_s (1 to 4) → its lags
        self._halt = threading.Event()

    def run(self) -> None:
        next_sample = self.interval_s
        unchecked = [n * self.window_s / 4 for n in range(1, 5)] if self.window_s else []  # quarters' ends
        while not self._halt.is_set():
            now = time.monotonic() - self.t0
            if unchecked and now >= unchecked[0]:
                unchecked.pop(0)
                quarter = 4 - len(unchecked)
                if not self._quarters.get(quarter):
                    self._sample(quarter)
            elif now >= next_sample:
                next_sample = max(next_sample + self.interval_s, now)
                self._sample()
            else:
                self._halt.wait(min([next_sample, *unchecked[:1]]) - now)

    def _sample(self, quarter: Optional[int] = None) -> None:
        """One sample, counted in the quarter its read starts in, or in ``quarter``."""
        started = time.monotonic() - self.t0
        lag = self.checker.lag()
        if lag is None:
            return
        self.samples.append((round(started, 1), lag, self.checker.latest_commit_log_version()))
        if quarter is None and self.window_s and started < self.window_s:
            quarter = int(4 * started // self.window_s) + 1
        if quarter is not None:
            self._quarters.setdefault(quarter, []).append(lag)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def between(self, start_s: float, end_s: float) -> list[int]:
        return [lag for t, lag, _ in self.samples if start_s <= t < end_s]

    def quarter(self, n: int) -> list[int]:
        """The lags sampled in quarter ``n`` (1 to 4) of ``window_s``."""
        return self._quarters.get(n, [])
