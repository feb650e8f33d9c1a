"""The training run that writes the driver JVM's class archive (:mod:`coordinator.spark.class_archive`):
the checker job, launched as :func:`~coordinator.spark.spark_submit` launches it, on a throwaway
lakehouse holding one committed transaction, stopped once it has delivered it. Its JVM writes the
classes it loaded as it exits. ``txcoord spark-setup`` runs it once per JDK and Spark installation
(its time and size: docs/performance-log.md#figures-quoted-elsewhere-before).

Example::

    from coordinator.jobs.training import write_class_archive
    write_class_archive()  # PosixPath('/home/me/.cache/txcoord/spark/.../class-archive/classes-3f1c....jsa')
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from coordinator.config import ENV_PREFIX, CoordinatorConfig
from coordinator.exceptions import SparkSetupError
from coordinator.spark.class_archive import (QUIET, class_archive, driver_java_options, record_identity,
                                             remove_stale_archives)
from coordinator.spark.jars import exclusively
from coordinator.spark.session import read_spark_defaults
from coordinator.spark.submit import spark_submit

__all__ = ["write_class_archive"]

TRAINING_TOPIC = "TXCOORD_TRAINING"
_GROUP = "txcoord_training"
#: The JVM writes its archive as it exits, which takes seconds: a generous bound.
_EXIT_TIMEOUT_S = 120.0


def write_class_archive(timeout_s: float = 300.0) -> Path:
    """Run the training checker and put the archive its JVM writes at :func:`class_archive` (unless a
    training that held the lock meanwhile wrote it), and remove the archives of JVMs and Spark
    installations gone or changed since; return its path.

    Raises :class:`SparkSetupError` with the end of the run's log when the checker does not deliver
    within ``timeout_s`` seconds or no archive is written; nothing is left behind then.
    """
    archive = class_archive()
    archive.parent.mkdir(parents=True, exist_ok=True)
    staged = archive.with_name(f".{archive.name}.{os.getpid()}")
    work = Path(tempfile.mkdtemp(prefix="txcoord-training-"))
    try:
        with exclusively(archive.parent / ".lock"):  # one training at a time: a second waits, then finds it
            if archive.is_file():
                return archive
            log = work / "checker.log"
            config_path, topic = _throwaway_lakehouse(work)
            delivered, returncode = _train(config_path, topic, staged, log, timeout_s)
            if not delivered or returncode != 0 or not staged.is_file():
                outcome = "delivered its transaction" if delivered else f"did not deliver its transaction in {timeout_s:g} s"
                raise SparkSetupError(f"no class archive written: the training checker {outcome} and exited {returncode}; "
                                      f"the end of its log:\n{_tail(log)}")
            record_identity(archive)
            staged.replace(archive)
            remove_stale_archives()
    finally:
        staged.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return archive


def _throwaway_lakehouse(work: Path) -> tuple[Path, Path]:
    """A local lakehouse in ``work`` holding one committed transaction of :data:`TRAINING_TOPIC`; its TOML, and
    where that topic's table will be."""
    from coordinator.lakehouse import Lakehouse, init_lakehouse
    from coordinator.producer import Message, TransactionListener, TransactionProducer
    from coordinator.protocol import LocalTransactionState

    class Commit(TransactionListener):
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, message):
            return LocalTransactionState.COMMIT_MESSAGE

    config_path = work / "training.toml"
    config_path.write_text(f"lakehouse = {json.dumps(str(work / 'lakehouse'))}\n")  # JSON strings are TOML strings
    config = CoordinatorConfig.load(config_path, environ={})
    lakehouse = Lakehouse.of(config)
    init_lakehouse(lakehouse)
    producer = TransactionProducer(_GROUP, Commit(), config).start()
    try:
        producer.send_message_in_transaction(Message(TRAINING_TOPIC, b"training"), None)
    finally:
        producer.shutdown()
    return config_path, Path(lakehouse.topic(TRAINING_TOPIC))


def _train(config_path: Path, topic: Path, archive: Path, log: Path, timeout_s: float) -> tuple[bool, int]:
    """Launch the checker with ``-XX:ArchiveClassesAtExit``, stop it once ``topic``'s table exists (the
    transaction delivered; or ``timeout_s`` pass, or it exits) and wait for its exit; whether it delivered,
    and its exit status."""
    java_options = driver_java_options(read_spark_defaults(), [f"-XX:ArchiveClassesAtExit={archive}", QUIET])
    argv, env = spark_submit("checker", "--config", str(config_path),
                             conf={"spark.driver.extraJavaOptions": java_options})
    for field in dataclasses.fields(CoordinatorConfig):  # the throwaway lakehouse's settings, not the caller's
        env.pop(f"{ENV_PREFIX}{field.name.upper()}", None)
    with open(log, "wb") as output:
        checker = subprocess.Popen(argv, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    delivered = False
    while checker.poll() is None and time.monotonic() < deadline and not delivered:
        time.sleep(0.2)
        delivered = (topic / "_delta_log").is_dir()
    if checker.poll() is None:
        # The checker's graceful stop (the batch ends, the JVM exits normally), sent to the JVM alone: sent to its
        # process group it also reached a helper the JVM was spawning (Hadoop's chmod), which failed the query.
        checker.send_signal(signal.SIGTERM)
    try:
        return delivered, checker.wait(_EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(checker.pid, signal.SIGKILL)
        return delivered, checker.wait()


def _tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"
