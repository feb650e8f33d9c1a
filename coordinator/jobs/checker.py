"""The checker job: ``txcoord checker --config FILE``, or under ``spark-submit`` (this file, which
``txcoord spark-setup --job-file checker`` names; ``jobs/checker.py`` in a checkout).

Runs until SIGTERM or SIGINT, then lets the batch in flight finish and exits 0. While another
checker holds the lakehouse's lease it stands by, and starts the moment the lease lapses (at once if
its holder's process is gone from this host, as after ``kill -9``). Exit status: 0 stopped on
request (standing by too, or the query failing as the stop signal arrived), 1 the streaming query
failed, 2 bad arguments or configuration, or a Spark that cannot start with Delta, 3 another checker
is running on the same lakehouse (only with ``--exit-if-running``, or with ``--recover-checkpoint``,
which does not stand by), 4 the checkpoint is missing, foreign or older than the lakehouse (run once
with ``--recover-checkpoint``, see docs/operations.md#streaming-checkpoints-and-recovery).

Example::

    $ txcoord checker --config conf/coordinator.toml
    $ SPARK_CONF_DIR="$(txcoord spark-setup --conf-dir)" spark-submit \\
          --properties-file "$(txcoord spark-setup --properties-file)" \\
          "$(txcoord spark-setup --job-file checker)" --config conf/coordinator.toml
"""

from __future__ import annotations

import argparse
import sys

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import CheckerAlreadyRunningError, CheckpointMismatchError
from coordinator.jobs.runtime import start_job

__all__ = ["EXIT_ALREADY_RUNNING", "EXIT_CHECKPOINT_MISMATCH", "add_arguments", "main", "run"]

EXIT_ALREADY_RUNNING = 3
EXIT_CHECKPOINT_MISMATCH = 4
#: Seconds a failed streaming query waits for a stop signal sent at the same moment (see :func:`run`).
STOP_SIGNAL_RACE_S = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The checker's options, on ``parser`` (this job's own, or ``txcoord checker``'s)."""
    parser.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    parser.add_argument("--recover-checkpoint", action="store_true",
                        help="first replay the last recorded batch and start a new checkpoint after it "
                             "(after exit code 4: the checkpoint was lost, foreign or stale)")
    parser.add_argument("--exit-if-running", action="store_true",
                        help=f"exit {EXIT_ALREADY_RUNNING} if another checker holds the lease, "
                             "instead of standing by until it lapses")


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and run the checker; return its exit status."""
    parser = argparse.ArgumentParser(prog="checker", description="Run the transaction checker over a lakehouse.")
    add_arguments(parser)
    return run(parser.parse_args(argv), parser.prog)


def run(args: argparse.Namespace, prog: str) -> int:
    """Run the checker with parsed ``args`` until asked to stop; return its exit status."""
    from coordinator.checker import CHECKER_NAME

    try:
        job = start_job(CHECKER_NAME, args, prog, before_spark=_refuse_if_held)
    except CheckerAlreadyRunningError as error:
        print(f"{prog}: {error}", file=sys.stderr, flush=True)
        return EXIT_ALREADY_RUNNING
    from pyspark.errors import StreamingQueryException

    from coordinator.checker.allocator import use_system_allocator
    from coordinator.checker.query import CheckerQuery

    use_system_allocator()

    checker = maintenance = None
    try:
        checker = CheckerQuery(job.spark, job.config)
        try:
            if job.args.recover_checkpoint:
                CheckerQuery(job.spark, job.config).recover()
            checker.start(wait_for_lease=not job.args.exit_if_running, stop=job.stop_requested)
        except (CheckerAlreadyRunningError, CheckpointMismatchError) as error:
            # Said before Spark stops: under spark-submit the JVM relays this process's output.
            print(f"{prog}: {error}", file=sys.stderr, flush=True)
            if isinstance(error, CheckpointMismatchError):
                return EXIT_CHECKPOINT_MISMATCH
            return 0 if job.stop_requested.is_set() else EXIT_ALREADY_RUNNING
        if checker.metrics_port is not None:
            from coordinator.jobs.consumer_metrics import watch_consumer_groups

            watch_consumer_groups(checker.exporter.registry, job.config)
        maintenance = _scheduled_maintenance(job.config, checker)
        while not job.stop_requested.is_set():
            try:
                if checker.await_termination(1):
                    print(f"{prog}: the streaming query ended unexpectedly", file=sys.stderr)
                    return 1
            except StreamingQueryException:
                if not job.stop_requested.wait(STOP_SIGNAL_RACE_S):
                    raise
        maintenance.close()  # before the lease goes
        checker.stop()
        failure = checker.failure()
        if failure is not None:
            # A stop sent to the whole process group (Ctrl-C, systemd) also reaches the helpers the JVM
            # spawns: Hadoop runs `chmod` for each checkpoint file it writes on a local disk, and one killed
            # mid-write fails the query, before or after this loop sees the stop. The stop was asked for and
            # nothing is lost (every write is replay-safe): it ends as a stop.
            print(f"{prog}: stopped; the streaming query failed as the stop signal arrived, its last batch "
                  f"runs again at the next start: {' '.join(str(failure).split())[:300]}", file=sys.stderr, flush=True)
    finally:
        # Whatever the exit (a stop, a failed batch, a failed start): no process of the checker's outlives it.
        # Its own workers first, then Spark (which ends the Python workers the JVM started), then the JVM.
        if maintenance is not None:
            maintenance.close()
        if checker is not None:
            checker.read_ahead.close()
        job.close()
    return 0


def _scheduled_maintenance(config: CoordinatorConfig, checker):
    """Maintenance of every table on the schedule ``config`` sets, while ``checker`` holds the lease, counted in
    its metrics (:mod:`coordinator.jobs.maintenance`); started."""
    from coordinator.jobs.maintenance import ScheduledMaintenance, holds

    def counted(run) -> None:
        checker.exporter.maintenance_done(run.maintained, len(run.failed), run.seconds)

    return ScheduledMaintenance(config, holding=lambda: holds(checker.lease), on_run=counted).start()


def _refuse_if_held(args: argparse.Namespace, config: CoordinatorConfig) -> None:
    # A start that would not stand by says so at once, before starting a JVM for nothing.
    if args.exit_if_running or args.recover_checkpoint:
        from coordinator.control.lease import CheckerLease
        from coordinator.lakehouse import Lakehouse

        CheckerLease(Lakehouse.of(config), ttl_s=config.checker_lease_ttl_ms / 1000).ensure_free()


if __name__ == "__main__":
    sys.exit(main())
