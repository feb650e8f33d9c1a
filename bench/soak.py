"""Soak: an hour at a steady rate, the checker killed now and then, table maintenance on. Do
commit→visible latency, memory and the Delta logs stay flat, and is every committed message delivered
exactly once?

The real checker job (``spark-submit jobs/checker.py``, the product's default trigger unless
``--trigger-ms``) runs while this process, one producer, offers ``--rate`` transactions per second for
``--minutes`` from ``--threads`` threads (no-op local transaction that commits, 200-byte body; a producer
that falls behind still stops then, and the sends it never started are reported as ``unsent``). Meanwhile:

- every ``--kill-every`` seconds of sending, the checker job's whole process group gets SIGKILL, as a
  crash (``support.CheckerJob.kill``), and a new run starts at once, as a supervisor restarts a crashed
  service (it takes the lease over as soon as it finds the killed run's process gone). A run is killed
  only once it has finished a batch (a restart that outlasts the period skips the kills that fell due).
  Each restart is timed from the kill to the new run taking the lease, to the end of its first batch
  (``system/metrics``) and to the checker catching up (``caught_up_s``: its lag back to the highest of the 30 s before the kill);
- every ``--maintenance-every`` seconds, ``txcoord maintain --retention-hours --log-retention-hours`` runs
  as a process of its own, as a scheduler runs it (at fixed times from the start of sending; its memory is
  not the producer's); the default log retention, six minutes (with a commit log's two minutes of
  tombstones), lets the logs level off within the first window, so that the second one, which the verdict
  compares with the last, is at its level. Each run's peak RSS (``wait4``) is kept;
- a thread follows the topic table's log every 2 s (``support.TopicFollower``: log cleanup removes old
  versions, so they cannot all be read at the end) and takes each delivered transaction's commit→visible
  latency as ``bench/e2e.py`` does: the commit timestamp of the topic version that delivered it minus the
  time its send returned;
- every ``--memory-every`` seconds, the RSS of the checker job's whole process tree (``support.process_tree_rss``:
  its JVM, its Python driver, streaming source runner and Python workers, summed, and their PSS; after a
  kill, the new run's tree) and of this process (the producer; it also follows the topic and keeps each
  transaction's latency, 4 bytes); every ``--log-every`` seconds, the size of the commit log's
  ``_delta_log`` (bytes and files), which the appender's checkpoints make grow between maintenance runs;
- at each window's end, a memory sample counted in it (so every window has one) and the shape of the
  commit log, every system table, the group's check requests and the topic (``support.table_shape``): the
  version, the ``_delta_log``'s bytes and files (JSON commits and checkpoints), active data files and
  Parquet files on disk.

Each window of ``--window-minutes`` of sending time is reported (a transaction belongs to the window its
send returned in; the last window also takes the sends in flight at its end): transactions sent and
delivered, commit→visible p50/p99/max, checker batches (``system/metrics``) and their median time, the
checker's peak lag (commit-log versions not yet taken), kills and restart times, the peak RSS of each role
(the checker's tree, also as PSS, its JVMs, its other processes, the producer, maintenance runs), the
commit log's peak ``_delta_log`` size and the tables' shapes at its end. Once sending stops, the run waits up to ``--drain`` seconds for every sent
transaction to be delivered, stops the checker (SIGTERM), runs maintenance once more and counts, from the
topic table's snapshot against the id of every send (written to a file as it went): ``lost`` (sent, not
in the topic), ``duplicated`` (rows beyond the first of a transaction id) and ``not_committed`` (in the
topic, never sent: this producer only commits).

Verdict, ``flat``: for commit→visible p50 and p99, the checker tree's and the producer's peak RSS and the
commit log's peak ``_delta_log`` bytes, the last window within 1.25 × the second (the first holds the
warm-up; with the default kill period equal to the window, every window after the first starts with a
kill, so its p99 holds a restart's outage), each ratio reported (``flat_ratios``; batch time, the tree's
PSS, the JVM's RSS and the commit log's ``_delta_log`` at the window's end likewise in ``other_ratios``,
not judged); and every count 0. The tables' shapes are also
reported when sending starts and after the last maintenance run. The machine is shared: when the
lakehouse's disk has less than ``--min-free-gib`` free, sending stops early, and the run says so
(``aborted``) and is not flat.

    python -m bench.soak                       # 60 min at 1,000 txn/s: a kill every 10 min, maintenance every 5
    python -m bench.soak --minutes 3 --rate 200 --kill-every 60 --window-minutes 1
    python -m bench.soak --tiny                # 18 s at 10 txn/s, a kill at 8 s, 6-s windows (bench/tests/test_bench.py)

Prints a table per window and the verdict, and writes ``bench/results/soak.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from array import array
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from bench import harness

import support

TOPIC = "BENCH_SOAK"
GROUP = "bench-soak"
COMMIT_LOG = f"groups/{GROUP}/commit_log"
#: The last window may be at most this many times the second (latency, memory, commit-log size).
FLAT_TOLERANCE = 1.25
#: What the verdict compares, last window against the second: the window's figure of each.
FLAT_FIGURES = {
    "e2e_p50_ms": lambda w: w["e2e_p50_ms"],
    "e2e_p99_ms": lambda w: w["e2e_p99_ms"],
    "checker_tree_rss_mib": lambda w: w["rss_max_mib"]["checker_tree"],
    "producer_rss_mib": lambda w: w["rss_max_mib"]["producer"],
    "commit_log_delta_log_bytes": lambda w: w["commit_log_delta_log_bytes_max"],
}
#: Compared the same way, for the reader, but not part of the verdict.
OTHER_FIGURES = {
    "batch_ms_median": lambda w: w["batch_ms_median"],
    "checker_tree_pss_mib": lambda w: w["rss_max_mib"]["checker_tree_pss"],
    "checker_jvm_rss_mib": lambda w: w["rss_max_mib"]["checker_jvm"],
    "commit_log_delta_log_bytes_at_end": lambda w: (w["tables"][COMMIT_LOG] or {}).get("log_bytes"),
}
#: What must be 0 (:func:`topic_counts`).
COUNTS = ("lost", "duplicated", "not_committed")
FOLLOW_EVERY_S = 2.0
#: ``--tiny``: 18 s at 10 txn/s in three 6-s windows, a kill at 8 s (the restart, about 20 s, outlasts the
#: sending: the drain waits for it), maintenance every 4 s, memory every second, the commit log's size every 2;
#: it writes a few MiB, so it needs 1 GiB free, not the hour's 10.
TINY = {"minutes": 0.3, "rate": 10, "threads": 4, "window_minutes": 0.1, "kill_every": 8, "maintenance_every": 4,
        "memory_every": 1, "log_every": 2, "drain": 180, "min_free_gib": 1}


class Maintainer(threading.Thread):
    """Runs ``txcoord maintain`` as a process of its own every ``every_s`` seconds from ``t0``, as a scheduler
    (cron, a systemd timer) would: at fixed times, a run that overruns the period skipping the times it
    covered."""

    def __init__(self, config_path: str, log_path: str, every_s: float, retention_hours: int,
                 log_retention_hours: float, t0: float):
        super().__init__(name="maintenance", daemon=True)
        self.argv = [sys.executable, "-m", "coordinator", "maintain", "--config", config_path, "--json",
                     "--retention-hours", str(retention_hours), "--log-retention-hours", repr(log_retention_hours)]
        self.log_path, self.every_s, self.t0 = log_path, every_s, t0
        self.runs: list[dict] = []
        self._halt = threading.Event()

    def run_once(self) -> dict:
        """One ``txcoord maintain``, waited for; what it did and its peak RSS (from ``wait4``)."""
        import json

        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen(self.argv, cwd=harness.ROOT, stdout=subprocess.PIPE, stderr=log,
                                       stdin=subprocess.DEVNULL)
        output = process.stdout.read()
        process.stdout.close()
        _, status, usage = os.wait4(process.pid, 0)  # its rusage: the peak RSS
        process.returncode = os.waitstatus_to_exitcode(status)
        error = None if process.returncode == 0 else f"exit {process.returncode}; see {self.log_path}"
        tables = [] if error else json.loads(output)["tables"]
        return {
            "at_s": round(started - self.t0, 1),
            "seconds": round(time.monotonic() - started, 1),
            "error": error,
            "compacted": sum(t["files_compacted"] for t in tables),
            "vacuumed": sum(t["files_vacuumed"] for t in tables),
            "skipped": [f"{t['table']}: {s}" for t in tables for s in t["skipped"]],
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # KiB on Linux
        }

    def run(self) -> None:
        slot = 1  # the next run is due at t0 + slot × every_s
        while not self._halt.wait(max(0.0, self.t0 + slot * self.every_s - time.monotonic())):
            self.runs.append(self.run_once())  # a failure is recorded, never fatal: the soak goes on
            slot = max(slot + 1, math.floor((time.monotonic() - self.t0) / self.every_s) + 1)

    def stop(self) -> None:
        self._halt.set()
        self.join()


class Supervisor(threading.Thread):
    """Kills the checker job (SIGKILL to its whole process group) every ``every_s`` seconds from ``t0`` until
    ``until_s``, and starts a new one at once, as a supervisor restarts a crashed service; a run is killed
    only once it has finished a batch. ``current`` is the running checker."""

    def __init__(self, checker: support.CheckerJob, directory: str, every_s: float, until_s: float, t0: float,
                 startup_timeout_s: float):
        super().__init__(name="checker-supervisor", daemon=True)
        self.current = checker
        self.directory, self.every_s, self.until_s, self.t0 = directory, every_s, until_s, t0
        self.startup_timeout_s = startup_timeout_s
        self.restarts: list[dict] = []
        self._halt = threading.Event()

    def run(self) -> None:
        if self.every_s <= 0:
            return
        slot = 1  # the next kill is due at t0 + slot × every_s
        while True:
            due = self.t0 + slot * self.every_s
            if due >= self.t0 + self.until_s or self._halt.wait(max(0.0, due - time.monotonic())):
                return
            if not self.restart(len(self.restarts) + 1):
                return  # the new run failed to start: recorded; no more kills
            # A restart that outlasted the period skips the kills that fell due meanwhile: none during a start.
            slot = max(slot + 1, math.floor((time.monotonic() - self.t0) / self.every_s) + 1)

    def restart(self, n: int) -> bool:
        """Kill the current run, start the next, wait for its first finished batch; whether it ran one.
        Read from the lakehouse: the lease names the new run's process, ``system/metrics`` records its batches."""
        killed = self.current
        killed_batches = len(support.recorded_batches(killed.lakehouse, killed.started_wall))
        killed_at, killed_wall = time.monotonic(), time.time()
        exit_code = killed.kill()
        self.current = support.CheckerJob(killed.config_path, killed.lakehouse,
                                          os.path.join(self.directory, f"checker-{n + 1}.log"))
        record = {"at_s": round(killed_at - self.t0, 1), "killed_run_s": round(killed_at - killed.started_at, 1),
                  "killed_run_batches": killed_batches, "killed_exit_code": exit_code,
                  "lease_taken_s": None, "restart_s": None, "error": None, "log": self.current.log_path}
        self.restarts.append(record)
        print(f"  [{record['at_s']:7.1f} s] checker killed (kill -9 of its process group, after "
              f"{killed_batches} batches); starting run {n + 1}", flush=True)
        try:
            lease_seen, first = self.current.wait_first_batch(
                killed_wall, self.startup_timeout_s - (time.monotonic() - killed_at))
        except RuntimeError as error:
            record["error"] = f"run {n + 1}: {error}"
            print(f"  checker restart FAILED: {record['error']}", flush=True)
            return False
        record["lease_taken_s"] = round(lease_seen - killed_at, 1)
        record["restart_s"] = round(first["finished_at"] - killed_wall, 1)
        print(f"  [{time.monotonic() - self.t0:7.1f} s] run {n + 1}: first batch {record['restart_s']} s after "
              f"the kill (lease taken after {record['lease_taken_s']} s)", flush=True)
        return True

    def stop(self) -> None:
        self._halt.set()
        self.join()


