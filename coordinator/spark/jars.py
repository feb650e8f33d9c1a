"""The jars the coordinator adds to Spark: Delta, Hadoop's S3A connector with the parts of the AWS
SDK it uses, Hadoop's ABFS connector (Azure) and Spark's checkpoint file manager for object stores, pinned
by ``spark-jars.lock`` (shipped in this package) and cached per user.

The cache is filled on first need (a progress display on stderr), then every start reads only local
files. It lives in the user's cache directory (``~/.cache/txcoord`` on Linux), or where
``TXCOORD_CACHE_DIR`` says; the jars come from Maven Central, or the repository
``TXCOORD_MAVEN_REPOSITORY`` names (an organisation's mirror). A Spark that already has Delta (a
cluster's own installation, or ``spark.jars.packages``) is used as it is: nothing is downloaded.

Example::

    from coordinator.spark.jars import cached_jars
    cached_jars()  # ['/home/me/.cache/txcoord/spark/5c1e.../jars/io.delta_delta-spark_4.2_2.13-4.4.0.jar', ...]

``txcoord spark-setup`` fills the cache; in a checkout, ``python scripts/lock_spark_jars.py``
re-resolves the lock with Spark's Ivy (after changing pyspark, delta-spark or the SDK version).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.metadata
import importlib.resources
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional

from coordinator.exceptions import SparkSetupError

__all__ = ["CHECKPOINT_MANAGER_PACKAGE", "cache_dir", "cached_jars", "delta_package", "exclusively", "provided_delta", "spark_home", "spark_packages"]

CACHE_DIR_VARIABLE = "TXCOORD_CACHE_DIR"
MAVEN_REPOSITORY_VARIABLE = "TXCOORD_MAVEN_REPOSITORY"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
#: The lock this package ships: each jar's Maven coordinates and SHA-256, for the packages on its first line.
JARS_LOCK = Path(str(importlib.resources.files("coordinator.spark") / "spark-jars.lock"))

#: The AWS SDK v2 that hadoop-aws 3.5.0 (pyspark 4.2's Hadoop) is built against. hadoop-aws declares
#: the SDK's whole ``bundle``, many times the size of the few modules S3A needs: only these, with their
#: dependencies (the sizes: docs/performance-log.md#figures-quoted-elsewhere-before).
AWS_SDK_VERSION = "2.35.4"
_S3A_SDK_MODULES = ("s3", "s3-transfer-manager", "sts")
#: Spark's checkpoint file manager for object stores (``AbortableStreamBasedCheckpointFileManager``: writes a
#: checkpoint file in place through S3A's abortable upload, where the default writes a temporary file and
#: renames it, a copy and a delete on S3). Its jar holds only that class and a committer, and only the jar is
#: pinned (its Maven dependencies are the cloud connectors, unused). Spark publishes it up to 4.1.2; its
#: classes extend Spark 4.2's unchanged ones. The checker falls back on it when txcoord's own manager, one
#: conditional PUT a file, could not be compiled
#: (:func:`~coordinator.spark.session.write_streaming_checkpoints_in_place`).
CHECKPOINT_MANAGER_PACKAGE = "org.apache.spark:spark-hadoop-cloud_2.13:4.1.2"
#: Left out of the resolution: the SDK's bundle (above); the Azure SDK that only hadoop-azure's WASB driver used,
#: which 3.5.0 has replaced by a stub that refuses ``wasb://``; Hadoop's shaded Guava, which Spark's
#: ``hadoop-client-runtime`` already holds.
_EXCLUDED_PACKAGES = ",".join(("software.amazon.awssdk:bundle", "com.microsoft.azure:azure-storage",
                               "org.apache.hadoop.thirdparty:hadoop-shaded-guava"))
_DOWNLOAD_THREADS = 8


def cache_dir() -> Path:
    """Where txcoord caches what it downloads: ``TXCOORD_CACHE_DIR``, else the user's cache directory.

    Example::

        cache_dir()  # PosixPath('/home/me/.cache/txcoord')
    """
    from platformdirs import user_cache_dir

    return Path(os.environ.get(CACHE_DIR_VARIABLE) or user_cache_dir("txcoord", appauthor=False))


def spark_home() -> Path:
    """The Spark installation in use: ``SPARK_HOME``, else the one pyspark ships."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    return Path(pyspark().__file__).parent


def pyspark():
    """The pyspark module; :class:`SparkSetupError` saying how to install it when it is missing."""
    try:
        import pyspark
    except ImportError:
        raise SparkSetupError("pyspark is not installed: the checker and Spark jobs need "
                              "`pip install 'txcoord[spark]'`") from None
    return pyspark


def provided_delta(settings: Mapping[str, str]) -> Optional[str]:
    """What already gives the Spark in use Delta, if anything: a Delta jar in its ``jars/`` folder
    (a cluster's own installation), or ``spark.jars.packages`` naming Delta. None when txcoord's
    cached jars are needed.

    Example::

        provided_delta({"spark.jars.packages": "io.delta:delta-spark_4.2_2.13:4.4.0"})
        # 'spark.jars.packages io.delta:delta-spark_4.2_2.13:4.4.0'
    """
    packages = settings.get("spark.jars.packages", "")
    if "io.delta:" in packages:
        return f"spark.jars.packages {packages}"
    installed = sorted(glob.glob(str(spark_home() / "jars" / "*delta-spark_*.jar")))
    return installed[0] if installed else None


