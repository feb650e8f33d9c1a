"""What every Spark job of the project does first: read its config, start Spark, and turn
SIGTERM/SIGINT into a graceful stop (the batch in flight finishes, then exit 0)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Optional

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import CoordinatorError
from coordinator.spark import get_spark

EXIT_USAGE = 2


@dataclass
class JobRuntime:
    """A started job: its arguments, config, Spark session, and the event set on SIGTERM/SIGINT."""

    args: argparse.Namespace
    config: CoordinatorConfig
    spark: object
    stop_requested: threading.Event


def start_job(app_name: str, parser: argparse.ArgumentParser, argv: Optional[list[str]] = None) -> JobRuntime:
    """Parse ``argv`` (``parser`` must have ``--config``), load the config, start Spark, catch signals.

    A bad configuration exits with status 2 and the reason on stderr.

    Example::

        job = start_job("txcoord-checker", parser)
        while not job.stop_requested.is_set(): ...
    """
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = CoordinatorConfig.load(args.config)
    except CoordinatorError as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    stop_requested = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_requested.set())
    spark = get_spark(app_name)
    _forward_jvm_signals(spark, stop_requested)
    return JobRuntime(args, config, spark, stop_requested)


def _forward_jvm_signals(spark, stop_requested: threading.Event) -> None:
    """Make the JVM hand SIGTERM/SIGINT to our graceful stop instead of exiting at once.

    Under spark-submit the JVM is the parent process and is signalled first; when Python
    started the JVM, a signal sent to the whole process group (``kill -TERM -PGID``,
    ``timeout``, service managers) reaches it too. Either way it would otherwise die
    mid-batch.
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