class Latencies(threading.Thread):
    """Commit→visible latency of every transaction, per window of send time, as the topic's log grows.

    :meth:`sent` (the sender's ``on_sent``) keeps each transaction until delivered, and its id in
    ``sent_path`` (for the counts at the end); every ``FOLLOW_EVERY_S`` the thread reads the topic versions
    written since (:class:`support.TopicFollower`) and records, for each transaction delivered, its
    version's commit timestamp minus the time its send returned, in the window of that send.
    """

    def __init__(self, lakehouse: str, t0_wall: float, window_s: float, windows: int, sent_path: str):
        super().__init__(name="latencies", daemon=True)
        self.follower = support.TopicFollower(lakehouse, TOPIC)
        self.t0_wall, self.window_s, self.windows = t0_wall, window_s, windows
        self.sent_path = sent_path
        self._sent_file = open(sent_path, "w")
        self.pending: dict[str, float] = {}  # sent, not delivered yet: id → returned at (epoch s)
        self.unmatched: dict[str, float] = {}  # delivered, not (yet) known as sent: id → delivered at
        self.sent_by_window = [0] * windows
        self.seconds = [array("f") for _ in range(windows)]  # each delivered transaction's latency, by window
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def window_of(self, returned_at: float) -> int:
        return min(self.windows - 1, max(0, int((returned_at - self.t0_wall) // self.window_s)))

    def sent(self, transaction_id: str, returned_at: float, _send_seconds: float) -> None:
        with self._lock:
            self._sent_file.write(transaction_id + "\n")
            window = self.window_of(returned_at)
            self.sent_by_window[window] += 1
            delivered_at = self.unmatched.pop(transaction_id, None)
            if delivered_at is None:
                self.pending[transaction_id] = returned_at
            else:  # read in the topic before this thread recorded the send
                self.seconds[window].append(delivered_at - returned_at)

    def follow(self) -> None:
        for transaction_id, delivered_at, _ in self.follower.read_new():
            with self._lock:
                returned_at = self.pending.pop(transaction_id, None)
                if returned_at is None:  # a duplicate, or not sent (the counts tell), or its send not recorded yet
                    self.unmatched[transaction_id] = delivered_at
                else:
                    self.seconds[self.window_of(returned_at)].append(delivered_at - returned_at)

    def run(self) -> None:
        while not self._halt.wait(FOLLOW_EVERY_S):
            self.follow()

    def drain(self, timeout_s: float) -> None:
        """Wait until nothing sent is pending, for ``timeout_s`` at most."""
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            time.sleep(1)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.follow()
        self._sent_file.close()


class Monitor(threading.Thread):
    """Every ``memory_every_s`` seconds, the RSS of the checker job's process tree (``supervisor.current``:
    after a kill, the new run's) and of this process; every ``log_every_s``, the size of the commit log's
    ``_delta_log`` and the free space on its disk (below ``min_free_bytes``, it calls ``halt_sending`` once
    and says why in ``aborted``: the machine is shared); at each window's end, every table's shape."""

    def __init__(self, supervisor: Supervisor, lakehouse: str, tables: dict[str, str], t0: float, window_s: float,
                 windows: int, memory_every_s: float, log_every_s: float, min_free_bytes: float):
        super().__init__(name="monitor", daemon=True)
        import psutil

        self.supervisor, self.lakehouse, self.tables = supervisor, lakehouse, tables
        self.commit_log = tables[COMMIT_LOG]
        self.t0, self.window_s, self.windows = t0, window_s, windows
        self.memory_every_s, self.log_every_s, self.min_free_bytes = memory_every_s, log_every_s, min_free_bytes
        self.halt_sending: Callable[[], None] = lambda: None  # the sender's, once it exists
        self.aborted: Optional[str] = None
        self.this_process = psutil.Process()
        self.samples: list[dict] = []  # memory
        self.log_samples: list[dict] = []  # the commit log's _delta_log
        self.shapes: list[dict] = []  # one per window ended
        self.errors: list[str] = []
        self._halt = threading.Event()

    def now_s(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def sample_memory(self, at_s: Optional[float] = None) -> None:
        """One memory sample, at ``at_s`` (default: now)."""
        tree = support.process_tree_rss(self.supervisor.current.process.pid) or {
            "total_mib": 0.0, "total_pss_mib": 0.0, "jvm_mib": 0.0, "other_mib": 0.0, "processes": 0}
        self.samples.append({"at_s": self.now_s() if at_s is None else at_s,
                             "checker_run": len(self.supervisor.restarts) + 1,
                             "checker_tree_mib": tree["total_mib"], "checker_tree_pss_mib": tree["total_pss_mib"],
                             "checker_jvm_mib": tree["jvm_mib"],
                             "checker_other_mib": tree["other_mib"], "checker_processes": tree["processes"],
                             "producer_mib": round(self.this_process.memory_info().rss / 2**20, 1)})

    def sample_log(self) -> None:
        size = support.delta_log_size(self.commit_log)
        if size is not None:
            self.log_samples.append({"at_s": self.now_s(), "log_bytes": size["log_bytes"], "log_files": size["log_files"]})
        free = shutil.disk_usage(self.lakehouse).free
        if free < self.min_free_bytes and self.aborted is None:
            self.aborted = (f"sending stopped at {self.now_s()} s: {free / 2**30:.1f} GiB free on the lakehouse's disk, "
                            f"less than --min-free-gib {self.min_free_bytes / 2**30:g}")
            print(f"  ABORTED: {self.aborted}", flush=True)
            self.halt_sending()

    def end_window(self) -> None:
        """Take the window's closing memory sample and its shapes, both counted in it: every window has a
        sample however late the previous end (the shapes take a while) left the series."""
        window = len(self.shapes)
        at_s = self.now_s()
        in_window_s = min(at_s, (window + 1) * self.window_s - 0.1)  # in the window it ends
        self.attempt(self.sample_memory, in_window_s)
        self.shapes.append(shapes(self.tables))
        log = self.shapes[-1][COMMIT_LOG]
        if log.get("exists"):
            self.log_samples.append({"at_s": in_window_s, "log_bytes": log["log_bytes"], "log_files": log["log_files"]})
        in_window = [s for s in self.samples if window * self.window_s <= s["at_s"] < (window + 1) * self.window_s]
        print(f"  [{at_s:7.1f} s] window {window + 1}/{self.windows} ends: checker tree max "
              f"{max((s['checker_tree_mib'] for s in in_window), default=None)} MiB, producer max "
              f"{max((s['producer_mib'] for s in in_window), default=None)} MiB; commit log v{log.get('version')}, "
              f"_delta_log {log.get('log_files')} files, {log.get('log_bytes')} bytes", flush=True)

    def run(self) -> None:
        next_memory = next_log = self.t0
        while not self._halt.is_set():
            now = time.monotonic()
            # The last window ends with the sending: stop() takes its shapes.
            next_window = (self.t0 + (len(self.shapes) + 1) * self.window_s if len(self.shapes) < self.windows - 1
                           else math.inf)
            if now >= next_window:
                self.end_window()
            elif now >= next_memory:
                next_memory = max(next_memory + self.memory_every_s, now)
                self.attempt(self.sample_memory)
            elif now >= next_log:
                next_log = max(next_log + self.log_every_s, now)
                self.attempt(self.sample_log)
            else:
                self._halt.wait(min(next_window, next_memory, next_log) - now)

    def attempt(self, sample: Callable[..., None], *args) -> None:
        """One sample; an error is counted and shown, and the series goes on."""
        try:
            sample(*args)
        except Exception as exc:
            self.errors.append(f"{self.now_s()} s, {sample.__name__}: {type(exc).__name__}: {exc}")
            print(f"  monitor: {self.errors[-1]}", flush=True)

    def stop(self) -> None:
        """Stop sampling (sending is over) and take the shapes of the windows not ended yet."""
        self._halt.set()
        self.join()
        while len(self.shapes) < self.windows:
            self.end_window()


def table_paths(lakehouse: str) -> dict[str, str]:
    """Name → path of every table whose shape is followed: the commit log, each system table, the group's
    check requests and the topic."""
    from coordinator.lakehouse import Lakehouse
    from coordinator.tables import SYSTEM_TABLES

    place = Lakehouse(lakehouse)
    return {COMMIT_LOG: place.commit_log(GROUP),
            **{table.name: place.path(table) for table in SYSTEM_TABLES},
            f"groups/{GROUP}/check_requests": place.check_requests(GROUP), f"topics/{TOPIC}": place.topic(TOPIC)}


def shapes(tables: dict[str, str]) -> dict:
    return {name: shape(path) for name, path in tables.items()}


def shape(path: str, attempts: int = 3) -> dict:
    """:func:`support.table_shape`, tried again on an error: listing a log while a writer adds to it may
    see a gap between versions, which delta-rs refuses. If every attempt fails, the ``_delta_log``'s size
    alone, with the last ``error``."""
    for attempt in range(attempts):
        try:
            return support.table_shape(path)
        except Exception as exc:  # DeltaError: "Expected contiguous commit files, but found gap"
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            time.sleep(0.5)
    log = support.delta_log_size(path)
    return {"exists": log is not None, "version": None, **(log or {}), "active_files": None,
            "parquet_files_on_disk": None, "error": error}


def topic_counts(lakehouse: str, sent_path: str) -> dict:
    """``lost``, ``duplicated`` and ``not_committed``, from the topic table's snapshot against the sent ids."""
    from coordinator.lakehouse import Lakehouse, read_table

    place = Lakehouse(lakehouse)
    sent = set(Path(sent_path).read_text().split())
    rows = (read_table(place.topic(TOPIC), ["transaction_id"]).column("transaction_id").to_pylist()
            if place.exists(f"topics/{TOPIC}") else [])
    counts = support.tally_deliveries(sent, rows).counts()
    # This producer only commits: a delivered transaction it never sent was never committed.
    return {"lost": counts["lost"], "duplicated": counts["duplicated"], "not_committed": counts["unexpected"],
            "topic_rows": len(rows)}


def caught_up(restarts: list[dict], lag_samples: list[tuple[float, int, int]], before_s: float = 30.0) -> None:
    """Set each restart's ``caught_up_s``: from the kill to the first lag sample, after the new run's first
    batch, at most the highest lag of the ``before_s`` seconds before the kill (``None``: never, or no lag
    sampled before the kill), and ``lag_max_versions``, the highest lag in between (the backlog)."""
    for restart in restarts:
        kill_s = restart["at_s"]
        before = [lag for t, lag, _ in lag_samples if kill_s - before_s <= t < kill_s]
        restart["caught_up_s"] = restart["lag_max_versions"] = None
        if not before or restart["restart_s"] is None:
            continue
        after = [(t, lag) for t, lag, _ in lag_samples if t >= kill_s]
        caught = next((t for t, lag in after if t >= kill_s + restart["restart_s"] and lag <= max(before)), None)
        if caught is not None:
            restart["caught_up_s"] = round(caught - kill_s, 1)
            restart["lag_max_versions"] = max(lag for t, lag in after if t <= caught)


def ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds * 1000, 1)


def window_figures(window_s: float, send_seconds: float, latencies: Latencies, monitor: Monitor,
                   supervisor: Supervisor, maintainer: Maintainer, sampler: support.LagSampler,
                   metrics: list[dict], start_wall: datetime) -> list[dict]:
    windows = []
    for w in range(latencies.windows):
        start, end = w * window_s, (w + 1) * window_s
        if w == latencies.windows - 1:
            end = max(end, send_seconds) + 0.1  # the last takes the sends in flight at its end (times rounded to 0.1 s)
        seconds = sorted(latencies.seconds[w])

        def inside(at_s: float) -> bool:
            return start <= at_s < end

        samples = [s for s in monitor.samples if inside(s["at_s"])]
        log_samples = [s for s in monitor.log_samples if inside(s["at_s"])]
        batches = [m["duration_ms"] for m in metrics if inside((m["started_at"] - start_wall).total_seconds())]
        restarts = [r for r in supervisor.restarts if inside(r["at_s"])]
        maintenance = [r["peak_rss_mib"] for r in maintainer.runs if inside(r["at_s"])]
        windows.append({
            "window": w + 1,
            "from_s": round(start, 1), "to_s": round(end, 1),
            "sent": latencies.sent_by_window[w],
            "delivered": len(seconds),
            "e2e_p50_ms": ms(harness.percentile(seconds, 0.5)),
            "e2e_p99_ms": ms(harness.percentile(seconds, 0.99)),
            "e2e_max_ms": ms(seconds[-1] if seconds else None),
            "batches": len(batches),
            "batch_ms_median": harness.median(batches),
            "lag_max_versions": max(sampler.between(start, end), default=None),
            "kills": len(restarts),
            "restart_s": [r["restart_s"] for r in restarts],
            "caught_up_s": [r["caught_up_s"] for r in restarts],
            "memory_samples": len(samples),
            "rss_max_mib": {
                "checker_tree": max((s["checker_tree_mib"] for s in samples), default=None),
                "checker_tree_pss": max((s["checker_tree_pss_mib"] for s in samples), default=None),
                "checker_jvm": max((s["checker_jvm_mib"] for s in samples), default=None),
                "checker_other": max((s["checker_other_mib"] for s in samples), default=None),
                "producer": max((s["producer_mib"] for s in samples), default=None),
                "maintenance": max(maintenance, default=None),
            },
            "commit_log_delta_log_bytes_max": max((s["log_bytes"] for s in log_samples), default=None),
            "commit_log_delta_log_files_max": max((s["log_files"] for s in log_samples), default=None),
            "commit_log_size_samples": len(log_samples),
            "tables": {name: shape if shape.get("exists") else None for name, shape in monitor.shapes[w].items()},
        })
    return windows


def last_over_second(windows: list[dict], figures: dict) -> dict:
    """Each figure's second and last window and their ratio (``None`` without two windows or a figure)."""
    ratios = {}
    for name, figure in figures.items():
        second, last = (figure(windows[1]), figure(windows[-1])) if len(windows) >= 2 else (None, None)
        ratios[name] = {"second": second, "last": last,
                        "ratio": round(last / second, 3) if second and last is not None else None}
    return ratios


def verdict(windows: list[dict], counts: dict, aborted: Optional[str]) -> dict:
    """``flat_ratios`` (:data:`FLAT_FIGURES`, last window over the second), ``other_ratios``
    (:data:`OTHER_FIGURES`) and ``flat``: every flat ratio ≤ :data:`FLAT_TOLERANCE` and every count 0
    (never with fewer than two windows, nor in a run ``aborted`` early)."""
    ratios = last_over_second(windows, FLAT_FIGURES)
    flat = (aborted is None and all(r["ratio"] is not None and r["ratio"] <= FLAT_TOLERANCE for r in ratios.values())
            and all(counts[name] == 0 for name in COUNTS))
    return {"flat_ratios": ratios, "other_ratios": last_over_second(windows, OTHER_FIGURES), "flat": flat}


def mib(size: Optional[int]) -> Optional[float]:
    return None if size is None else round(size / 2**20, 1)


def print_report(report: dict) -> None:
    print(f"\n{'window':>6} {'sent':>8} {'deliv':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'batches':>7} "
          f"{'batch ms':>8} {'lag':>5} {'kills':>5} {'restart s':>9} {'checker':>8} {'(PSS)':>8} {'JVM':>7} {'other':>7} "
          f"{'producer':>8} {'maint':>7} {'log MiB':>8}  (peak RSS, MiB; commit log's _delta_log at its peak)")
    for w in report["windows"]:
        rss = w["rss_max_mib"]
        print(f"{w['window']:>6} {w['sent']:>8} {w['delivered']:>8} {w['e2e_p50_ms']!s:>9} {w['e2e_p99_ms']!s:>9} "
              f"{w['e2e_max_ms']!s:>9} {w['batches']:>7} {w['batch_ms_median']!s:>8} {w['lag_max_versions']!s:>5} "
              f"{w['kills']:>5} {','.join(map(str, w['restart_s'])) or '-':>9} {rss['checker_tree']!s:>8} "
              f"{rss['checker_tree_pss']!s:>8} "
              f"{rss['checker_jvm']!s:>7} {rss['checker_other']!s:>7} {rss['producer']!s:>8} {rss['maintenance']!s:>7} "
              f"{mib(w['commit_log_delta_log_bytes_max'])!s:>8}")
    print(f"\n{'at each window end':>24} " + " ".join(f"{'w' + str(w['window']):>22}" for w in report["windows"]))
    print(f"{'':>24} " + " ".join(f"{'version/log files/KiB':>22}" for _ in report["windows"]))
    for name in report["windows"][0]["tables"]:
        cells = []
        for w in report["windows"]:
            shape = w["tables"][name]
            cells.append("-" if shape is None else
                         f"{shape['version'] if shape['version'] is not None else '?'}/{shape['log_files']}/"
                         f"{round(shape['log_bytes'] / 1024)}")
        print(f"{name:>24} " + " ".join(f"{cell:>22}" for cell in cells))
    print(f"\n{'':>24} {'data files: active → on disk, at start → end → after one more maintenance run':>64}")
    for name in report["shape_start"]:
        a, b, c = (report[key][name] for key in ("shape_start", "shape_end", "shape_end_after_maintenance"))
        if not c.get("exists"):
            print(f"{name:>24} (no table)")
            continue
        a, b = (x if x.get("exists") else {k: 0 for k in c} for x in (a, b))
        print(f"{name:>24} " + "  ".join(f"{x['active_files']}→{x['parquet_files_on_disk']}" for x in (a, b, c)))
    f = report
    print(f"\nsent {f['sent']} ({f['achieved_txn_per_s']} txn/s of {f['args']['rate']:g} offered), {f['unsent']} unsent, "
          f"{f['send_errors']} errors; drained {f['drained_after_s']} s after sending; lag max {f['lag_max_versions']}")
    print(f"kills {f['kills']}, restart (kill → first batch) s: {', '.join(map(str, f['restart_s'])) or '-'}, "
          f"caught up (lag back to its level before the kill) s: {', '.join(map(str, f['caught_up_s'])) or '-'}; "
          f"maintenance runs {len(f['maintenance_runs'])} ({f['maintenance_errors']} failed); checker exit code "
          f"{f['checker_exit_code']}")
    counts = f["counts"]
    print(f"counts: lost {counts['lost']}, duplicated {counts['duplicated']}, not committed {counts['not_committed']} "
          f"({counts['topic_rows']} topic rows; topic versions missed by the follower {f['topic_versions_missed']})")
    print("last window / second: " + ", ".join(
        f"{name} {r['last']}/{r['second']} = {r['ratio']}" for name, r in f["flat_ratios"].items()))
    print("  not judged: " + ", ".join(
        f"{name} {r['last']}/{r['second']} = {r['ratio']}" for name, r in f["other_ratios"].items()))
    for error in f["monitor_errors"] + f["shape_errors"]:
        print(f"monitor error: {error}")
    if f["aborted"]:
        print(f"ABORTED: {f['aborted']}")
    print(f"verdict: {'FLAT' if f['flat'] else 'NOT flat'} (each ratio ≤ {FLAT_TOLERANCE}, every count 0)", flush=True)


def main(argv: list[str] | None = None) -> dict:
    from coordinator import CoordinatorConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60, help="sending time")
    parser.add_argument("--rate", type=float, default=1000, help="offered transactions per second")
    parser.add_argument("--threads", type=int, default=128, help="sender threads (≥ rate × send latency)")
    parser.add_argument("--window-minutes", type=float, default=10, help="length of a report window")
    parser.add_argument("--kill-every", type=float, default=600,
                        help="seconds between two kill -9 of the checker job, each restarted at once (0: none)")
    parser.add_argument("--memory-every", type=float, default=5, help="seconds between two RSS samples")
    parser.add_argument("--log-every", type=float, default=30,
                        help="seconds between two samples of the commit log's _delta_log size (a stat per file)")
    parser.add_argument("--min-free-gib", type=float, default=10,
                        help="stop sending early (the run is then not flat) when the lakehouse's disk has less free")
    parser.add_argument("--trigger-ms", type=int, default=CoordinatorConfig().trigger_interval_ms,
                        help="checker trigger_interval_ms (default: the product default)")
    parser.add_argument("--maintenance-every", type=float, default=300, help="seconds between maintenance runs")
    parser.add_argument("--retention-hours", type=int, default=1)
    parser.add_argument("--log-retention-hours", type=float, default=0.1,
                        help="maintain's log_retention_hours: how long the Delta logs keep a commit")
    parser.add_argument("--drain", type=float, default=300, help="seconds to wait for the last deliveries")
    parser.add_argument("--startup-timeout", type=float, default=300,
                        help="seconds to wait for a checker run's first batch")
    parser.add_argument("--lakehouse", default=None, help="default: a temporary directory, removed afterwards")
    parser.add_argument("--results", default=str(harness.RESULTS / "soak.json"))
    args = harness.parse_args(parser, argv, "soak", TINY)
    report = harness.start_report("soak", vars(args))

    from coordinator import TransactionProducer
    from coordinator.lakehouse import Lakehouse, read_table
    from coordinator.tables import METRICS

    seconds = args.minutes * 60
    window_s = args.window_minutes * 60
    windows = max(1, math.ceil(round(seconds / window_s, 6)))
    lakehouse, checker = support.checker_on_fresh_lakehouse(args.lakehouse, "soak", args.trigger_ms)
    tables = table_paths(lakehouse)
    sent_path = os.path.join(lakehouse, "sent-transaction-ids.txt")
    sampler = maintainer = supervisor = latencies = monitor = None
    try:
        print(f"starting the checker (trigger {args.trigger_ms} ms)...", flush=True)
        report["checker_start_s"] = checker.wait_ready(args.startup_timeout)
        print(f"  first batch after {report['checker_start_s']} s; {args.rate:g} txn/s for {args.minutes:g} min "
              f"({windows} windows of {args.window_minutes:g} min), a checker kill every {args.kill_every:g} s, "
              f"maintenance every {args.maintenance_every:g} s", flush=True)
        report["shape_start"] = shapes(tables)
        t0, t0_wall = time.monotonic(), time.time()
        start_wall = datetime.now(timezone.utc)
        sampler = support.LagSampler(checker, t0)  # the lag is read from the lakehouse: any run's
        maintainer = Maintainer(checker.config_path, os.path.join(lakehouse, "maintenance.log"), args.maintenance_every,
                                args.retention_hours, args.log_retention_hours, t0)
        supervisor = Supervisor(checker, lakehouse, args.kill_every, seconds, t0, args.startup_timeout)
        latencies = Latencies(lakehouse, t0_wall, window_s, windows, sent_path)
        monitor = Monitor(supervisor, lakehouse, tables, t0, window_s, windows, args.memory_every, args.log_every,
                          args.min_free_gib * 2**30)
        for thread in (sampler, maintainer, supervisor, latencies, monitor):
            thread.start()
        config = CoordinatorConfig(lakehouse=lakehouse)
        with TransactionProducer(GROUP, support.Commits(), config) as producer:
            sender = support.SteadySender(producer, TOPIC, args.rate, seconds, args.threads, on_sent=latencies.sent)
            monitor.halt_sending = sender.halt
            if monitor.aborted:
                sender.halt()
            send_seconds = sender.run()
        end_wall = datetime.now(timezone.utc)
        monitor.stop()  # the memory series is the sending time's; the last window's shapes are taken now
        report["shape_end"] = monitor.shapes[-1]
        print(f"  sent {sender.sent_count} of {sender.total} in {send_seconds:.1f} s; waiting for delivery...", flush=True)
        maintainer.stop()
        supervisor.stop()  # no kill once sending is over (a restart under way is waited for)
        latencies.drain(args.drain - (time.monotonic() - t0 - send_seconds))
        drained_after = round(time.monotonic() - t0 - send_seconds, 1)
    finally:
        for thread in (monitor, maintainer, latencies, supervisor, sampler):
            if thread is not None and thread.is_alive():
                thread.stop()
        exit_code = (supervisor.current if supervisor else checker).stop()
    # The end shape depends on how long ago maintenance last ran: one more run shows what it leaves.
    last_maintenance = maintainer.run_once()
    report["shape_end_after_maintenance"] = shapes(tables)
    counts = topic_counts(lakehouse, sent_path)

    metrics = read_table(Lakehouse(lakehouse).path(METRICS), ["batch_id", "started_at", "duration_ms", "records"]).to_pylist()
    during = [m for m in metrics if start_wall <= m["started_at"] <= end_wall]
    lags = [lag for _, lag, _ in sampler.samples]
    caught_up(supervisor.restarts, sampler.samples)
    window_list = window_figures(window_s, send_seconds, latencies, monitor, supervisor, maintainer, sampler, during, start_wall)
    restarts = [r["restart_s"] for r in supervisor.restarts]
    report.update({
        "sent": sender.sent_count,
        "achieved_txn_per_s": round(sender.sent_count / send_seconds, 1),
        "send_errors": sender.errors,
        "unsent": sender.unsent,
        "send_seconds": round(send_seconds, 1),
        "undelivered_after_drain": len(latencies.pending),
        "drained_after_s": drained_after,
        "topic_versions_missed": latencies.follower.versions_missed,
        "batches": len(during),
        "lag_max_versions": max(lags, default=None),
        "lag_end_versions": lags[-1] if lags else None,
        "kills": len(supervisor.restarts),
        "restart_s": restarts,
        "restart_s_median": harness.median([s for s in restarts if s is not None]),
        "restart_s_max": max((s for s in restarts if s is not None), default=None),
        "caught_up_s": [r["caught_up_s"] for r in supervisor.restarts],
        "restarts": supervisor.restarts,
        "maintenance_runs": maintainer.runs,
        "maintenance_errors": sum(1 for run in maintainer.runs if run["error"]),
        "maintenance_after_stop": last_maintenance,
        "checker_exit_code": exit_code,
        "aborted": monitor.aborted,
        "monitor_errors": monitor.errors,
        "shape_errors": sorted({f"{name}: {s['error']}" for w in window_list for name, s in w["tables"].items()
                                if s and s.get("error")}),
        "windows": window_list,
        "counts": counts,
        "flat_tolerance": FLAT_TOLERANCE,
        **verdict(window_list, counts, monitor.aborted),
    })
    print_report(report)
    report["memory_samples"] = monitor.samples
    report["commit_log_size_samples"] = monitor.log_samples
    report["batch_durations"] = [(m["batch_id"], m["started_at"].isoformat(), m["duration_ms"], m["records"])
                                 for m in metrics]
    report["lag_samples"] = sampler.samples
    if args.lakehouse is None:
        shutil.rmtree(lakehouse, ignore_errors=True)
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
