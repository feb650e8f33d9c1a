"""Shared fixtures: one Spark session for the whole suite, a fresh lakehouse per test,
a raw commit-log writer that bypasses the producer API, and a checker driven batch by
batch with an explicit clock (so timing rules are tested without sleeping)."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from bench.harness import half_record
from tests import REPO_ROOT
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse, init_lakehouse, read_table
from coordinator.tables import COMMIT_LOG, METRICS, TableDef

UTC = dt.timezone.utc


@pytest.fixture(scope="session")
def spark():
    from coordinator.spark import get_spark

    session = get_spark("txcoord-tests")
    yield session
    session.stop()


@pytest.fixture
def config(tmp_path) -> CoordinatorConfig:
    lakehouse = str(tmp_path / "lakehouse")
    init_lakehouse(lakehouse)
    return CoordinatorConfig(lakehouse=lakehouse, transaction_check_max=5)


class Clock:
    """A wall clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def metrics_row(**values: Any) -> dict:
    """A ``system/metrics`` row of an idle batch (counts 0, no topic), with ``values`` set."""
    return {name: None if kind.startswith("map") else 0 for name, kind in METRICS.columns} | values


def append_rows(path: str, table: TableDef, rows: list[dict], storage: Optional[dict] = None) -> None:
    """Append ``rows`` (missing columns null) to a table with delta-rs, as one commit."""
    columns = {name: [row.get(name) for row in rows] for name in table.column_names}
    for name, values in columns.items():
        if name == "properties":
            columns[name] = [None if v is None else list(v.items()) for v in values]
    write_deltalake(path, pa.table(columns, schema=table.arrow_schema()), mode="append", storage_options=storage)


class SteadyProducer:
    """A producer of group ``group`` committing one half at a time to its commit log, ``pause_s`` apart (a
    compaction can win its commit between two), while in its ``with`` block; ``sent`` holds each transaction
    id once its commit is durable.

    Example::

        with SteadyProducer(lakehouse) as producer:
            producer.wait_for(20)
            maintain(lakehouse)
        read_table(...)  # == producer.sent, each once
    """

    def __init__(self, lakehouse, group: str = "g", pause_s: float = 0.05):
        import threading

        self.lakehouse, self.group, self.pause_s = lakehouse, group, pause_s
        self.sent: list[str] = []
        self._stop = threading.Event()
        self._grown = threading.Condition()
        self._thread = threading.Thread(target=self._produce, name="steady-producer")

    def __enter__(self) -> "SteadyProducer":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _produce(self) -> None:
        from coordinator.producer.commit_log import CommitLogWriter

        with CommitLogWriter(self.lakehouse, self.group, commit_interval_ms=0) as writer:
            while not self._stop.is_set():
                transaction_id = f"t{len(self.sent)}"
                writer.submit([half_record(transaction_id, group=self.group)]).result()
                with self._grown:
                    self.sent.append(transaction_id)
                    self._grown.notify_all()
                self._stop.wait(self.pause_s)

    def wait_for(self, count: int, timeout_s: float = 120) -> None:
        """Until ``count`` transactions are durable (fails after ``timeout_s``: the producer is stuck)."""
        with self._grown:
            assert self._grown.wait_for(lambda: len(self.sent) >= count or not self._thread.is_alive(), timeout_s)
        assert len(self.sent) >= count, "the producer stopped"


