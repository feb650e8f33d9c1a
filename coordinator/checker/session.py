"""The one Spark session factory: ``conf/spark-defaults.conf`` plus the cached Delta and S3A jars.

``make setup`` calls :func:`install_delta_jars` once, which downloads the jars of Delta and Hadoop's
S3A connector (:func:`spark_packages`) that ``conf/spark-jars.lock`` pins from Maven Central into
``.cache/jars`` and writes ``.cache/spark-conf/spark-defaults.conf`` (the
jars and the driver's launch settings) for ``spark-submit``: pass it as
``--properties-file``, or point ``SPARK_CONF_DIR`` at its folder. Nothing is written
into the installed pyspark. Every later start reads only local files.

Example::

    from coordinator.checker.session import get_spark
    spark = get_spark("my-notebook")
    spark.read.format("delta").load("lakehouse/topics/ORDER_TOPIC").show()
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional

from coordinator.exceptions import SparkSetupError

if TYPE_CHECKING:
    from coordinator.lakehouse import Lakehouse

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SPARK_CONF_FILE = Path(os.environ.get("TXCOORD_SPARK_CONF", PROJECT_ROOT / "conf" / "spark-defaults.conf"))
CACHE_DIR = Path(os.environ.get("TXCOORD_CACHE_DIR", PROJECT_ROOT / ".cache"))
JARS_DIR = CACHE_DIR / "jars"
#: What ``spark-submit`` needs to find the cached jars: ``--properties-file`` this file, or
#: ``SPARK_CONF_DIR`` its folder (as :func:`spark_job_environment` does).
SPARK_SUBMIT_PROPERTIES = CACHE_DIR / "spark-conf" / "spark-defaults.conf"
#: The jars `make setup` caches (Delta, S3A and what they pull in that Spark lacks), each pinned to
#: a version and a SHA-256: :func:`lock_jars` writes it, :func:`install_delta_jars` downloads it.
JARS_LOCK = PROJECT_ROOT / "conf" / "spark-jars.lock"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"

# Settings that only take effect when the JVM is launched; under spark-submit the
# launcher has already applied them.
_LAUNCH_SETTINGS = {"spark.master", "spark.jars", "spark.driver.memory", "spark.driver.extraJavaOptions"}


def delta_package() -> str:
    """Maven coordinates of the Delta build matching the installed pyspark and delta-spark.

    Example::

        delta_package()  # 'io.delta:delta-spark_4.2_2.13:4.4.0'
    """
    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_minor}_2.13:{importlib.metadata.version('delta-spark')}"


#: The AWS SDK v2 that hadoop-aws 3.5.0 (pyspark 4.2's Hadoop) is built against. hadoop-aws declares
#: the SDK's 680 MB ``bundle``; S3A needs only these of its modules (about 50 MB with their dependencies).
AWS_SDK_VERSION = "2.35.4"
_S3A_SDK_MODULES = ("s3", "s3-transfer-manager", "sts")
_EXCLUDED_PACKAGES = "software.amazon.awssdk:bundle"


def spark_packages() -> list[str]:
    """Maven coordinates of the jars the project adds to Spark: Delta, and the S3A connector of
    pyspark's Hadoop with the parts of the AWS SDK it uses.

    Example::

        spark_packages()[:2]  # ['io.delta:delta-spark_4.2_2.13:4.4.0', 'org.apache.hadoop:hadoop-aws:3.5.0']
    """
    return [delta_package(), f"org.apache.hadoop:hadoop-aws:{_hadoop_version()}",
            *(f"software.amazon.awssdk:{module}:{AWS_SDK_VERSION}" for module in _S3A_SDK_MODULES)]


def object_store_conf(storage: Mapping[str, str]) -> dict[str, str]:
    """Spark settings that reach a lakehouse on S3 (``s3://`` or ``s3a://``) through S3A, from the
    ``[storage]`` settings, with the ``AWS_*`` environment variables filling in.

    Example::

        object_store_conf({"aws_endpoint": "http://127.0.0.1:9000", "aws_allow_http": "true"})
        # {'spark.hadoop.fs.s3.impl': 'org.apache.hadoop.fs.s3a.S3AFileSystem', ...}
    """
    def setting(key: str, variable: str) -> Optional[str]:
        return storage.get(key) or os.environ.get(variable)

    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",  # the TOML's s3:// locations
            # Uploads buffered in memory (checkpoint files are small): S3A's disk buffers need Hadoop's
            # checksumming local filesystem, which conf/spark-defaults.conf replaces with the raw one.
            "spark.hadoop.fs.s3a.fast.upload.buffer": "bytebuffer"}
    endpoint = setting("aws_endpoint", "AWS_ENDPOINT_URL") or storage.get("aws_endpoint_url")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
    if str(setting("aws_allow_http", "AWS_ALLOW_HTTP") or "").lower() in ("1", "true", "yes", "on"):
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
    region = setting("aws_region", "AWS_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    access_key, secret_key = (setting("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
                              setting("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"))
    if access_key and secret_key:
        conf["spark.hadoop.fs.s3a.access.key"] = access_key
        conf["spark.hadoop.fs.s3a.secret.key"] = secret_key
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return conf


def read_spark_defaults(path: Path = SPARK_CONF_FILE) -> dict[str, str]:
    """Parse a ``spark-defaults.conf`` file: ``key value`` per line, ``#`` comments.

    Example::

        read_spark_defaults()["spark.sql.session.timeZone"]  # 'UTC'
    """
    settings: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        settings[key] = value.strip()
    return settings


def cached_jars() -> list[str]:
    """The cached Delta and S3A jars; raises :class:`SparkSetupError` if ``make setup`` has not run."""
    marker = JARS_DIR / ".package"
    if not marker.exists() or marker.read_text().strip() != ",".join(spark_packages()):
        raise SparkSetupError(
            f"the jars for {', '.join(spark_packages())} are not in {JARS_DIR}: run `make setup` "
            "(or `python -m coordinator.checker.session`) once with network access"
        )
    return sorted(glob.glob(str(JARS_DIR / "*.jar")))


def launch_jars(settings: Mapping[str, str]) -> list[str]:
    """The cached Delta jars, then any jar ``settings`` list in ``spark.jars`` (a filesystem
    connector, for one).

    Example::

        launch_jars({"spark.jars": "/opt/jars/hadoop-aws.jar"})[-1]  # '/opt/jars/hadoop-aws.jar'
    """
    configured = [jar.strip() for jar in settings.get("spark.jars", "").split(",") if jar.strip()]
    return cached_jars() + configured


def get_spark(app_name: str = "txcoord", conf: Optional[Mapping[str, str]] = None):
    """The Spark session, created on first call with Delta enabled.

    Settings come from ``conf/spark-defaults.conf``, then ``conf`` (which wins).
    Under ``spark-submit`` the launcher's master and jars are kept.

    Example::

        spark = get_spark("checker", {"spark.sql.shuffle.partitions": "8"})
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkSetupError("pyspark is not installed: the checker needs `pip install 'txcoord[spark]'` "
                              "(`make setup` installs everything)") from None

    # The checker's commit-log source runs in a Python worker: this interpreter, with this package.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = read_spark_defaults()
    settings.update(conf or {})
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if under_spark_submit:
        settings = {k: v for k, v in settings.items() if k not in _LAUNCH_SETTINGS}
    else:
        settings["spark.jars"] = ",".join(launch_jars(settings))
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _require_delta(spark)
    return spark


def lakehouse_spark(app_name: str, lakehouse: "Lakehouse", conf: Optional[Mapping[str, str]] = None):
    """:func:`get_spark`, with what reaches ``lakehouse``: S3A's settings (:func:`object_store_conf`)
    when it is on object storage.

    Example::

        spark = lakehouse_spark("analysis", Lakehouse.of(CoordinatorConfig.load("conf/coordinator.toml")))
        spark.read.format("delta").load(lakehouse.topic("ORDER_TOPIC")).show()
    """
    settings = {} if lakehouse.is_local else object_store_conf(lakehouse.storage)
    settings.update(conf or {})
    return get_spark(app_name, settings)


def _require_delta(spark) -> None:
    from py4j.java_gateway import JavaClass

    # py4j answers a class it cannot load with a package placeholder, not an error.
    if not isinstance(spark.sparkContext._jvm.io.delta.tables.DeltaTable, JavaClass):
        raise SparkSetupError(
            f"Spark started without the Delta jars: run spark-submit with --properties-file {SPARK_SUBMIT_PROPERTIES} "
            f"(written by `make setup`), or with --packages {delta_package()}"
        )


def spark_submit(script: str | os.PathLike, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``script`` with this virtualenv's ``spark-submit``.

    ``spark-submit`` finds Spark and the driver's Python through ``PATH``; both must be
    this virtualenv's, or the job cannot import ``coordinator``.

    Example::

        argv, env = spark_submit("jobs/checker.py", "--config", "conf/coordinator.toml")
        subprocess.Popen(argv, env=env)
    """
    return [str(Path(sys.executable).parent / "spark-submit"), str(script), *args], spark_job_environment()


def spark_job_environment() -> dict[str, str]:
    """This environment, with this virtualenv first on ``PATH`` and as pyspark's Python, and
    ``SPARK_CONF_DIR`` at the cached jars' settings.

    ``spark-submit`` otherwise runs whatever ``python3`` is first on ``PATH``, which
    need not have the project installed.
    """
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""), PYSPARK_PYTHON=sys.executable,
                PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_CONF_DIR=str(SPARK_SUBMIT_PROPERTIES.parent))


def install_delta_jars() -> list[str]:
    """Download the jars :data:`JARS_LOCK` pins into the cache, once; return their paths.

    Each jar is fetched from Maven Central at the version the lock names and checked
    against its SHA-256, all at once. The jar list is also written to
    :data:`SPARK_SUBMIT_PROPERTIES`, for ``spark-submit``.
    """
    packages = spark_packages()
    marker = JARS_DIR / ".package"
    if not (marker.exists() and marker.read_text().strip() == ",".join(packages)):
        _download(_read_lock(packages))
        marker.write_text(",".join(packages) + "\n")
    jars = cached_jars()
    _write_spark_submit_properties()
    return jars


def lock_jars() -> Path:
    """Resolve :func:`spark_packages` with Spark's Ivy and pin the result in :data:`JARS_LOCK`.

    Run it after changing pyspark, delta-spark or the SDK version (``python -m
    coordinator.checker.session --lock``). Jars Spark already ships (Hadoop, Parquet,
    Jackson…) are left out so only one version of each class is on the classpath.
    """
    packages = spark_packages()
    # Delta and S3A resolved at once, each in its own Ivy cache: resolution mostly waits on Maven Central.
    jars = _resolve_with_ivy({"delta": packages[:1], "s3a": packages[1:]})
    lines = [f"# packages {','.join(packages)}\n",
             "# Written by `python -m coordinator.checker.session --lock`: the jars `make setup` downloads.\n"]
    for jar in sorted(jars):
        # Ivy names retrieved jars "<organisation>_<artifact>-<revision>.jar".
        group, file_name = os.path.basename(jar).split("_", 1)
        artifact = _artifact(file_name)
        version = file_name[len(artifact) + 1:-len(".jar")]
        lines.append(f"{group}:{artifact}:{version} {hashlib.sha256(Path(jar).read_bytes()).hexdigest()}\n")
    JARS_LOCK.write_text("".join(lines))
    (JARS_DIR / ".package").unlink(missing_ok=True)  # the cache now downloads what the new lock pins
    return JARS_LOCK


def _read_lock(packages: list[str]) -> dict[str, str]:
    """Coordinates -> SHA-256 of every jar the lock pins for ``packages``."""
    locked_packages, pinned = None, {}
    for line in JARS_LOCK.read_text().splitlines():
        if line.startswith("# packages "):
            locked_packages = line.removeprefix("# packages ").split(",")
        elif line.strip() and not line.startswith("#"):
            coordinates, digest = line.split()
            pinned[coordinates] = digest
    if locked_packages != packages:
        raise SparkSetupError(
            f"{JARS_LOCK} pins the jars of {', '.join(locked_packages or ['nothing'])}, but this pyspark and "
            f"delta-spark need {', '.join(packages)}: run `python -m coordinator.checker.session --lock` "
            "(with network access) and commit the new lock"
        )
    return pinned


def _download(pinned: Mapping[str, str]) -> None:
    staging = JARS_DIR.with_name("jars.download")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    def fetch(coordinates: str) -> None:
        group, artifact, version = coordinates.split(":")
        url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
        except OSError as error:
            raise SparkSetupError(f"could not download {url}: {error}") from error
        if hashlib.sha256(data).hexdigest() != pinned[coordinates]:
            raise SparkSetupError(f"{url} does not match the SHA-256 {JARS_LOCK.name} pins for it")
        (staging / f"{group}_{artifact}-{version}.jar").write_bytes(data)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(fetch, pinned))
    shutil.rmtree(JARS_DIR, ignore_errors=True)
    staging.rename(JARS_DIR)


def _resolve_with_ivy(groups: dict[str, list[str]]) -> list[str]:
    """Resolve each group of packages with Spark's Ivy, all at once; the jars Spark lacks, one version each."""
    resolutions = {}
    for name, packages in groups.items():
        probe = (
            "from pyspark.sql import SparkSession\n"
            f"SparkSession.builder.master('local[1]').config('spark.jars.packages', {','.join(packages)!r})"
            f".config('spark.jars.excludes', {_EXCLUDED_PACKAGES!r})"
            f".config('spark.jars.ivy', {str(CACHE_DIR / 'ivy' / name)!r}).config('spark.ui.enabled', 'false')"
            ".getOrCreate().stop()\n"
        )
        resolutions[name] = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True)
    for name, resolution in resolutions.items():
        _, errors = resolution.communicate()
        if resolution.returncode != 0:
            raise SparkSetupError(f"could not resolve {', '.join(groups[name])} from Maven Central:\n{errors[-4000:]}")
    spark_jars = {_artifact(name) for name in os.listdir(_spark_home() / "jars")}
    newest: dict[str, str] = {}  # artifact -> its newest jar among the groups (one version on the classpath)
    for name in groups:
        for jar in glob.glob(str(CACHE_DIR / "ivy" / name / "jars" / "*.jar")):
            artifact = _artifact(os.path.basename(jar).split("_", 1)[1])
            if artifact not in spark_jars and (artifact not in newest or _revision(jar) > _revision(newest[artifact])):
                newest[artifact] = jar
    return list(newest.values())


def _revision(jar: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", re.sub(r"^.*?-(?=\d)", "", os.path.basename(jar))))


def _artifact(jar_name: str) -> str:
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar_name)


def _hadoop_version() -> str:
    [client] = glob.glob(str(_spark_home() / "jars" / "hadoop-client-api-*.jar"))
    return re.sub(r"^hadoop-client-api-|\.jar$", "", os.path.basename(client))


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _write_spark_submit_properties() -> None:
    # Launch settings apply only when the JVM starts: spark-submit reads them from this file.
    settings = read_spark_defaults()
    launch = {k: v for k, v in settings.items() if k in _LAUNCH_SETTINGS and k not in ("spark.master", "spark.jars")}
    SPARK_SUBMIT_PROPERTIES.parent.mkdir(parents=True, exist_ok=True)
    SPARK_SUBMIT_PROPERTIES.write_text(
        "# Written by `make setup` (python -m coordinator.checker.session): the Delta jars cached for this\n"
        "# project, and the driver's launch settings from conf/spark-defaults.conf. For spark-submit:\n"
        f"#   spark-submit --properties-file {SPARK_SUBMIT_PROPERTIES} jobs/checker.py ...\n"
        f"spark.jars {','.join(launch_jars(settings))}\n" + "".join(f"{k} {v}\n" for k, v in sorted(launch.items()))
    )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Cache the jars conf/spark-jars.lock pins (what `make setup` runs).")
    parser.add_argument("--lock", action="store_true", help="first resolve the jars anew with Ivy and rewrite the lock")
    if parser.parse_args().lock:
        print(lock_jars())
    for jar in install_delta_jars():
        print(jar)