def delta_package() -> str:
    """Maven coordinates of the Delta build matching the installed pyspark and delta-spark.

    Example::

        delta_package()  # 'io.delta:delta-spark_4.2_2.13:4.4.0'
    """
    spark_minor = ".".join(pyspark().__version__.split(".")[:2])
    try:
        delta = importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        raise SparkSetupError("delta-spark is not installed: `pip install 'txcoord[spark]'` installs it with pyspark") from None
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta}"


def spark_packages() -> list[str]:
    """Maven coordinates of the jars the project adds to Spark: Delta, the S3A connector of pyspark's
    Hadoop with the parts of the AWS SDK it uses, the ABFS connector of the same Hadoop, and the checkpoint
    file manager for object stores (:data:`CHECKPOINT_MANAGER_PACKAGE`, its jar alone).

    Example::

        spark_packages()[:2]  # ['io.delta:delta-spark_4.2_2.13:4.4.0', 'org.apache.hadoop:hadoop-aws:3.5.0']
    """
    hadoop = _hadoop_version()
    return [delta_package(), f"org.apache.hadoop:hadoop-aws:{hadoop}",
            *(f"software.amazon.awssdk:{module}:{AWS_SDK_VERSION}" for module in _S3A_SDK_MODULES),
            f"org.apache.hadoop:hadoop-azure:{hadoop}", CHECKPOINT_MANAGER_PACKAGE]


