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
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, NamedTuple, Optional, Union
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


def commits(table_path: str, storage: Optional[Mapping[str, str]] = None) -> list[dict]:
    """Every commit whose JSON is still in the log: ``version``, ``timestamp_ms`` (commitInfo),
    ``log_mtime`` (when the JSON file was written, in seconds: on object storage its Last-Modified,
    whole seconds rounded up) and the data files it ``added`` (paths relative to the table)."""
    from coordinator.storage import FileStore

    files = FileStore.at(table_path, storage)
    result = []
    for version in log_versions(table_path, storage):
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    from coordinator.lakehouse import Lakehouse
    from coordinator.storage import FileStore

    lakehouse = Lakehouse.at(lakehouse)
    table_path = lakehouse.topic(topic)
    files = FileStore.at(table_path, lakehouse.storage)
    found: dict[str, Delivery] = {}
    for commit in commits(table_path, lakehouse.storage):
        if commit["timestamp_ms"] is None:
            continue
        for path in commit["added"]:
            data = pa.BufferReader(files.read(path).data)
            for tid in pq.read_table(data, columns=["transaction_id"]).column("transaction_id").to_pylist():
                first = found.get(tid)
                found[tid] = (Delivery(commit["timestamp_ms"] / 1000, commit["log_mtime"], 1) if first is None
                              else first._replace(rows=first.rows + 1))
    return found


def table_shape(table_path: str) -> dict:
    """How big a table's log and file set are: JSON commits in ``_delta_log``, checkpoints,
    data files in the current snapshot and Parquet files on disk (those not yet vacuumed)."""
    from deltalake import DeltaTable

    log_dir = os.path.join(table_path, "_delta_log")
    if not os.path.isdir(log_dir):
        return {"exists": False}
    names = os.listdir(log_dir)
    on_disk = sum(1 for _, _, files in os.walk(table_path) for name in files
                  if name.endswith(".parquet") and "_delta_log" not in name)
    table = DeltaTable(table_path)
    return {
        "exists": True,
        "version": table.version(),
        "log_json_files": sum(1 for name in names if name.endswith(".json") and name[:-5].isdigit()),
        "checkpoints": sum(1 for name in names if ".checkpoint." in name and name.endswith(".parquet")),
        "active_files": len(table.file_uris()),
        "parquet_files_on_disk": on_disk,
    }


# ---------------------------------------------------------------------------------------------
# The real checker job


class CheckerJob:
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
        if self.exit_code is not None:
            return self.exit_code
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.exit_code = self.process.returncode
        self.log_file.close()
        return self.exit_code

    def __enter__(self) -> "CheckerJob":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


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
                               object_store: Optional[Lakehouse] = None) -> tuple[str, CheckerJob]:
    """The checker job on an empty lakehouse, not yet waited for, and the local directory that holds its
    TOML and log: ``requested`` (wiped) or a new temporary directory. That directory is the lakehouse
    too, unless ``object_store`` names an empty lakehouse on object storage (with its storage settings).
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
    config_path = write_config(lakehouse, directory, trigger_interval_ms=trigger_ms)
    return directory, CheckerJob(config_path, lakehouse, os.path.join(directory, "checker.log"))


#: What the checker logs (coordinator/checker/query.py, batch.py) once its streaming query runs, and after each
#: finished batch. ``records=`` leaves out the other lines that name a batch (state rebuilt, append retried).
STARTED_LINE = b"checker started on "
STANDBY_LINE = b"standing by to take over"
BATCH_LINE = re.compile(rb"batch \d+: records=")


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
# A steady offered rate


def send_on_schedule(send_one: Callable[[int], None], total: int, rate: float, threads: int,
                     deadline_s: Optional[float] = None) -> float:
    """Call ``send_one(k)`` for k in ``range(total)`` from ``threads`` threads, k at ``t0 + k / rate``
    (at once when ``rate`` is 0); return the seconds it took.

    The schedule is fixed in advance: a thread that falls behind sends at once, so a slow
    producer shows as a lower achieved rate, not a lower offered one. With ``deadline_s``, no send
    starts ``deadline_s`` or more after t0, so a run that falls behind still lasts its stated time;
    the sends in flight then finish, and the caller counts those never started.

    Example::

        seconds = send_on_schedule(lambda k: producer.send_message_in_transaction(msg), 1000, rate=100, threads=8)
    """
    taken, lock = iter(range(total)), threading.Lock()
    t0 = time.monotonic()
    stop_at = None if deadline_s is None else t0 + deadline_s

    def worker() -> None:
        while True:
            with lock:
                k = next(taken, None)
            if k is None:
                return
            now = time.monotonic()
            due = t0 + k / rate if rate > 0 else now
            if stop_at is not None and max(now, due) >= stop_at:
                return
            if due > now:
                time.sleep(due - now)
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
    (``time.time()``) and transaction id are kept; ``unsent`` counts the scheduled sends a producer
    that fell behind never started.
    """

    def __init__(self, producer, topic: str, rate: float, seconds: float, threads: int):
        self.producer, self.topic, self.rate, self.seconds, self.threads = producer, topic, rate, seconds, threads
        self.sent: list[tuple[str, float, float]] = []  # (transaction id, returned at (epoch s), send seconds)
        self.errors = 0
        self._lock = threading.Lock()
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
        with self._lock:
            self.sent.append(sent)

    @property
    def unsent(self) -> int:
        """Scheduled sends not started by the deadline (once :meth:`run` has returned)."""
        return self.total - len(self.sent) - self.errors

    def run(self) -> float:
        """Send on schedule until the deadline; return the seconds it took (the sends in flight at
        the deadline finish first)."""
        return send_on_schedule(self._send_one, self.total, self.rate, self.threads, deadline_s=self.seconds)


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

        return Segment(starts, ends, int(now.timestamp() * 1_000_000)).records(self.lakehouse)

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


def reset_peak_rss(pid: int) -> bool:
    """Reset ``pid``'s peak RSS (``VmHWM``) to its current RSS (Linux: ``clear_refs`` 5)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False
