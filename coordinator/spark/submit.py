"""What ``spark-submit`` needs to run txcoord's jobs from an installed package: the job's script (a
file of this package), a properties file with the cached jars and the driver's launch settings, and
an empty ``SPARK_CONF_DIR`` that lets the driver map its class archive (:mod:`.class_archive`).

Example::

    SPARK_CONF_DIR="$(txcoord spark-setup --conf-dir)" spark-submit --master spark://host:7077 \\
        --properties-file "$(txcoord spark-setup --properties-file)" \\
        "$(txcoord spark-setup --job-file checker)" --config /etc/txcoord/coordinator.toml

From Python, :func:`spark_submit` builds that command line with this interpreter's ``spark-submit``.
"""

from __future__ import annotations

import importlib.resources
import os
import sys
from pathlib import Path
from typing import Optional

from coordinator.spark.class_archive import driver_java_options, empty_conf_dir
from coordinator.spark.jars import jars_dir, provided_delta
from coordinator.spark.python_worker import python_worker
from coordinator.spark.session import LAUNCH_SETTINGS, launch_jars, read_spark_defaults

__all__ = ["JOBS", "job_script", "spark_job_environment", "spark_submit", "submit_properties"]

#: The Spark jobs this package ships, by name: the module whose file ``spark-submit`` runs.
JOBS = {"checker": "coordinator.jobs.checker"}


def job_script(name: str) -> Path:
    """The file ``spark-submit`` runs for job ``name`` (one of :data:`JOBS`), wherever the package is installed.

    Example::

        job_script("checker")  # PosixPath('.../site-packages/coordinator/jobs/checker.py')
    """
    package, _, module = JOBS[name].rpartition(".")
    return Path(str(importlib.resources.files(package) / f"{module}.py"))


def submit_properties() -> Optional[Path]:
    """A ``spark-defaults.conf`` for ``spark-submit --properties-file``: the jars txcoord adds and the
    driver's launch settings, written beside the cached jars (which are downloaded first if missing).
    Once ``txcoord spark-setup`` has written the driver's class archive, the driver's JVM options map
    it (:mod:`coordinator.spark.class_archive`: used when ``SPARK_CONF_DIR`` is the empty folder
    :func:`spark_job_environment` sets). None when the Spark in use already has Delta: its own
    configuration then decides.
    """
    settings = read_spark_defaults()
    if provided_delta(settings):
        return None
    launch = {k: v for k, v in settings.items() if k in LAUNCH_SETTINGS and k not in ("spark.master", "spark.jars")}
    launch["spark.driver.extraJavaOptions"] = driver_java_options(settings)
    properties = jars_dir().parent / "spark-conf" / "spark-defaults.conf"
    text = ("# Written by txcoord (`txcoord spark-setup`): the jars it adds to Spark and the driver's launch\n"
            "# settings. For spark-submit --properties-file, or SPARK_CONF_DIR=<this folder>.\n"
            f"spark.jars {','.join(launch_jars(settings))}\n"
            + "".join(f"{k} {v}\n" for k, v in sorted(launch.items()) if v))
    if not properties.exists() or properties.read_text() != text:
        properties.parent.mkdir(parents=True, exist_ok=True)
        staged = properties.with_name(f".{properties.name}.{os.getpid()}")
        staged.write_text(text)
        staged.replace(properties)  # a concurrent reader sees the old file or the new one, never half of one
    return properties


def spark_submit(job: str, *args: str, conf: Optional[dict[str, str]] = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run job ``job`` (a name of :data:`JOBS`, or a script's
    path) with this interpreter's ``spark-submit``: :func:`submit_properties` as its properties file,
    then ``conf`` (Spark settings that win over it).

    Example::

        argv, env = spark_submit("checker", "--config", "conf/coordinator.toml")
        subprocess.Popen(argv, env=env)
    """
    script = job_script(job) if job in JOBS else Path(job)
    properties = submit_properties()
    options = ["--properties-file", str(properties)] if properties is not None else []
    for key, value in (conf or {}).items():
        options += ["--conf", f"{key}={value}"]
    return [str(Path(sys.executable).parent / "spark-submit"), *options, str(script), *args], _environment(properties)


def spark_job_environment() -> dict[str, str]:
    """This environment, with this interpreter's folder first on ``PATH`` and as pyspark's Python (its workers'
    by way of :func:`~coordinator.spark.python_worker.python_worker`),
    and ``SPARK_CONF_DIR`` an empty folder (unless Spark already has Delta): the settings come from
    :func:`submit_properties`, and the driver's class archive needs that folder empty.

    ``spark-submit`` otherwise runs whatever ``python3`` is first on ``PATH``, which need not have
    txcoord installed.
    """
    return _environment(submit_properties())


def _environment(properties: Optional[Path]) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    environment = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
                       PYSPARK_PYTHON=python_worker(), PYSPARK_DRIVER_PYTHON=sys.executable)
    if properties is not None:
        environment["SPARK_CONF_DIR"] = str(empty_conf_dir())
    return environment