def jars_dir() -> Path:
    """The cached jars of this package's lock: one folder per lock, so installs of several versions
    share the cache without mixing their jars."""
    pinned = sorted(line for line in JARS_LOCK.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return cache_dir() / "spark" / hashlib.sha256("\n".join(pinned).encode()).hexdigest()[:16] / "jars"


def cached_jars() -> list[str]:
    """The jars the lock pins, downloaded first if the cache lacks them (once, with a progress display).

    Raises :class:`SparkSetupError` naming the URL when a jar cannot be downloaded or does not match
    its SHA-256, and when the installed pyspark and delta-spark are not the pair the lock is for.
    """
    pinned = _read_lock(spark_packages())  # at every start: pyspark may have changed since the jars were cached
    directory = jars_dir()
    complete = directory / ".complete"
    if not complete.exists():
        with exclusively(directory.parent / ".lock"):  # a second process waits, then finds the jars
            if not complete.exists():
                _download(pinned, directory)
                complete.touch()
    return sorted(glob.glob(str(directory / "*.jar")))


def lock_jars() -> Path:
    """Resolve :func:`spark_packages` with Spark's Ivy and pin the result in :data:`JARS_LOCK`.

    Run it in a checkout after changing pyspark, delta-spark or the SDK version (``python
    scripts/lock_spark_jars.py``), and commit the new lock. Jars Spark already ships (Hadoop,
    Parquet, Jackson…) are left out so only one version of each class is on the classpath.
    """
    packages = spark_packages()
    resolved = [package for package in packages if package != CHECKPOINT_MANAGER_PACKAGE]
    # Delta and the connectors resolved at once, each in its own Ivy cache: resolution mostly waits on Maven Central.
    jars = _resolve_with_ivy({"delta": resolved[:1], "connectors": resolved[1:]})
    pins = []
    for jar in jars:
        # Ivy names retrieved jars "<organisation>_<artifact>-<revision>.jar".
        group, file_name = os.path.basename(jar).split("_", 1)
        artifact = _artifact(file_name)
        version = file_name[len(artifact) + 1:-len(".jar")]
        pins.append(f"{group}:{artifact}:{version} {hashlib.sha256(Path(jar).read_bytes()).hexdigest()}\n")
    with urllib.request.urlopen(_jar_url(_maven_repository(), CHECKPOINT_MANAGER_PACKAGE), timeout=60) as response:
        pins.append(f"{CHECKPOINT_MANAGER_PACKAGE} {hashlib.sha256(response.read()).hexdigest()}\n")
    JARS_LOCK.write_text("".join([f"# packages {','.join(packages)}\n",
                                  "# Written by `python scripts/lock_spark_jars.py`: the jars txcoord adds to Spark.\n",
                                  *sorted(pins)]))
    return JARS_LOCK


def _read_lock(packages: list[str]) -> dict[str, str]:
    """Coordinates -> SHA-256 of every jar the lock pins; refuses a pyspark/delta-spark pair it is not for."""
    locked_packages, pinned = [], {}
    for line in JARS_LOCK.read_text().splitlines():
        if line.startswith("# packages "):
            locked_packages = line.removeprefix("# packages ").split(",")
        elif line.strip() and not line.startswith("#"):
            coordinates, digest = line.split()
            pinned[coordinates] = digest
    if list(map(_release_line, locked_packages)) != list(map(_release_line, packages)):
        raise SparkSetupError(
            f"this txcoord runs Spark with {', '.join(locked_packages or ['nothing'])}, but the installed pyspark "
            f"{pyspark().__version__} with delta-spark need {', '.join(packages)}: install the pair txcoord declares "
            "(`pip install 'txcoord[spark]'`), or, in a checkout, re-lock with `python scripts/lock_spark_jars.py` "
            "(network access) and commit the lock"
        )
    return pinned


def _release_line(coordinates: str) -> str:
    """Coordinates without Delta's patch version: delta-spark's Python API of any 4.4.x drives the
    locked 4.4 jars (its artifact name carries the Spark minor version, which must match)."""
    if coordinates.startswith("io.delta:"):
        return coordinates.rsplit(".", 1)[0]
    return coordinates


@contextmanager
def exclusively(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file`` (created if missing) for the ``with`` block: a second process waits."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _download(pinned: Mapping[str, str], directory: Path) -> None:
    """Fetch every pinned jar into ``directory`` at once, each checked against its SHA-256, with a
    progress display on stderr; ``directory`` appears only once all are there."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    repository = _maven_repository()
    console = Console(stderr=True)
    console.print(f"txcoord: caching the {len(pinned)} jars Spark needs for Delta, S3 and Azure (once) in {directory.parent}, "
                  f"from {repository}", highlight=False)
    staging = directory.with_name("jars.download")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    columns = (TextColumn("downloading"), BarColumn(), TextColumn("{task.fields[jars]} jars"), DownloadColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("jars", total=None, jars=f"0/{len(pinned)}")
        done = []

        def fetch(coordinates: str) -> None:
            group, artifact, version = coordinates.split(":")
            url = _jar_url(repository, coordinates)
            digest, chunks = hashlib.sha256(), []
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    while chunk := response.read(1 << 16):
                        digest.update(chunk)
                        chunks.append(chunk)
                        progress.advance(task, len(chunk))
            except OSError as error:
                raise SparkSetupError(f"could not download {url}: {error}") from error
            if digest.hexdigest() != pinned[coordinates]:
                raise SparkSetupError(f"{url} does not match the SHA-256 {JARS_LOCK.name} pins for it")
            (staging / f"{group}_{artifact}-{version}.jar").write_bytes(b"".join(chunks))
            done.append(coordinates)
            progress.update(task, jars=f"{len(done)}/{len(pinned)}")

        with ThreadPoolExecutor(max_workers=_DOWNLOAD_THREADS) as pool:
            list(pool.map(fetch, pinned))
        size = progress.tasks[0].completed
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    console.print(f"txcoord: cached {len(pinned)} jars ({size / 1e6:.1f} MB) in {time.monotonic() - started:.1f} s",
                  highlight=False)


def _maven_repository() -> str:
    return os.environ.get(MAVEN_REPOSITORY_VARIABLE, MAVEN_CENTRAL).rstrip("/")


def _jar_url(repository: str, coordinates: str) -> str:
    group, artifact, version = coordinates.split(":")
    return f"{repository}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"


def _resolve_with_ivy(groups: dict[str, list[str]]) -> list[str]:
    """Resolve each group of packages with Spark's Ivy, all at once; the jars Spark lacks, one version each."""
    ivy = cache_dir() / "ivy"
    resolutions = {}
    for name, packages in groups.items():
        probe = (
            "from pyspark.sql import SparkSession\n"
            f"SparkSession.builder.master('local[1]').config('spark.jars.packages', {','.join(packages)!r})"
            f".config('spark.jars.excludes', {_EXCLUDED_PACKAGES!r})"
            f".config('spark.jars.ivy', {str(ivy / name)!r}).config('spark.ui.enabled', 'false')"
            ".getOrCreate().stop()\n"
        )
        resolutions[name] = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True)
    for name, resolution in resolutions.items():
        _, errors = resolution.communicate()
        if resolution.returncode != 0:
            raise SparkSetupError(f"could not resolve {', '.join(groups[name])} from Maven Central:\n{errors[-4000:]}")
    spark_jars = {_artifact(name) for name in os.listdir(spark_home() / "jars")}
    newest: dict[str, str] = {}  # artifact -> its newest jar among the groups (one version on the classpath)
    for name in groups:
        for jar in glob.glob(str(ivy / name / "jars" / "*.jar")):
            artifact = _artifact(os.path.basename(jar).split("_", 1)[1])
            if artifact not in spark_jars and (artifact not in newest or _revision(jar) > _revision(newest[artifact])):
                newest[artifact] = jar
    return list(newest.values())


def _revision(jar: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", re.sub(r"^.*?-(?=\d)", "", os.path.basename(jar))))


def _artifact(jar_name: str) -> str:
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar_name)


def _hadoop_version() -> str:
    [client] = glob.glob(str(spark_home() / "jars" / "hadoop-client-api-*.jar"))
    return re.sub(r"^hadoop-client-api-|\.jar$", "", os.path.basename(client))
