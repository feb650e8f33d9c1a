"""Getting a lakehouse and its checker going: ``txcoord init``, ``checker`` and ``spark-setup``."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from coordinator.cli import output
from coordinator.cli.options import EXIT_FAILED, EXIT_OK, common_options
from coordinator.config import CoordinatorConfig
from coordinator.exceptions import SparkSetupError
from coordinator.lakehouse import Lakehouse

__all__ = ["register", "run_checker", "run_init", "run_spark_setup"]


def register(commands) -> None:
    """``init``, ``checker`` and ``spark-setup``, on ``commands`` (the ``txcoord`` parser's sub-parsers)."""
    _add_init(commands)
    _add_checker(commands)
    _add_spark_setup(commands)


def _add_init(commands) -> None:
    init = commands.add_parser("init", help="create the lakehouse's system tables, and the config file if missing "
                                            "(idempotent)")
    common_options(init)
    init.set_defaults(run=run_init)


def run_init(args: argparse.Namespace) -> int:
    """Create the missing system tables of the configured lakehouse and say which.

    Example::

        $ txcoord init --config conf/coordinator.toml
        created system/commit_log
        ...
        lakehouse /work/lakehouse initialised: 7 table(s) created
    """
    from coordinator.lakehouse import init_lakehouse

    written = _write_missing_config(args.config)
    config = CoordinatorConfig.load(args.config)
    root = Lakehouse.of(config).root
    created = init_lakehouse(Lakehouse.of(config))
    if args.json:
        output.print_json({"lakehouse": root, "created": created, "config_written": written})
        return EXIT_OK
    if written:
        print(f"wrote {written} (every setting at its default, each explained)")
    for name in created:
        print(f"created {name}")
    if created:
        print(f"lakehouse {root} initialised: {len(created)} table(s) created")
    else:
        print(f"lakehouse {root} already initialised")
    return EXIT_OK


def _write_missing_config(path: Optional[str]) -> Optional[str]:
    """Write the commented default configuration to ``path`` if it names a file that does not exist."""
    from importlib.resources import files
    from pathlib import Path

    if path is None or Path(path).exists():
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text((files("coordinator.resources") / "coordinator.toml").read_text())
    return path


def _add_checker(commands) -> None:
    from coordinator.jobs import checker

    run_checker_command = commands.add_parser(
        "checker", help="run the checker until SIGTERM (needs txcoord[spark]; exit 3: another holds the lease, "
                        "4: the checkpoint needs --recover-checkpoint)")
    checker.add_arguments(run_checker_command)
    run_checker_command.set_defaults(run=run_checker, json=False)


def run_checker(args: argparse.Namespace) -> int:
    """Run the checker job (:mod:`coordinator.jobs.checker`) in this process until SIGTERM or SIGINT.

    Example::

        $ txcoord checker --config conf/coordinator.toml
    """
    from coordinator.jobs import checker

    return checker.run(args, "txcoord checker")


def _add_spark_setup(commands) -> None:
    spark_setup = commands.add_parser("spark-setup", help="cache the jars Spark needs (once, then offline) and print "
                                                          "what spark-submit needs to run the jobs")
    shown = spark_setup.add_mutually_exclusive_group()
    shown.add_argument("--properties-file", action="store_true",
                       help="print only the file to pass as spark-submit --properties-file")
    shown.add_argument("--conf-dir", action="store_true",
                       help="print only the empty folder to set as SPARK_CONF_DIR beside --properties-file, "
                            "which lets the driver map its class archive")
    shown.add_argument("--job-file", choices=sorted(_spark_jobs()), metavar="JOB",
                       help=f"print only the script spark-submit runs for JOB ({', '.join(sorted(_spark_jobs()))})")
    spark_setup.add_argument("--no-class-archive", dest="class_archive", action="store_false",
                             help="do not write the driver's class archive (a short run of the checker, once per JDK "
                                  "and Spark, that makes every later start of a job faster: docs/performance.md)")
    spark_setup.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    spark_setup.set_defaults(run=run_spark_setup)


def run_spark_setup(args: argparse.Namespace) -> int:
    """Cache the jars Spark needs (with a progress display, the first time), write the driver's class
    archive if missing (:mod:`coordinator.jobs.training`; a failure there is said and skipped) and
    print what ``spark-submit`` takes to run txcoord's jobs from this installation.

    Example::

        $ SPARK_CONF_DIR="$(txcoord spark-setup --conf-dir)" \\
              spark-submit --properties-file "$(txcoord spark-setup --properties-file)" \\
              "$(txcoord spark-setup --job-file checker)" --config conf/coordinator.toml
    """
    from coordinator.spark.class_archive import class_archive, empty_conf_dir
    from coordinator.spark.jars import provided_delta
    from coordinator.spark.session import launch_jars, read_spark_defaults
    from coordinator.spark.submit import job_script, submit_properties

    if args.job_file:
        print(job_script(args.job_file))
        return EXIT_OK
    settings = read_spark_defaults()
    provider = provided_delta(settings)
    if args.properties_file or args.conf_dir:
        properties = submit_properties()
        if properties is None:
            print(f"txcoord spark-setup: Spark already has Delta ({provider}); its own configuration applies",
                  file=sys.stderr)
            return EXIT_FAILED
        print(empty_conf_dir() if args.conf_dir else properties)
        return EXIT_OK
    jars = launch_jars(settings)
    archive = None if provider else class_archive()
    if archive is not None and args.class_archive and not archive.is_file():
        _write_class_archive()
    properties = submit_properties()
    archive = archive if archive is not None and archive.is_file() else None
    conf_dir = empty_conf_dir() if properties is not None else None
    jobs = {name: str(job_script(name)) for name in sorted(_spark_jobs())}
    if args.json:
        output.print_json({"properties_file": str(properties) if properties else None, "jars": jars,
                           "delta_provided_by": provider, "class_archive": str(archive) if archive else None,
                           "spark_conf_dir": str(conf_dir) if conf_dir else None, "jobs": jobs})
    else:
        output.print_spark_setup(properties, jars, provider, archive, conf_dir, jobs)
    return EXIT_OK


def _write_class_archive() -> None:
    from coordinator.jobs.training import write_class_archive

    print("txcoord spark-setup: writing the driver's class archive (once per JDK and Spark: a short run of the "
          "checker, about half a minute)", file=sys.stderr, flush=True)
    try:
        archive = write_class_archive()
    except SparkSetupError as error:
        print(f"txcoord spark-setup: {error}\nThe jobs start without one, slower; "
              "`txcoord spark-setup` tries again.", file=sys.stderr)
        return
    print(f"txcoord spark-setup: class archive written ({archive.stat().st_size / 1e6:.0f} MB)", file=sys.stderr)


def _spark_jobs() -> dict[str, str]:
    from coordinator.spark.submit import JOBS

    return JOBS
