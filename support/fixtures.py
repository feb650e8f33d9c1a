"""The pytest fixtures of ``tests/`` and ``bench/tests/`` (a plugin the checkout's ``conftest.py`` loads): one Spark
session for the whole suite, a fresh lakehouse per test (on a local disk, the
S3 server or Azurite), the checker's batch logic driven batch by batch with an explicit clock (so timing
rules are tested without sleeping), and the installed wheel and its demo. What they are made of, and every
other helper, is in the rest of :mod:`support`."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse, init_lakehouse
from coordinator.ops import maintenance
from coordinator.spark import jars
from support.environment import REPO_ROOT
from support.batches import ManualChecker
from support.environment import DEMO_ORDERS, run_uv_cache_first, user_environment
from support.servers import require_azurite, require_s3_server


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


@pytest.fixture
def checker(config) -> ManualChecker:
    """The batch logic over a fresh lakehouse, with no JVM: ``run_batch`` runs on the driver."""
    return ManualChecker(config)


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """A txcoord cache of this test's own (``TXCOORD_CACHE_DIR``) that shares the machine's cached jars:
    its properties file and class archive are this test's alone."""
    cached = jars.jars_dir()
    jars.cached_jars()
    cache = tmp_path / "cache"
    monkeypatch.setenv(jars.CACHE_DIR_VARIABLE, str(cache))
    jars.jars_dir().parent.mkdir(parents=True)
    jars.jars_dir().symlink_to(cached, target_is_directory=True)
    return cache


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (``coordinator/conformance/versitygw.py``: versitygw) on loopback for the session,
    with a bucket ``lakehouse``. Skips when it is neither built nor buildable (:func:`require_s3_server`)."""
    require_s3_server()
    from coordinator.conformance.versitygw import S3Server

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


@pytest.fixture(scope="session")
def java_client() -> str:
    """The Java client (clients/java) built (once per session, :func:`support.java_client.build_java_client`): the
    classpath that runs it. Skips without Maven and a JDK."""
    from support.java_client import build_java_client, java_classpath

    reason = build_java_client()
    if reason:
        pytest.skip(reason)
    return java_classpath()


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


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server (Debian's) on loopback for the session (:class:`support.postgres.PostgresServer`);
    yields it (``.dsn``). Skips when no server is installed."""
    from support.postgres import PostgresServer, postgres_bin

    if postgres_bin() is None:
        pytest.skip("no PostgreSQL server (initdb, postgres): sudo apt-get install postgresql, or make system-packages")
    with PostgresServer() as server:
        yield server


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
    (made once for all workers). The wheel is built from the checkout's source distribution, as a release is: so
    the sdist is checked too, and setuptools leaves no ``build/`` in the checkout (whose stale files a wheel
    built from the checkout itself would ship)."""
    with once_for_all_workers(tmp_path_factory, "install") as (root, made):
        venv = root / "venv"
        if made:
            return venv
        run_uv_cache_first("build", "--quiet", "--out-dir", str(root / "dist"), str(REPO_ROOT))
        [wheel] = (root / "dist").glob("txcoord-*.whl")
        run_uv_cache_first("venv", "--quiet", "--python", sys.executable, str(venv))
        run_uv_cache_first("pip", "install", "--quiet", "--compile-bytecode", "--python", str(venv / "bin" / "python"),
                           f"txcoord[spark,console] @ {wheel.as_uri()}", "--constraint", str(REPO_ROOT / "requirements.lock"))
        return venv



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


@pytest.fixture
def commit_logs_compacted_eagerly(monkeypatch):
    """Maintenance compacts a commit log's small files at any age and number. It leaves recent ones to the
    writer that compacts its own appends (``COMMIT_LOG_COMPACTION_AGE``); tests write a few and maintain at once."""
    monkeypatch.setattr(maintenance, "COMMIT_LOG_COMPACTION_AGE", timedelta(0))
    monkeypatch.setattr(maintenance, "COMMIT_LOG_COMPACTION_MIN_FILES", 2)
