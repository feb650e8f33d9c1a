"""What every benchmark shares: the report envelope (time, machine, load), the ``--tiny`` option,
percentiles, the real checker job as a subprocess (and its log), a steady-rate producer, and Delta
log inspection.

Other engineers share this machine: every report records ``os.getloadavg()`` at start
and end, and a loaded machine is flagged at start, because its figures mean little.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, NamedTuple, Optional, Union
from urllib.parse import unquote

if TYPE_CHECKING:
    from coordinator.control.progress import Progress
    from coordinator.lakehouse import Lakehouse

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
BODY = b"x" * 200
#: Above this 1-minute load average (on this 2-core machine) the figures are not worth much.
LOAD_WARNING = 1.5


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def start_report(benchmark: str, args: dict) -> dict:
    """The report's envelope, with the load average now; warns when the machine is busy."""
    now = load()
    if now[0] > LOAD_WARNING:
        print(f"WARNING: 1-minute load average {now[0]} > {LOAD_WARNING} on {os.cpu_count()} cores: "
              "other jobs are running, these figures are not representative", file=sys.stderr, flush=True)
    return {
        "benchmark": benchmark,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "loadavg_start": now,
        "args": args,
    }


def finish_report(report: dict, path: Path) -> dict:
    """Stamp the end load average and write the report as JSON to ``path``."""
    report["loadavg_end"] = load()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average (1, 5, 15 min): start {report['loadavg_start']}, end {report['loadavg_end']}; "
          f"written to {path}", flush=True)
    return report


TINY_HELP = ("the smallest run that still goes through the whole benchmark, in seconds, for the tests "
             "(tests/test_bench.py): its figures mean nothing; options given explicitly still win")


def parse_args(parser: argparse.ArgumentParser, argv: Optional[list[str]], benchmark: str,
               tiny: Mapping[str, object]) -> argparse.Namespace:
    """``parser``'s arguments from ``argv``, with a ``--tiny`` option: it makes ``tiny`` (option
    destinations → values) the defaults, and ``bench/results/<benchmark>-tiny.json`` the default
    results file (gitignored), so that a tiny run never overwrites a real one.

    Tiny runs exist so that a benchmark cannot rot: the tests run each one and check what it reports.

    Example::

        args = benchlib.parse_args(parser, argv, "cold_start", {"runs": 1})
    """
    parser.add_argument("--tiny", action="store_true", help=TINY_HELP)
    if parser.parse_known_args(argv)[0].tiny:
        parser.set_defaults(**tiny, results=str(RESULTS / f"{benchmark}-tiny.json"))
    return parser.parse_args(argv)