class ManualChecker:
    """The checker's batch logic, driven one batch at a time over new commit-log versions.

    ``run(now)`` processes every version of every commit log committed since the last run, with a
    heartbeat tick at ``now`` (default: the wall clock) as the batch clock, and hands each batch's
    ``pending_from`` to the next, as the streaming query does.
    """

    def __init__(self, spark, config: CoordinatorConfig):
        self.spark = spark
        self.config = config
        self.lakehouse = Lakehouse.of(config)  # with its [storage]: on object storage too
        self.next_versions: dict[str, int] = {}
        self.batch_id = 0
        self.pending_from = 0
        from coordinator.checker.batch import BatchRunner

        self.runner = BatchRunner()

    def write(self, *rows: dict, stored_at: Optional[dt.datetime] = None, log: Optional[str] = None) -> int:
        """Append raw commit-log records as one commit; return its version.

        ``log`` is the commit log's key (``groups/g/commit_log``); by default the first record's
        group's own (``g`` for a record with none), or the operators' for an operator's decision.
        ``stored_at`` dates the commit (its log file's modification time, which the checker reads
        as when the records were stored): a commit made "a while ago" without waiting for it.
        """
        from coordinator.commit_logs import CommitLogRef
        from coordinator.lakehouse import create_table
        from coordinator.protocol import OPERATOR_CHECK_PREFIX

        first = rows[0]
        if log is None and (first.get("check_id") or "").startswith(OPERATOR_CHECK_PREFIX):
            log = CommitLogRef.operators().key
        log = log or CommitLogRef.of_group(first.get("producer_group") or "g").key
        path = self.lakehouse.key_path(log)
        create_table(COMMIT_LOG, path)
        append_rows(path, COMMIT_LOG, list(rows))
        version = DeltaTable(path).version()
        if stored_at is not None:
            os.utime(os.path.join(path, "_delta_log", f"{version:020d}.json"), (stored_at.timestamp(),) * 2)
        return version

    def discard(self, *transaction_ids: str, messages: int = 1) -> None:
        """Write ``transaction_ids`` as halves and run batches until each is discarded (one check is the maximum)."""
        self.config = self.config.replace(transaction_check_max=1)
        self.write(*(half_record(t, body=f"{t} {i}".encode(), message_index=i, message_count=messages)
                     for t in transaction_ids for i in range(messages)))
        self.run()
        stored = stored_time(self, transaction_ids[0])
        self.run(now=stored + dt.timedelta(seconds=7))
        self.run(now=dt.datetime.now(UTC) + dt.timedelta(seconds=61))  # the check's interval has passed
        assert {r.outcome for r in self.rows("op", pc.field("transaction_id").isin(transaction_ids))} == {"DISCARD"}

    def records(self, starts: dict, ends: dict, now: dt.datetime):
        from coordinator.checker.segment import Segment

        from coordinator.schedule import clock_us

        return Segment(starts, ends, clock_us(now)).records(self.lakehouse)

    def run(self, now: Optional[dt.datetime] = None):
        """Run the next batch over every commit-log version not yet processed, at clock ``now``."""
        from coordinator.checker.segment import grown_to

        ends = grown_to(self.lakehouse, self.next_versions)
        self.last_batch = (self.next_versions, ends, now or dt.datetime.now(UTC), self.batch_id, self.pending_from)
        self.next_versions, self.batch_id = ends, self.batch_id + 1
        summary = self.replay()
        self.pending_from = summary.pending_from
        return summary

    def replay(self):
        """Run the last batch again, exactly as Spark does after a crash: same id, versions and clock."""
        from coordinator.checker.batch import run_batch

        starts, ends, now, batch_id, pending_from = self.last_batch
        return run_batch(self.config, self.records(starts, ends, now), batch_id,
                         pending_from=pending_from, runner=self.runner)

    @property
    def memory(self):
        """The checker's memory as the last batch left it (:class:`coordinator.checker.memory.CheckerMemory`)."""
        return self.runner.memory

    def restart(self) -> None:
        """Forget the memory, as a checker killed and started again does: the next batch rebuilds it."""
        from coordinator.checker.batch import BatchRunner

        self.runner = BatchRunner(spark=self.spark)

    def rows(self, name: str, where: Optional[pc.Expression] = None) -> list:
        """The rows of a system table or topic (``where`` them only), read with delta-rs: Spark's
        ``Row``s as ``table(name).collect()`` gives, in a fraction of a Spark read's time."""
        from pyspark.sql import Row

        return [Row(**row) for row in read_table(self.path(name), filter=where).to_pylist(maps_as_pydicts="strict")]

    def path(self, name: str) -> str:
        from coordinator.tables import SYSTEM_TABLES

        paths = {t.name.split("/")[-1]: Lakehouse(self.config.lakehouse).path(t) for t in SYSTEM_TABLES}
        return paths.get(name) or Lakehouse(self.config.lakehouse).topic(name)


@pytest.fixture
def checker(config) -> ManualChecker:
    """The batch logic over a fresh lakehouse, with no JVM: ``run_batch`` runs on the driver."""
    return ManualChecker(None, config)


def stored_time(checker: ManualChecker, transaction_id: str) -> dt.datetime:
    """When the half of ``transaction_id`` entered the commit log (UTC)."""
    return checker.rows("half", pc.field("transaction_id") == transaction_id)[0].stored_timestamp  # one per message


def require_s3_server() -> None:
    """Wait for the S3 server's binary (``make test`` builds it while the first tests run), build it
    if nobody is, or skip when it is not built and there is no Go to build it."""
    from scripts.s3_server import BINARY, build

    if not BINARY.exists() and shutil.which("go") is None:
        pytest.skip(f"no S3 server built at {BINARY}, and no Go to build it: see scripts/s3_server.py")
    build(quiet=True)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (``scripts/s3_server.py``: versitygw) on loopback for the session,
    with a bucket ``lakehouse``. Skips when it is neither built nor buildable (:func:`require_s3_server`)."""
    require_s3_server()
    from scripts.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3"), log_file=str(tmp_path_factory.mktemp("s3-log") / "server.log"))
    with server:
        server.create_bucket("lakehouse")
        yield server


@pytest.fixture
def s3_lakehouse(s3_server) -> Lakehouse:
    """A fresh lakehouse under ``s3://lakehouse/`` on the session's S3 server, its tables created."""
    lakehouse = Lakehouse(f"s3://lakehouse/{uuid.uuid4().hex}", s3_server.storage_options)
    init_lakehouse(lakehouse)
    return lakehouse


