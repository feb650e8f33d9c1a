"""The driver JVM's class-data-sharing archive: the Java classes a checker's start loads (Spark,
Delta, Structured Streaming), written once by a short training run of the checker
(:mod:`coordinator.jobs.training`, run by ``txcoord spark-setup``) and mapped by every later start
instead of being loaded and verified again (what that saves: docs/performance-log.md#backlog-drain, "Start-up
and takeovers").

JDK 17's dynamic archive (``-XX:ArchiveClassesAtExit`` to write, ``-XX:SharedArchiveFile`` to use)
holds only for the class path it was written with, and refuses a directory on it that is not empty.
Spark's launcher puts its configuration folder (``SPARK_CONF_DIR``) first on the class path, so the
launches that use the archive set ``SPARK_CONF_DIR`` to :func:`empty_conf_dir` and take their
settings from a properties file instead. A JVM that cannot use the archive (another JDK, another
Spark, another class path) starts as it would without one: its refusal is kept out of the logs.

Example::

    from coordinator.spark.class_archive import archive_java_options
    archive_java_options()  # ['-XX:SharedArchiveFile=/home/me/.cache/txcoord/spark/.../classes-3f1c....jsa', ...]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Mapping, Optional

from coordinator.spark.jars import jars_dir, spark_home

__all__ = ["archive_java_options", "can_share_classes", "class_archive", "driver_java_options", "empty_conf_dir",
           "record_identity", "remove_stale_archives"]

#: The JVM's words about its archive (a refused archive, classes it skips while writing one) stay out
#: of the job's log: the archive is a cache, and a start without it is only slower.
QUIET = "-Xlog:cds*=off,class+path=off"


def class_archive() -> Path:
    """Where the archive for the JVM and the Spark in use is (whether written yet or not): beside the
    cached jars, named after what it is only valid for (the ``java`` Spark's launcher runs, the Spark
    installation and its jars).

    Example::

        class_archive()  # PosixPath('/home/me/.cache/txcoord/spark/176ec8430039e17e/class-archive/classes-3f1c2a90b4d5e6f7.jsa')
    """
    return _archive_dir() / f"classes-{_identity(_java(), spark_home())}.jsa"


def record_identity(archive: Path) -> None:
    """Note beside ``archive`` the JVM and Spark installation it is for (:func:`remove_stale_archives` reads it)."""
    archive.with_suffix(".json").write_text(json.dumps({"java": str(_java()), "spark_home": str(spark_home().resolve())}))


def remove_stale_archives() -> None:
    """Delete the archives (large: docs/performance-log.md#figures-quoted-elsewhere-before) whose JVM or Spark
    installation is gone or has changed since; those of other installations still in place stay."""
    for archive in _archive_dir().glob("classes-*.jsa"):
        try:
            identity = json.loads(archive.with_suffix(".json").read_text())
            current = _identity(Path(identity["java"]), Path(identity["spark_home"]))
        except (OSError, ValueError, KeyError):
            current = None
        if archive.name != f"classes-{current}.jsa":
            archive.unlink(missing_ok=True)
            archive.with_suffix(".json").unlink(missing_ok=True)


def empty_conf_dir() -> Path:
    """The Spark configuration folder of every launch that uses the archive: empty, at the same path
    every time (created if missing)."""
    folder = _archive_dir() / "spark-conf-dir"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def archive_java_options() -> list[str]:
    """The driver's JVM options that map the archive: none until it is written."""
    archive = class_archive()
    return [f"-XX:SharedArchiveFile={archive}", QUIET] if archive.is_file() else []


def driver_java_options(settings: Mapping[str, str], options: Optional[list[str]] = None) -> str:
    """``spark.driver.extraJavaOptions`` of ``settings``, with ``options`` after them (default:
    :func:`archive_java_options`).

    Example::

        driver_java_options({"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"})
        # '-XX:+UseSerialGC -XX:SharedArchiveFile=/home/me/.cache/txcoord/.../classes-3f1c....jsa -Xlog:cds*=off,class+path=off'
    """
    options = archive_java_options() if options is None else options
    return " ".join([settings.get("spark.driver.extraJavaOptions", ""), *options]).strip()


def can_share_classes(environ: Optional[dict] = None) -> bool:
    """Whether a JVM launched from ``environ`` (default: this process's) may be given the archive's
    class path: its ``SPARK_CONF_DIR`` is :func:`empty_conf_dir`, or it has none and the Spark
    installation no ``conf`` folder of its own (pyspark's has none) that setting one would hide.

    Example::

        can_share_classes({"SPARK_CONF_DIR": "/etc/spark"})  # False: that folder's settings come first
    """
    environ = os.environ if environ is None else environ
    conf_dir = environ.get("SPARK_CONF_DIR")
    if conf_dir:
        return Path(conf_dir) == empty_conf_dir()
    installed = spark_home() / "conf"
    return not (installed.is_dir() and any(installed.iterdir()))


def _archive_dir() -> Path:
    return jars_dir().parent / "class-archive"


def _identity(java: Path, home: Path) -> Optional[str]:
    """What an archive is valid for, as a short digest; None when that JVM or Spark is gone."""
    if not java.is_file():
        return None
    try:
        identity = [str(java), str(home.resolve()), *sorted(os.listdir(home / "jars"))]
    except OSError:
        return None
    return hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]


def _java() -> Path:
    """The ``java`` Spark's launcher (``bin/spark-class``) runs: ``$JAVA_HOME/bin/java``, else the first
    on ``PATH``; resolved, so that a new JDK behind the same link makes a new archive."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or "java"
    return Path(java).resolve()
