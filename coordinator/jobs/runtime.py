"""What every Spark job of the project does first: read its config, start Spark, and turn
SIGTERM/SIGINT into a graceful stop (the batch in flight finishes, then exit 0)."""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from coordinator.config import EXIT_USAGE, CoordinatorConfig
from coordinator.exceptions import CoordinatorError, SparkSetupError
from coordinator.lakehouse import Lakehouse
from coordinator.spark.session import lakehouse_spark

__all__ = ["JVM_EXIT_TIMEOUT_S", "JobRuntime", "start_job", "stop_spark"]

log = logging.getLogger("coordinator.jobs")

#: Seconds the JVM this process started has to exit once Spark has stopped, before it is killed.
JVM_EXIT_TIMEOUT_S = 30.0


@dataclass
class JobRuntime:
    """A started job: its arguments, config, Spark session, and the event set on SIGTERM/SIGINT."""

    args: argparse.Namespace
    config: CoordinatorConfig
    spark: object
    stop_requested: threading.Event

    def close(self) -> None:
        """Stop Spark, and the JVM if this process started it (:func:`stop_spark`)."""
        stop_spark(self.spark)


def start_job(app_name: str, args: argparse.Namespace, prog: str,
              before_spark: Optional[Callable[[argparse.Namespace, CoordinatorConfig], None]] = None) -> JobRuntime:
    """Load the config ``args.config`` names, start Spark, catch signals.

    A bad configuration, or a Spark that cannot start with Delta, exits with status 2 and the
    reason on stderr, after ``prog``. ``before_spark(args, config)`` runs before Spark starts: what
    it raises, it raises before any JVM is up.

    Example::

        job = start_job("txcoord-checker", parser.parse_args(), parser.prog)
        while not job.stop_requested.is_set(): ...
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = CoordinatorConfig.load(args.config)
    except CoordinatorError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    if before_spark is not None:
        before_spark(args, config)
    stop_requested = threading.Event()
    _stop_on_signals(stop_requested)
    try:
        spark = lakehouse_spark(app_name, Lakehouse.of(config))
    except SparkSetupError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        stop_spark(None)  # a Spark up without Delta
        raise SystemExit(EXIT_USAGE) from None
    _stop_on_signals(stop_requested)  # again: the SparkContext replaced SIGINT's handler with its own
    _forward_jvm_signals(spark, stop_requested)
    return JobRuntime(args, config, spark, stop_requested)


def stop_spark(spark) -> None:
    """Stop ``spark`` (``None``: the active Spark context, if any) and, when this process launched its JVM
    (``txcoord checker``, ``python jobs/checker.py``), end that JVM and wait for its exit.

    Left to itself, that JVM exits only once this process has (it reads its standard input to the end), so it
    and the Python workers it started (in process groups of their own) outlived the job.
    Under ``spark-submit`` the JVM is this process's parent, and waits for it: nothing to do here.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway if spark is None else spark.sparkContext._gateway
    try:
        if spark is not None:
            spark.stop()
        elif SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
    finally:
        jvm = getattr(gateway, "proc", None)  # None when the JVM was there first (spark-submit)
        if isinstance(jvm, subprocess.Popen):
            gateway.shutdown()  # its connections and callback server, before the JVM they talk to goes
            jvm.stdin.close()  # the end of its input: it exits, its shutdown hooks run
            try:
                jvm.wait(JVM_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("the JVM did not exit within %g s of Spark's stop; killing it", JVM_EXIT_TIMEOUT_S)
                jvm.kill()
                jvm.wait()


def _stop_on_signals(stop_requested: threading.Event) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_requested.set())


def _forward_jvm_signals(spark, stop_requested: threading.Event) -> None:
    """Make the JVM hand SIGTERM/SIGINT to our graceful stop instead of exiting at once.

    Under spark-submit the JVM is the parent process and is signalled first; when Python
    started the JVM, a signal sent to the whole process group (``kill -TERM -PGID``,
    ``timeout``, systemd) reaches it too. Either way it would otherwise die mid-batch. The
    Python helper the JVM starts for the commit-log source ignores both signals
    (:mod:`coordinator.checker.source`), so a stop sent to the whole group is graceful too.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)

    class StopOnSignal:
        def handle(self, signal_):
            stop_requested.set()

        class Java:
            implements = ["sun.misc.SignalHandler"]

    handler = StopOnSignal()
    for name in ("TERM", "INT"):
        gateway.jvm.sun.misc.Signal.handle(gateway.jvm.sun.misc.Signal(name), handler)
