"""Maintenance that runs itself: the checker job keeps every table compacted, checkpointed and cleaned.

While the checker holds the lakehouse's lease, this runs ``txcoord maintain``'s work
(:func:`coordinator.ops.maintenance.maintain`, with every guard it has: ``system/check_requests`` never
compacted, a commit log's commits checked before delta-rs opens it, the checker's progress record kept in
view by vacuum and log cleanup) over every table, ``maintenance_interval_ms`` after the end of its last
run (the first: that long after the lease was taken), so more logs never mean more cron jobs.

Off the batches' path: the tables are maintained by processes of their own (fresh interpreters, at a lower
priority), each one table at a time, started for each run and ended after it: on object storage
:data:`PROCESSES_ON_OBJECT_STORAGE` at once, since a table's steps wait on requests one after another and a run of
every table one after another took minutes
(docs/performance-log.md#the-checkers-own-maintenance-is-each-commit-logs-_delta_log-bounded), on a local disk one. It
holds no GIL of the driver's, none of its memory (a busy commit log's vacuum lists every file the log holds), and
a crash of its own (delta-rs has died of SIGSEGV on a hostile log before) costs the table it was on, which is
reported failed; a new process takes the next. A table that cannot be maintained is reported, with the reason, and
the others are still maintained. The lease is looked at again before each table: a checker that lost it stops
maintaining at once. Each run's outcome is logged (a line per failed table, one per run) and counted
(``txcoord_maintenance_*``, :class:`~coordinator.checker.exporter.CheckerExporter`).

Stopping is immediate: :meth:`ScheduledMaintenance.close` kills the processes mid-table and reaps them. Every
step of maintenance is safe to cut short: a compaction, a property change or a checkpoint lands whole or
not at all, and what a cut leaves behind (an unreferenced file) is what a lost race leaves, which a later
vacuum removes.

Example::

    maintenance = ScheduledMaintenance(config, holding=lambda: True, on_run=print).start()
    ...
    maintenance.close()   # at once, whatever it was doing; no process left behind
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease, lease_record
from coordinator.exceptions import one_line
from coordinator.lakehouse import LEASE_KEY, Lakehouse
from coordinator.storage import is_object_store
from coordinator.ops.maintenance import TableMaintenance

__all__ = ["MaintenanceRun", "ScheduledMaintenance", "holds"]

log = logging.getLogger("coordinator.maintenance")

#: The maintenance process's niceness, added to the driver's: batches come first.
NICENESS = 10
#: Maintenance processes at once on object storage, a table each (:class:`ScheduledMaintenance`).
PROCESSES_ON_OBJECT_STORAGE = 4
#: How often the maintenance process looks whether the checker it serves is still there.
_PARENT_POLL_S = 1.0


@dataclass
class MaintenanceRun:
    """One run over the tables: what each table's maintenance did (``txcoord maintain``'s rows), and why
    the run stopped short, if it did (``stopped_short``: the lease lost, the checker stopping, the tables
    not listed)."""

    started_at: float
    seconds: float = 0.0
    tables: list[TableMaintenance] = field(default_factory=list)
    stopped_short: Optional[str] = None

    @property
    def maintained(self) -> int:
        return sum(result.failed is None for result in self.tables)

    @property
    def failed(self) -> list[TableMaintenance]:
        return [result for result in self.tables if result.failed is not None]


def holds(lease: CheckerLease) -> bool:
    """Whether ``lease`` (this checker's) is still its holder's, not released nor taken over, as the lease file says now."""
    holder = lease_record(lease.files.read(LEASE_KEY))
    return holder is not None and holder["owner"] == lease.owner and not holder.get("released")


class _Worker:
    """One maintenance process, started on the first request and ended when asked: one table at a time."""

    def __init__(self, command: list[str], settings: dict):
        self._command, self._settings = command, settings
        self._lock = threading.Lock()  # guards process between the run and close()
        self.process: Optional[subprocess.Popen] = None
        self.exit_status = "not started"  # how its last process that ended early ended

    def started(self, stop: threading.Event) -> Optional[subprocess.Popen]:
        """The process, started if none runs; ``None`` once ``stop`` is set."""
        with self._lock:
            if stop.is_set():
                return None
            if self.process is None:
                self.process = self._spawn()
            return self.process

    def ask(self, request: dict, stop: threading.Event) -> Optional[dict]:
        """Send ``request`` to the process (started if none runs) and return its reply; ``None`` if the process
        ended first (then the next request starts a new one) or ``stop`` is set."""
        process = self.started(stop)
        if process is None:
            return None
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            line = process.stdout.readline()
        except (BrokenPipeError, OSError, ValueError):  # ended (or closed by close()) under us
            line = ""
        if line:
            return json.loads(line)
        self.exit_status = _exit_status(process)
        self.end(kill=True)
        return None

    def _spawn(self) -> subprocess.Popen:
        # The driver's own module path (spark-submit's additions included), never its JVM's variables' worth.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        process = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                   close_fds=True)
        process.stdin.write(json.dumps(self._settings) + "\n")  # its storage settings may hold credentials: never argv
        process.stdin.flush()
        return process

    def end(self, kill: bool) -> None:
        """End the process, if one runs, and reap it: killed, or told there is nothing more."""
        with self._lock:
            process, self.process = self.process, None
        if process is None:
            return
        if kill:
            process.kill()
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=None if kill else 30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class ScheduledMaintenance:
    """Maintains every table ``interval`` after the end of its last run, while ``holding()`` (see the module's
    docstring); ``on_run(run)`` is told each run's :class:`MaintenanceRun`.

    ``command`` is the maintenance process's command line (default: this module's, ``--worker``), for tests.
    ``processes`` maintain a table each at once (default: :data:`PROCESSES_ON_OBJECT_STORAGE` on object storage,
    where a table's steps wait on requests one after another; one on a local disk).
    """

    def __init__(self, config: CoordinatorConfig, holding: Callable[[], bool],
                 on_run: Optional[Callable[[MaintenanceRun], None]] = None, command: Optional[Sequence[str]] = None,
                 processes: Optional[int] = None):
        self.config = config
        self.interval_s = config.maintenance_interval_ms / 1000
        self._holding = holding
        self._on_run = on_run
        command = list(command or [sys.executable, "-m", __name__, "--worker"])
        settings = {"lakehouse": config.lakehouse, "storage": dict(config.storage),
                    "retention_hours": config.maintenance_retention_hours,
                    "log_retention_hours": config.maintenance_log_retention_hours}
        if processes is None:
            processes = PROCESSES_ON_OBJECT_STORAGE if is_object_store(config.lakehouse) else 1
        self._workers = [_Worker(command, settings) for _ in range(processes)]
        self._stop = threading.Event()
        self._due = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: Set while a request is with a maintenance process (for tests: a run is under way).
        self.busy = threading.Event()
        self._asking, self._asked = threading.Lock(), 0
        #: The last run, ``None`` before the first.
        self.last_run: Optional[MaintenanceRun] = None

    def start(self) -> "ScheduledMaintenance":
        """Start the schedule (nothing with ``maintenance_interval_ms = 0``)."""
        if self.interval_s <= 0:
            log.info("scheduled maintenance off (maintenance_interval_ms = 0): run txcoord maintain yourself")
            return self
        log.info("maintaining every table %g s after the last run ended, while this checker holds the lease "
                 "(vacuum retention %d h, log retention %s)", self.interval_s, self.config.maintenance_retention_hours,
                 "each table's own" if self.config.maintenance_log_retention_hours is None
                 else f"{self.config.maintenance_log_retention_hours:g} h")
        self._thread = threading.Thread(target=self._loop, name="maintenance", daemon=True)
        self._thread.start()
        return self

    def run_soon(self) -> None:
        """Start the next run now rather than at its time (tests; an operator's nudge)."""
        self._due.set()

    def close(self) -> None:
        """Stop at once: the run under way, if any, is cut short (its process killed and reaped)."""
        self._stop.set()
        self._due.set()
        for worker in self._workers:
            worker.end(kill=True)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while True:
            self._due.wait(self.interval_s)
            if self._stop.is_set():
                return
            self._due.clear()
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - whatever it is, the next run is due all the same
                log.exception("scheduled maintenance failed; the next run is in %g s", self.interval_s)

    def run_once(self) -> MaintenanceRun:
        """One run over every table, now; reported (logged, ``on_run``) and returned."""
        run = MaintenanceRun(started_at=time.time())
        began = time.monotonic()
        try:
            run.stopped_short = self._maintain_all(run)
        except Exception as error:  # noqa: BLE001 - the lease unreadable, the storage down: the next run tries again
            run.stopped_short = one_line(error)
        finally:
            for worker in self._workers:
                worker.end(kill=False)
        run.seconds = time.monotonic() - began
        self.last_run = run
        self._report(run)
        return run

    def _maintain_all(self, run: MaintenanceRun) -> Optional[str]:
        """Maintain every table into ``run`` (in the order listed), a table per process at once; why it stopped
        short, if it did."""
        if not self._holding():
            return "this checker does not hold the lease"
        listed = self._ask(self._workers[0], {"list": True})
        if self._stop.is_set():
            return "the checker is stopping"
        if listed is None or "tables" not in listed:
            return f"the tables could not be listed: {self._why_not(self._workers[0], listed)}"
        tables = iter(listed["tables"])
        taking = threading.Lock()
        results: dict[str, TableMaintenance] = {}
        stopped: list[str] = []

        def maintain_with(worker: _Worker) -> None:
            while not stopped:
                with taking:
                    name = next(tables, None)
                if name is None:
                    return
                if self._stop.is_set():
                    stopped.append("the checker is stopping")
                    return
                if not self._holding():
                    stopped.append("this checker lost the lease")
                    return
                reply = self._ask(worker, {"table": name})
                if self._stop.is_set():  # its process killed by close(): no fault of the table's
                    stopped.append("the checker is stopping")
                    return
                results[name] = (TableMaintenance(**reply["result"]) if reply is not None and "result" in reply
                                 else TableMaintenance(name, failed=self._why_not(worker, reply)))

        with ThreadPoolExecutor(max_workers=len(self._workers), thread_name_prefix="maintenance") as pool:
            for done in [pool.submit(maintain_with, worker) for worker in self._workers]:
                done.result()
        run.tables.extend(results[name] for name in listed["tables"] if name in results)
        return stopped[0] if stopped else None

    @staticmethod
    def _why_not(worker: _Worker, reply: Optional[dict]) -> str:
        if reply is not None:
            return reply.get("error", f"unexpected reply {reply!r}")
        return f"the maintenance process ended ({worker.exit_status})"

    def _ask(self, worker: _Worker, request: dict) -> Optional[dict]:
        if worker.started(self._stop) is None:
            return None
        with self._asking:
            self._asked += 1
            self.busy.set()
        try:
            return worker.ask(request, self._stop)
        finally:
            with self._asking:
                self._asked -= 1
                if not self._asked:
                    self.busy.clear()

    def _report(self, run: MaintenanceRun) -> None:
        for result in run.failed:
            log.warning("maintenance: %s could not be maintained: %s", result.table, result.failed)
        compacted = sum(result.files_compacted for result in run.tables)
        vacuumed = sum(result.files_vacuumed for result in run.tables)
        summary = (f"maintenance: {run.maintained} table(s) maintained, {len(run.failed)} failed, {compacted} file(s) "
                   f"compacted away, {vacuumed} vacuumed, in {run.seconds:.1f} s")
        if run.tables:
            slowest = max(run.tables, key=lambda result: result.seconds)
            summary += f" (the longest: {slowest.table}, {slowest.seconds:.1f} s)"
        if run.stopped_short is not None:
            log.warning("%s; stopped short: %s", summary, run.stopped_short)
        else:
            log.info("%s; the next run in %g s", summary, self.interval_s)
        if self._on_run is not None:
            self._on_run(run)


def _exit_status(process: subprocess.Popen) -> str:
    try:
        code = process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "its output closed"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def serve(commands, replies) -> None:
    """The maintenance process: its settings on the first line of ``commands``, then one request a line
    (``{"list": true}``: the tables maintenance looks after; ``{"table": NAME}``: maintain it), each answered
    with one JSON line on ``replies``, until ``commands`` ends."""
    from coordinator.ops.maintenance import maintain, maintained_tables

    settings = json.loads(commands.readline() or "null")
    if settings is None:
        return
    lakehouse = Lakehouse.of(CoordinatorConfig(lakehouse=settings["lakehouse"], storage=settings["storage"]))
    for line in commands:
        request = json.loads(line)
        try:
            if "list" in request:
                reply = {"tables": maintained_tables(lakehouse)}
            else:
                [result] = maintain(lakehouse, tables=[request["table"]], retention_hours=settings["retention_hours"],
                                    log_retention_hours=settings["log_retention_hours"])
                reply = {"result": dataclasses.asdict(result)}
        except Exception as error:  # noqa: BLE001 - said to the checker, which reports it and goes on
            reply = {"error": one_line(error, limit=500)}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _exit_with_parent(parent: int) -> None:
    # A checker killed with SIGKILL closes no pipe of ours while a table is maintained: leave with it.
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(0)


def _worker_main() -> None:
    os.nice(NICENESS)
    replies = os.fdopen(os.dup(1), "w")  # the replies' own channel ...
    os.dup2(2, 1)  # ... and whatever else writes to standard output goes to the checker's log
    sys.stdout = sys.stderr
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="maintenance-parent", daemon=True).start()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    serve(sys.stdin, replies)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker_main()