def percentile(values: list[float], q: float) -> Optional[float]:
    """The ``q`` quantile by nearest rank (``None`` for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# ---------------------------------------------------------------------------------------------
# Delta logs, read as files (no JVM, no delta-rs dataset), on a local disk or object storage


def log_versions(table_path: str, storage: Optional[Mapping[str, str]] = None) -> list[int]:
    """The commit versions whose JSON is in ``_delta_log`` (log cleanup removes old ones); ``storage``
    reaches a table on object storage (``s3://...``)."""
    from coordinator.storage import FileStore

    names = (key.rsplit("/", 1)[-1] for key in FileStore.at(table_path, storage).list("_delta_log"))
    return sorted(int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit())


def latest_version(table_path: str, storage: Optional[Mapping[str, str]] = None) -> int:
    """The table's latest version, from the highest ``_delta_log/<version>.json`` (-1 if none)."""
    return max(log_versions(table_path, storage), default=-1)


def commits(table_path: str, storage: Optional[Mapping[str, str]] = None, from_version: int = 0) -> list[dict]:
    """Every commit from ``from_version`` on whose JSON is still in the log: ``version``, ``timestamp_ms``
    (commitInfo), ``log_mtime`` (when the JSON file was written, in seconds: on object storage its
    Last-Modified, whole seconds rounded up) and the data files it ``added`` (paths relative to the table)."""
    from coordinator.storage import FileStore

    files = FileStore.at(table_path, storage)
    result = []
    for version in log_versions(table_path, storage):
        if version < from_version:
            continue
        log_file = files.read(f"_delta_log/{version:020d}.json")
        if log_file is None:  # removed by log cleanup since it was listed
            continue
        timestamp_ms, added = None, []
        for line in log_file.data.splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                timestamp_ms = action["commitInfo"].get("timestamp")
            elif "add" in action and action["add"].get("dataChange", True):
                added.append(unquote(action["add"]["path"]))
        result.append({"version": version, "timestamp_ms": timestamp_ms, "log_mtime": log_file.modified_ms / 1000,
                       "added": added})
    return result


class Delivery(NamedTuple):
    """When a transaction's message became readable in its topic table, and how many rows it has there."""

    timestamp_s: float  # commitInfo timestamp of the topic version that first held it
    log_mtime: float  # when that version's log file was written
    rows: int


def deliveries(lakehouse: Union[str, Lakehouse], topic: str) -> dict[str, Delivery]:
    """Transaction id → :class:`Delivery`, for every transaction in the topic table's log (none before
    the table exists)."""
    found: dict[str, Delivery] = {}
    for tid, timestamp_s, log_mtime in TopicFollower(lakehouse, topic).read_new():
        first = found.get(tid)
        found[tid] = Delivery(timestamp_s, log_mtime, 1) if first is None else first._replace(rows=first.rows + 1)
    return found


class TopicFollower:
    """Reads a topic table's log as it grows: each :meth:`read_new` reads only the versions written since the
    last call. Log cleanup (maintenance's ``log_retention_hours``) removes old JSON commits, so a run with
    maintenance on must follow the log while it runs, not read it all at the end; ``versions_missed`` counts
    the versions cleaned up before they were read.

    Example::

        follower = TopicFollower(lakehouse, "ORDERS")
        for transaction_id, timestamp_s, log_mtime in follower.read_new():  # every few seconds
            ...
    """

    def __init__(self, lakehouse: Union[str, Lakehouse], topic: str):
        from coordinator.lakehouse import Lakehouse
        from coordinator.storage import FileStore

        self.lakehouse = Lakehouse.at(lakehouse)
        self.table_path = self.lakehouse.topic(topic)
        self.files = FileStore.at(self.table_path, self.lakehouse.storage)
        self.next_version = 0
        self.versions_missed = 0

    def read_new(self) -> Iterator[tuple[str, float, float]]:
        """``(transaction id, commit timestamp of its version in seconds, that version's log file mtime)`` for
        each row the versions written since the last call added (none before the table exists)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        for commit in commits(self.table_path, self.lakehouse.storage, from_version=self.next_version):
            tids = []
            if commit["timestamp_ms"] is not None:
                for path in commit["added"]:
                    data = pa.BufferReader(self.files.read(path).data)
                    tids += pq.read_table(data, columns=["transaction_id"]).column("transaction_id").to_pylist()
            # Only once the whole version is read: a read that fails is tried again, whole, by the next call.
            self.versions_missed += commit["version"] - self.next_version
            self.next_version = commit["version"] + 1
            for tid in tids:
                yield tid, commit["timestamp_ms"] / 1000, commit["log_mtime"]


def delta_log_size(table_path: str) -> Optional[dict]:
    """A local table's ``_delta_log``: JSON commits, checkpoints, both together (``log_files``) and the bytes
    of everything in it (``log_bytes``); ``None`` before the table exists. A stat per file: at a few hundred
    thousand files, a fraction of a second."""
    log_dir = os.path.join(table_path, "_delta_log")
    if not os.path.isdir(log_dir):
        return None
    json_files = checkpoints = log_bytes = 0
    with os.scandir(log_dir) as entries:
        for entry in entries:
            name = entry.name
            if name.endswith(".json") and name[:-5].isdigit():
                json_files += 1
            elif ".checkpoint." in name and name.endswith(".parquet"):
                checkpoints += 1
            with contextlib.suppress(FileNotFoundError):  # removed by log cleanup since it was listed
                log_bytes += entry.stat().st_size if entry.is_file() else 0
    return {"log_json_files": json_files, "checkpoints": checkpoints, "log_files": json_files + checkpoints,
            "log_bytes": log_bytes}


def table_shape(table_path: str) -> dict:
    """How big a table's log and file set are: its version, JSON commits in ``_delta_log``, checkpoints,
    both together and the bytes of the whole ``_delta_log`` (:func:`delta_log_size`), data files in the
    current snapshot and Parquet files on disk (those not yet vacuumed)."""
    from deltalake import DeltaTable

    log = delta_log_size(table_path)
    if log is None:
        return {"exists": False}
    on_disk = sum(1 for _, _, files in os.walk(table_path) for name in files
                  if name.endswith(".parquet") and "_delta_log" not in name)
    table = DeltaTable(table_path)
    return {
        "exists": True,
        "version": table.version(),
        **log,
        "active_files": len(table.file_uris()),
        "parquet_files_on_disk": on_disk,
    }


# ---------------------------------------------------------------------------------------------
# The real checker job


class _Job:
    """A process of its own (``process``, in its own session) writing to ``log_file``; a context manager that stops it."""

    process: subprocess.Popen
    log_file: Any
    exit_code: Optional[int]

    def _stop(self, sig: int, timeout_s: float) -> int:
        """Send ``sig``, SIGKILL its process group after ``timeout_s``; its exit status (once known, kept)."""
        if self.exit_code is not None:
            return self.exit_code
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return self.kill()
        self.exit_code = self.process.returncode
        self.log_file.close()
        return self.exit_code

    def kill(self) -> int:
        """SIGKILL its whole process group at once, as a crash (``kill -9``: no batch finished, nothing
        released), and wait for it; its exit status (-9)."""
        if self.exit_code is not None:
            return self.exit_code
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.exit_code = self.process.returncode
        self.log_file.close()
        return self.exit_code

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()  # each job's own way of asking it to end


class CheckerJob(_Job):
    """``spark-submit jobs/checker.py`` on a lakehouse, as deployed; its output goes to ``log_path``.

    Example::

        with CheckerJob(config_path, lakehouse) as checker:
            checker.wait_ready(180)
            checker.lag()
    """

    def __init__(self, config_path: str, lakehouse: Union[str, Lakehouse], log_path: str):
        from coordinator.spark import spark_submit
        from coordinator.control.progress import CheckerProgress
        from coordinator.lakehouse import Lakehouse

        self.lakehouse = Lakehouse.at(lakehouse)
        self._progress = CheckerProgress(self.lakehouse)
        argv, env = spark_submit(ROOT / "jobs" / "checker.py", "--config", config_path)
        self.config_path = config_path
        self.log_file = open(log_path, "w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.exit_code: Optional[int] = None

    def progress(self) -> Optional[Progress]:
        """The checker's progress record (``system/_checker_progress.json``), ``None`` before it wrote one."""
        return self._progress.load()

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

    def wait_ready(self, timeout_s: float) -> float:
        """Wait for the checker's first batch to be announced; return the seconds it took to start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            progress = self.progress()
            if progress is not None and progress.last_batch is not None:
                return round(time.monotonic() - self.started, 1)
            if self.process.poll() is not None:
                raise RuntimeError(f"the checker exited with {self.process.returncode} before its first batch; "
                                   f"see {self.log_file.name}")
            time.sleep(0.5)
        raise RuntimeError(f"the checker ran no batch within {timeout_s} s; see {self.log_file.name}")

    def stop(self, timeout_s: float = 120) -> int:
        """SIGTERM (the checker finishes its batch and exits 0); SIGKILL after ``timeout_s``."""
        return self._stop(signal.SIGTERM, timeout_s)


def write_config(lakehouse: Union[str, Lakehouse], directory: Optional[str] = None, **settings) -> str:
    """A coordinator TOML for ``lakehouse`` (its storage settings as the ``[storage]`` table) with
    ``settings``, written in ``directory`` (default: the lakehouse's own, a local one); returns its path."""
    from coordinator.lakehouse import Lakehouse

    lakehouse = Lakehouse.at(lakehouse)
    directory = directory or lakehouse.root
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "bench.toml")
    # A JSON string is a valid TOML basic string: quotes and backslashes stay safe.
    lines = [f"lakehouse = {json.dumps(lakehouse.root)}"] + [f"{key} = {value}" for key, value in settings.items()]
    if lakehouse.storage:
        lines += ["", "[storage]", *(f"{key} = {json.dumps(value)}" for key, value in lakehouse.storage.items())]
    Path(path).write_text("\n".join(lines) + "\n")
    return path


def checker_on_fresh_lakehouse(requested: Optional[str], benchmark: str, trigger_ms: int,
                               object_store: Optional[Lakehouse] = None, **settings) -> tuple[str, CheckerJob]:
    """The checker job on an empty lakehouse, not yet waited for, and the local directory that holds its
    TOML and log: ``requested`` (wiped) or a new temporary directory. That directory is the lakehouse
    too, unless ``object_store`` names an empty lakehouse on object storage (with its storage settings).
    ``settings`` go into the TOML beside ``trigger_interval_ms`` (``metrics_port=0``).
    Returns ``(directory, checker)``.

    Example::

        lakehouse, checker = checker_on_fresh_lakehouse(None, "e2e", trigger_ms=200)
    """
    import shutil
    import tempfile

    from coordinator.lakehouse import Lakehouse, init_lakehouse

    directory = requested or tempfile.mkdtemp(prefix=f"bench-{benchmark}-")
    if requested:
        shutil.rmtree(directory, ignore_errors=True)
    lakehouse = object_store or Lakehouse(directory)
    init_lakehouse(lakehouse)
    config_path = write_config(lakehouse, directory, trigger_interval_ms=trigger_ms, **settings)
    return directory, CheckerJob(config_path, lakehouse, os.path.join(directory, "checker.log"))


#: What the checker logs (coordinator/checker/query.py, batch.py) once its streaming query runs, and after each
#: finished batch. ``records=`` leaves out the other lines that name a batch (state rebuilt, append retried).
STARTED_LINE = b"checker started on "
STANDBY_LINE = b"standing by to take over"
BATCH_LINE = re.compile(rb"batch \d+: records=")
#: What the checker logs (coordinator/checker/exporter.py) once it serves its metrics (``metrics_port`` set).
METRICS_LINE = re.compile(rb"metrics served at (http://\S+/metrics)")


class CheckerLog:
    """Follows one checker run's log file as it grows: is it standing by, has its streaming query
    started, how many batches has it finished.

    Example::

        log = CheckerLog(checker.log_file.name)
        log.follow()
        log.query_started, log.batches
    """

    def __init__(self, path: str):
        self.path = path
        self.standing_by = False
        self.query_started = False
        self.metrics_url: Optional[str] = None  # where it serves its Prometheus metrics, once it says so
        self.batches = 0
        self._read = 0  # bytes of complete lines already read

    def follow(self) -> int:
        """Read the complete lines written since the last call; return how many batches they finished."""
        try:
            with open(self.path, "rb") as log:
                log.seek(self._read)
                new = log.read()
        except FileNotFoundError:
            return 0
        complete = new[: new.rfind(b"\n") + 1]  # a line still being written is read next time, whole
        self._read += len(complete)
        self.standing_by = self.standing_by or STANDBY_LINE in complete
        self.query_started = self.query_started or STARTED_LINE in complete
        served = METRICS_LINE.search(complete)
        if served:
            self.metrics_url = served.group(1).decode()
        finished = len(BATCH_LINE.findall(complete))
        self.batches += finished
        return finished


class LagSampler(threading.Thread):
    """Samples the checker's lag (commit-log versions not yet read) once a second."""

    def __init__(self, checker: CheckerJob, t0: float):
        super().__init__(name="lag-sampler", daemon=True)
        self.checker, self.t0 = checker, t0
        self.samples: list[tuple[float, int, int]] = []  # (seconds since t0, lag, latest commit-log version)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(1.0):
            lag = self.checker.lag()
            if lag is not None:
                latest = self.checker.latest_commit_log_version()
                self.samples.append((round(time.monotonic() - self.t0, 1), lag, latest))

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def between(self, start_s: float, end_s: float) -> list[int]:
        return [lag for t, lag, _ in self.samples if start_s <= t < end_s]


# ---------------------------------------------------------------------------------------------
# Watching the checker as operators do: its metrics endpoint scraped, the web console open


#: What ``txcoord console`` prints once it listens (coordinator/cli/console.py).
CONSOLE_LINE = re.compile(rb"txcoord console: (http://\S+/) ")
_CSRF_INPUT = re.compile(r'<input[^>]*\bname="csrf_token"[^>]*>')
_VALUE = re.compile(r'\bvalue="([^"]*)"')
_META_REFRESH = re.compile(r'<meta[^>]*http-equiv="refresh"[^>]*content="(\d+(?:\.\d+)?)', re.IGNORECASE)
_IMG_SRC = re.compile(r'<img[^>]*\bsrc="([^"]+)"')


class ConsoleJob(_Job):
    """``txcoord console`` (the operators' web console) on a coordinator TOML, as a process of its own on
    any free loopback port, with a viewer created for it (a random password) in ``console-users.toml``
    beside the TOML; its output goes to ``log_path``. Stopped as systemd stops it (SIGTERM: the server closes,
    exit 0), SIGKILL after a timeout.

    Example::

        with ConsoleJob(checker.config_path, "/tmp/console.log") as console:
            console.wait_ready(60)   # console.url: 'http://127.0.0.1:41234/'
            ConsoleBrowser(console.url, console.username, console.password).sign_in()
    """

    USERNAME = "bench-viewer"

    def __init__(self, config_path: str, log_path: str, refresh_s: int = 5):
        import secrets

        txcoord = [sys.executable, "-m", "coordinator"]  # the txcoord command line of this interpreter
        self.users_path = os.path.join(os.path.dirname(config_path), "console-users.toml")
        self.username, self.password = self.USERNAME, secrets.token_urlsafe(18)
        added = subprocess.run([*txcoord, "console-user", "add", self.username, "--role", "viewer", "--password-stdin",
                                "--config", config_path, "--users", self.users_path],
                               input=self.password + "\n", text=True, capture_output=True, cwd=ROOT)
        if added.returncode != 0:
            raise RuntimeError(f"txcoord console-user add exited with {added.returncode}: {added.stderr.strip()}")
        self.log_file = open(log_path, "w")
        self.process = subprocess.Popen([*txcoord, "console", "--config", config_path, "--users", self.users_path,
                                         "--port", "0", "--refresh", str(refresh_s)],
                                        cwd=ROOT, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        self.url: Optional[str] = None
        self.exit_code: Optional[int] = None

    def wait_ready(self, timeout_s: float) -> str:
        """Wait for the console to say where it listens; return that URL."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_file.name, "rb") as log:
                found = CONSOLE_LINE.search(log.read())
            if found:
                self.url = found.group(1).decode()
                return self.url
            if self.process.poll() is not None:
                raise RuntimeError(f"txcoord console exited with {self.process.returncode}; see {self.log_file.name}")
            time.sleep(0.2)
        raise RuntimeError(f"txcoord console did not listen within {timeout_s} s; see {self.log_file.name}")

    def cpu_seconds(self) -> Optional[float]:
        """User and system CPU seconds the console process has used so far (``/proc``), None once it is gone."""
        try:
            with open(f"/proc/{self.process.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, as systemd stops it (the console closes its server and exits 0); SIGKILL after ``timeout_s``.

        Not SIGINT: a process started from a shell's background job (as `make test`'s second lane runs
        these benchmarks) inherits SIGINT ignored, and the console would never see it.
        """
        return self._stop(signal.SIGTERM, timeout_s)


class _Observer(threading.Thread):
    """A thread that repeats :meth:`observe` until :meth:`stop`, counting the attempts and the failed
    ones (the first few errors kept) and keeping each successful one's duration in seconds."""

    #: Errors kept for the report (the count has them all).
    KEPT_ERRORS = 5

    def __init__(self, name: str, timeout_s: float):
        super().__init__(name=name, daemon=True)
        import requests

        self.session = requests.Session()
        self.timeout_s = timeout_s
        self.attempts = 0
        self.failures = 0
        self.seconds: list[float] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def observe(self) -> None:
        raise NotImplementedError

    def attempt(self) -> bool:
        """One :meth:`observe`, timed and counted; whether it succeeded."""
        started = time.perf_counter()
        try:
            self.observe()
        except Exception as error:  # a failure to count, not to stop on
            self.attempts += 1
            self.failures += 1
            if len(self.errors) < self.KEPT_ERRORS:
                self.errors.append(f"{type(error).__name__}: {error}")
            return False
        self.seconds.append(time.perf_counter() - started)
        self.attempts += 1
        return True

    def stop(self) -> None:
        """Stop repeating (:meth:`attempt` may still be called)."""
        self._halt.set()
        if self.is_alive():
            self.join()


class MetricsScraper(_Observer):
    """Scrapes a Prometheus endpoint every ``interval_s`` on a fixed schedule, as Prometheus does (a scrape
    that overruns is followed at once by the next), keeping the last successful scrape's text.

    Example::

        scraper = MetricsScraper("http://127.0.0.1:9464/metrics")
        scraper.start(); ...; scraper.stop()
        scraper.attempts, scraper.failures, scraper.value("txcoord_messages_delivered_total")
    """

    def __init__(self, url: str, interval_s: float = 1.0, timeout_s: float = 5.0):
        super().__init__("metrics-scraper", timeout_s)
        self.url, self.interval_s = url, interval_s
        self.last_text: Optional[str] = None

    def observe(self) -> None:
        response = self.session.get(self.url, timeout=self.timeout_s)
        response.raise_for_status()
        self.last_text = response.text

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._halt.is_set():
            self.attempt()
            next_at = max(next_at + self.interval_s, time.monotonic())
            self._halt.wait(next_at - time.monotonic())

    def value(self, sample: str) -> Optional[float]:
        """The sum of the last successful scrape's samples named ``sample`` over their labels (``None``: no
        such sample, or no scrape yet)."""
        from prometheus_client.parser import text_string_to_metric_families

        if self.last_text is None:
            return None
        values = [s.value for family in text_string_to_metric_families(self.last_text) for s in family.samples
                  if s.name == sample]
        return sum(values) if values else None


class ConsoleBrowser(_Observer):
    """A browser with the console's overview open: signed in once (:meth:`sign_in`: the form's hidden
    ``csrf_token`` posted back with the session cookie), it loads ``url`` and every image the page embeds
    (its charts), one after the other, then loads them again when the page's meta refresh says, counted
    from the end of the load as a browser counts it, until stopped. A load fails on an error, a status
    other than 200, being sent back to the sign-in page, a page with no image or an image that is not SVG;
    a successful load's duration is the page's and its images'.

    Example::

        browser = ConsoleBrowser("http://127.0.0.1:8470/", "viewer", "a long password")
        browser.sign_in(); browser.start(); ...; browser.stop()
        browser.attempts, browser.failures, browser.refresh_s, browser.images, browser.by_path["/"]
    """

    def __init__(self, url: str, username: str, password: str, refresh_s: float = 5.0, timeout_s: float = 30.0):
        super().__init__("console-browser", timeout_s)
        self.url, self.username, self.password = url, username, password
        self.refresh_s = refresh_s  # until the page says otherwise
        self.images: Optional[int] = None  # images the last successful load fetched
        self.by_path: dict[str, list[float]] = {}  # path → seconds of each successful request of a load

    def sign_in(self) -> None:
        """Sign in through ``/login``'s form; raises ``RuntimeError`` if refused."""
        import html
        from urllib.parse import urljoin, urlparse

        login = urljoin(self.url, "login")
        page = self._get(login, "text/html", allow_login=True)
        field = _CSRF_INPUT.search(page.text)
        token = _VALUE.search(field.group(0)) if field else None
        if token is None:
            raise RuntimeError(f"no csrf_token input on {login}")
        signed = self.session.post(login, timeout=self.timeout_s, data={
            "username": self.username, "password": self.password, "csrf_token": html.unescape(token.group(1))})
        if signed.status_code != 200 or urlparse(signed.url).path == "/login":
            raise RuntimeError(f"the console refused the sign-in of {self.username}: HTTP {signed.status_code} "
                               f"at {signed.url}")

    def _get(self, url: str, content_type: str, allow_login: bool = False):
        from urllib.parse import urlparse

        started = time.perf_counter()
        response = self.session.get(url, timeout=self.timeout_s)
        seconds = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code} for {url}")
        if not allow_login and urlparse(response.url).path == "/login":
            raise RuntimeError(f"{url} led to the sign-in page: signed out")
        if not response.headers.get("Content-Type", "").startswith(content_type):
            raise RuntimeError(f"{url} is {response.headers.get('Content-Type')!r}, not {content_type}")
        if not allow_login:
            self.by_path.setdefault(urlparse(url).path, []).append(seconds)
        return response

    def observe(self) -> None:
        import html
        from urllib.parse import urljoin

        page = self._get(self.url, "text/html")
        refresh = _META_REFRESH.search(page.text)
        if refresh:
            self.refresh_s = float(refresh.group(1))
        images = [urljoin(page.url, html.unescape(src)) for src in _IMG_SRC.findall(page.text)]
        if not images:
            raise RuntimeError(f"{self.url} embeds no chart")
        for image in images:
            self._get(image, "image/svg+xml")
        self.images = len(images)

    def run(self) -> None:
        while not self._halt.is_set():
            self.attempt()
            self._halt.wait(self.refresh_s)


# ---------------------------------------------------------------------------------------------
# A steady offered rate


def send_on_schedule(send_one: Callable[[int], None], total: int, rate: float, threads: int,
                     deadline_s: Optional[float] = None, halt: Optional[threading.Event] = None) -> float:
    """Call ``send_one(k)`` for k in ``range(total)`` from ``threads`` threads, k at ``t0 + k / rate``
    (at once when ``rate`` is 0); return the seconds it took.

    The schedule is fixed in advance: a thread that falls behind sends at once, so a slow
    producer shows as a lower achieved rate, not a lower offered one. With ``deadline_s``, no send
    starts ``deadline_s`` or more after t0, so a run that falls behind still lasts its stated time;
    the sends in flight then finish, and the caller counts those never started. Once ``halt`` is set,
    no send starts either (the run ends early).

    Example::

        seconds = send_on_schedule(lambda k: producer.send_message_in_transaction(msg), 1000, rate=100, threads=8)
    """
    taken, lock = iter(range(total)), threading.Lock()
    halt = halt or threading.Event()
    t0 = time.monotonic()
    stop_at = None if deadline_s is None else t0 + deadline_s

    def worker() -> None:
        while not halt.is_set():
            with lock:
                k = next(taken, None)
            if k is None:
                return
            now = time.monotonic()
            due = t0 + k / rate if rate > 0 else now
            if stop_at is not None and max(now, due) >= stop_at:
                return
            if due > now and halt.wait(due - now):
                return
            send_one(k)

    workers = [threading.Thread(target=worker, name=f"sender-{i}") for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return time.monotonic() - t0


class SteadySender:
    """Offers ``rate`` transactions per second to ``topic`` for ``seconds`` from ``threads`` threads of
    one producer (:func:`send_on_schedule`, with ``seconds`` as its deadline). Each send's return time
    (``time.time()``) and transaction id are kept in ``sent``, or, with ``on_sent``, handed to it
    instead (a long run need not hold them all: ``on_sent(transaction_id, returned_at, send_seconds)``,
    called from the sending threads); ``sent_count`` counts them either way, and ``unsent`` counts the
    scheduled sends a producer that fell behind (or :meth:`halt` stopped) never started.
    """

    def __init__(self, producer, topic: str, rate: float, seconds: float, threads: int,
                 on_sent: Optional[Callable[[str, float, float], None]] = None):
        self.producer, self.topic, self.rate, self.seconds, self.threads = producer, topic, rate, seconds, threads
        self.sent: list[tuple[str, float, float]] = []  # (transaction id, returned at (epoch s), send seconds)
        self.on_sent = on_sent
        self.sent_count = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.total = int(rate * seconds)

    def _send_one(self, k: int) -> None:
        from coordinator import Message

        started = time.perf_counter()
        try:
            result = self.producer.send_message_in_transaction(Message(self.topic, BODY))
        except Exception:
            with self._lock:
                self.errors += 1
            return
        sent = (result.transaction_id, time.time(), time.perf_counter() - started)
        if self.on_sent is not None:
            self.on_sent(*sent)
        with self._lock:
            self.sent_count += 1
            if self.on_sent is None:
                self.sent.append(sent)

    @property
    def unsent(self) -> int:
        """Scheduled sends not started by the deadline (once :meth:`run` has returned)."""
        return self.total - self.sent_count - self.errors

    def run(self) -> float:
        """Send on schedule until the deadline; return the seconds it took (the sends in flight at
        the deadline finish first)."""
        return send_on_schedule(self._send_one, self.total, self.rate, self.threads, deadline_s=self.seconds,
                                halt=self._halt)

    def halt(self) -> None:
        """End the run early, from another thread: no send starts after this (those in flight finish)."""
        self._halt.set()


class Commits:
    """A no-op local transaction that commits (so the coordinator's own cost is what is measured)."""

    def __new__(cls):
        from coordinator import LocalTransactionState, TransactionListener

        class _Commits(TransactionListener):
            def execute_local_transaction(self, msg, arg):
                return LocalTransactionState.COMMIT_MESSAGE

            def check_local_transaction(self, msg):
                return LocalTransactionState.COMMIT_MESSAGE

        return _Commits()


@contextlib.contextmanager
def spark_session(app_name: str) -> Iterator:
    """The Spark session of a benchmark that drives the checker's logic in its own process: started here
    and stopped at the end, or, where this process has one already, that one, left running (the tests
    run the tiny modes in their own shared session, which later tests still need).

    Example::

        with benchlib.spark_session("bench-history") as spark:
            ...
    """
    from pyspark import SparkContext

    from coordinator.spark import get_spark

    ours = SparkContext._active_spark_context is None
    spark = get_spark(app_name)
    try:
        yield spark
    finally:
        if ours:
            spark.stop()


# ---------------------------------------------------------------------------------------------
# The checker's batch logic, driven batch by batch (as tests/conftest.py's ManualChecker does)


class BatchDriver:
    """Runs ``run_batch`` over the commit-log versions written since the last batch, with an
    explicit clock, carrying ``pending_from`` from batch to batch as the streaming query does.

    Example::

        driver = BatchDriver(spark, config, "order_group", first_batch_id=0, pending_from=0)
        driver.write(records)           # one commit-log commit (delta-rs)
        summary, seconds = driver.run() # one batch over every new version, clock = now
    """

    def __init__(self, spark, config, group: str, first_batch_id: int = 0, pending_from: int = 0):
        from coordinator.checker.segment import grown_to
        from coordinator.lakehouse import Lakehouse, create_table
        from coordinator.tables import COMMIT_LOG

        self.spark, self.config = spark, config
        self.lakehouse = Lakehouse.of(config)
        self.commit_log = self.lakehouse.commit_log(group)
        create_table(COMMIT_LOG, self.commit_log, self.lakehouse.storage)
        self.next_versions = grown_to(self.lakehouse, {}, budget=10**9)
        self.batch_id = first_batch_id
        self.pending_from = pending_from
        from coordinator.checker.state import CheckerState

        self.state = CheckerState()

    def write(self, records: list[dict]) -> int:
        """Append raw commit-log records as one commit; return its version."""
        from deltalake import DeltaTable, write_deltalake

        from coordinator.producer.commit_log import records_to_arrow

        storage = dict(self.lakehouse.storage) or None
        write_deltalake(self.commit_log, records_to_arrow(records), mode="append", storage_options=storage)
        return DeltaTable(self.commit_log, storage_options=storage).version()

    def records(self, starts: dict, ends: dict, now):
        from coordinator.checker.segment import Segment
        from coordinator.schedule import clock_us

        return Segment(starts, ends, clock_us(now)).records(self.lakehouse)

    def run(self, now=None):
        """One batch over every new version at clock ``now`` (default: the wall clock);
        returns ``(summary, wall seconds of run_batch)``."""
        from datetime import datetime, timezone

        from coordinator.checker.batch import run_batch
        from coordinator.checker.segment import grown_to

        started = time.perf_counter()  # finding and reading the new versions is part of the batch, as in the query
        ends = grown_to(self.lakehouse, self.next_versions)
        records = self.records(self.next_versions, ends, now or datetime.now(timezone.utc))
        summary = run_batch(self.config, records, self.batch_id, pending_from=self.pending_from,
                            state=self.state)
        seconds = time.perf_counter() - started
        self.next_versions, self.batch_id, self.pending_from = ends, self.batch_id + 1, summary.pending_from
        return summary, seconds


def reach_object_store(spark, storage: Mapping[str, str]) -> None:
    """Let this process's Spark session reach the S3 server of ``storage`` (the checker's checkpoint
    goes there through S3A), as the checker job's own settings do."""
    from coordinator.spark import object_store_conf

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in object_store_conf(storage).items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)


def streaming_triggers(spark, config, group: str, topic: str, rounds: int, transactions: int) -> dict:
    """The real streaming query (``CheckerQuery``, in this process) over ``rounds`` rounds after a
    warm-up one, each a commit of ``transactions`` HALF records of ``group`` then one of their COMMIT
    ENDs, waited for until delivered, then a heartbeat-only trigger or two. Each trigger's whole time
    (planning, the offset and commit logs, the batch) as ``system/metrics`` records it, and the Spark
    jobs the query ran per trigger.

    Example::

        streaming_triggers(spark, CoordinatorConfig(lakehouse="/tmp/lh"), "g", "T", rounds=5, transactions=200)
    """
    from coordinator.checker.query import CheckerQuery
    from coordinator.lakehouse import Lakehouse
    from coordinator.producer.transaction_producer import time_ordered_id
    from coordinator.tables import METRICS

    writer = BatchDriver(spark, config, group)
    lakehouse = Lakehouse.of(config)

    def recorded() -> list[dict]:
        return lakehouse.read(METRICS).sort_by("batch_id").to_pylist()

    def wait_for(condition, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("the streaming checker did not keep up")
            time.sleep(0.05)

    earlier = recorded() if lakehouse.exists(METRICS) else []  # of an earlier run
    checker = CheckerQuery(spark, config).start()
    try:
        wait_for(lambda: len(recorded()) >= len(earlier) + 2)
        delivered_before = sum(r["delivered"] for r in recorded())
        first_counted = None
        for round_ in range(rounds + 1):
            if round_ == 1:
                first_counted = max(r["batch_id"] for r in recorded()) + 1
            ids = [time_ordered_id() for _ in range(transactions)]
            writer.write(half_rows(ids, group, topic))
            writer.write(commit_rows(ids, group))
            wait_for(lambda: sum(r["delivered"] for r in recorded()) == delivered_before + (round_ + 1) * transactions)
            time.sleep(1.5)  # a heartbeat-only batch or two
        jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(str(checker.query.runId)))
    finally:
        checker.stop()
    rows = recorded()[len(earlier):]
    counted = [r for r in rows if r["batch_id"] >= first_counted]
    busy = [r for r in counted if r["records"]]
    idle = [r for r in counted if not r["records"]]
    return {"trigger_ms_median_with_records": median([r["duration_ms"] for r in busy]),
            "records_per_trigger_median": median([r["records"] for r in busy]),
            "trigger_ms_median_heartbeat": median([r["duration_ms"] for r in idle]),
            "spark_jobs_per_trigger": round(jobs / len(rows), 2), "triggers": len(rows)}


def half_rows(transaction_ids: list[str], group: str, topic: str, properties: Optional[dict] = None) -> list[dict]:
    """One single-message HALF record per transaction id, as a producer writes it."""
    import uuid

    born = datetime.now(timezone.utc)
    return [dict(record_id=uuid.uuid4().hex, kind="HALF", transaction_id=tid, producer_group=group,
                 msg_id=uuid.uuid4().hex, message_index=0, message_count=1, topic=topic, keys=tid[-8:], tags=None,
                 properties=dict(properties or {}), body=BODY, born_timestamp=born)
            for tid in transaction_ids]


def commit_rows(transaction_ids: list[str], group: str) -> list[dict]:
    """The producer's own COMMIT END record of each transaction."""
    from coordinator.producer.commit_log import end_record
    from coordinator.protocol import LocalTransactionState

    return [end_record(group, tid, LocalTransactionState.COMMIT_MESSAGE) for tid in transaction_ids]


def jvm_memory(spark) -> dict:
    """The Spark driver JVM's heap in use and committed (MiB), and its process RSS and peak RSS (MiB)."""
    jvm = spark.sparkContext._jvm
    runtime = jvm.java.lang.Runtime.getRuntime()
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    status = proc_status(pid)
    return {"pid": pid, "heap_used_mib": round((runtime.totalMemory() - runtime.freeMemory()) / 2**20, 1),
            "heap_committed_mib": round(runtime.totalMemory() / 2**20, 1),
            "heap_max_mib": round(runtime.maxMemory() / 2**20, 1),
            "rss_mib": status.get("VmRSS"), "peak_rss_mib": status.get("VmHWM")}


def proc_status(pid: int) -> dict:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of ``pid`` in MiB, from ``/proc``."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    return found


def process_tree_rss(pid: int) -> Optional[dict]:
    """The RSS (MiB) of process ``pid`` and everything it started, summed (``total_mib``: pages shared by
    forked processes count once in each), the same as PSS (``total_pss_mib``: each shared page split among
    its sharers, so the tree's real footprint), the RSS of its JVMs (``jvm_mib``) and of its other processes
    (``other_mib``: for a checker job its Python driver, its streaming source runner and Python workers),
    with the ``processes`` counted; ``None`` once ``pid`` is gone.

    Example::

        process_tree_rss(checker.process.pid)
        # {'total_mib': 1418.7, 'total_pss_mib': 1101.0, 'jvm_mib': 453.5, 'other_mib': 965.2, 'processes': 9}
    """
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    jvm = other = pss = 0
    counted = 0
    for process in tree:
        try:
            memory = process.memory_full_info()  # smaps_rollup: a few milliseconds for a JVM
            is_jvm = process.name() == "java"
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):  # ended since the tree was listed
            continue
        counted += 1
        pss += memory.pss
        if is_jvm:
            jvm += memory.rss
        else:
            other += memory.rss
    return {"total_mib": round((jvm + other) / 2**20, 1), "total_pss_mib": round(pss / 2**20, 1),
            "jvm_mib": round(jvm / 2**20, 1), "other_mib": round(other / 2**20, 1), "processes": counted}


def reset_peak_rss(pid: int) -> bool:
    """Reset ``pid``'s peak RSS (``VmHWM``) to its current RSS (Linux: ``clear_refs`` 5)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False