def require_azurite() -> None:
    """Wait for Azurite's install (``make test`` starts it while it sets up), install it if nobody is, or
    skip when it is not installed and there is no npm to install it."""
    from scripts.azurite import install, installed

    if not installed() and shutil.which("npm") is None:
        pytest.skip("Azurite is not installed and there is no npm to install it: see scripts/azurite.py")
    install(quiet=True)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """Azurite, the Azure Storage emulator (``scripts/azurite.py``), on loopback for the session, with a
    container ``lakehouse``. Skips when it is neither installed nor installable (:func:`require_azurite`)."""
    require_azurite()
    from scripts.azurite import Azurite

    server = Azurite(tmp_path_factory.mktemp("azurite"),
                     log_file=str(tmp_path_factory.mktemp("azurite-log") / "azurite.log"))
    with server:
        server.create_container("lakehouse")
        yield server


@pytest.fixture
def azure_lakehouse(azurite) -> Lakehouse:
    """A fresh lakehouse in the container ``lakehouse`` on the session's Azurite (an ``abfss://`` URL), its
    tables created."""
    lakehouse = Lakehouse(azurite.location("lakehouse", uuid.uuid4().hex), azurite.storage_options)
    init_lakehouse(lakehouse)
    return lakehouse


DEMO_ORDERS = 12


def without_txcoord_settings() -> dict[str, str]:
    """This environment less ``TXCOORD_*``: a demo's settings, and a test's, must be its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TXCOORD_")}


def run_checked(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` to its end; fail the test with its output unless it exits 0."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{argv}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@contextlib.contextmanager
def once_for_all_workers(tmp_path_factory, name: str) -> Iterator[tuple[Path, bool]]:
    """A directory ``name`` shared by every worker of this run (``pytest -n``), held under a lock: yields it
    and whether it is made already; the first worker to come makes it while the others wait. Alone
    (no workers), the session's own directory."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's directory, one per worker below it
    directory = shared / name
    with open(shared / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = (directory / ".made").exists()
        directory.mkdir(exist_ok=True)
        yield directory, made
        (directory / ".made").touch()


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel and its Spark and console extras, at the versions requirements.lock pins
    (made once for all workers)."""
    with once_for_all_workers(tmp_path_factory, "install") as (root, made):
        venv = root / "venv"
        if made:
            return venv
        run_checked([sys.executable, "-m", "uv", "build", "--wheel", "--quiet", "--out-dir", str(root / "dist"),
                     str(REPO_ROOT)])
        [wheel] = (root / "dist").glob("txcoord-*.whl")
        run_checked([sys.executable, "-m", "uv", "venv", "--quiet", "--python", sys.executable, str(venv)])
        run_checked([sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                     f"txcoord[spark,console] @ {wheel.as_uri()}", "--constraint", str(REPO_ROOT / "requirements.lock")])
        return venv


def user_environment(venv: Path) -> dict[str, str]:
    """The environment of a user whose virtualenv is activated: nothing of the checkout or its tests."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("TXCOORD_", "PYSPARK_", "SPARK_", "PYTHON", "VIRTUAL_ENV"))}
    return dict(clean, PATH=f"{venv / 'bin'}{os.pathsep}{clean['PATH']}", VIRTUAL_ENV=str(venv))


@pytest.fixture(scope="session")
def demo(tmp_path_factory, installed):
    """Run ``txcoord demo --json`` once for the run, whichever worker comes first (12 orders, every fate at least
    once), as a user would: the installed wheel, from an empty directory outside the checkout; yield
    ``(lakehouse, completed process, seconds)``. Tests that change the lakehouse copy it first."""
    with once_for_all_workers(tmp_path_factory, "demo") as (workdir, made):
        outcome = workdir / ".outcome.json"
        if not made:
            started = time.monotonic()
            result = subprocess.run(
                [str(installed / "bin" / "txcoord"), "demo", "--lakehouse", "lakehouse", "--orders", str(DEMO_ORDERS),
                 "--timeout", "240", "--json"],
                capture_output=True, text=True, cwd=workdir, env=user_environment(installed), timeout=420,
            )
            outcome.write_text(json.dumps({"args": result.args, "returncode": result.returncode, "stdout": result.stdout,
                                           "stderr": result.stderr, "seconds": time.monotonic() - started}))
        ran = json.loads(outcome.read_text())
    completed = subprocess.CompletedProcess(ran["args"], ran["returncode"], ran["stdout"], ran["stderr"])
    return workdir / "lakehouse", completed, ran["seconds"]


def pytest_itemcollected(item):
    """Mark ``object_store`` every test that uses the S3 server or Azurite."""
    if {"s3_server", "azurite"} & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.object_store)


def pytest_collection_modifyitems(items):
    """Run the tests marked ``slow`` first; among them those on the S3 server first (``make test`` builds it
    while it sets up), and those of the installed wheel and its demo last. ``make test`` runs the slow ones on
    two workers that start with the first and the second half of this order (``--dist worksteal``,
    scripts/test_lanes.sh): one makes the wheel and the demo while the other runs the rest."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 bool({"installed", "demo"} & set(getattr(item, "fixturenames", ()))),
                                 item.get_closest_marker("object_store") is None))
