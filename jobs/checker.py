"""The checker job: ``spark-submit jobs/checker.py --config conf/coordinator.toml``.

Runs until SIGTERM or SIGINT, then lets the batch in flight finish and exits 0.
Also runs as ``python jobs/checker.py --config ...``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from coordinator.checker import CheckerQuery
from coordinator.config import CoordinatorConfig
from coordinator.exceptions import CoordinatorError
from coordinator.spark import get_spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the transaction checker over a lakehouse.")
    parser.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = CoordinatorConfig.load(args.config)
    except CoordinatorError as error:
        print(f"checker: {error}", file=sys.stderr)
        return 2

    stop_requested = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_requested.set())

    spark = get_spark("txcoord-checker")
    _forward_jvm_signals(spark, stop_requested)
    checker = CheckerQuery(spark, config).start()
    try:
        while not stop_requested.is_set():
            if checker.await_termination(1):
                print("checker: the streaming query ended unexpectedly", file=sys.stderr)
                return 1
        checker.stop()
    finally:
        spark.stop()
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
