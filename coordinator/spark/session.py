"""The one Spark session factory: the settings this package ships (``spark-defaults.conf``) plus
the Delta, S3A and ABFS jars (:mod:`coordinator.spark.jars`).

Example::

    from coordinator.spark import get_spark
    spark = get_spark("my-notebook")
    spark.read.format("delta").load("lakehouse/topics/ORDER_TOPIC").show()
"""

from __future__ import annotations

import functools
import importlib.resources
import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional
from urllib.parse import urlparse

from coordinator.exceptions import InvalidArgumentError, SparkSetupError
from coordinator.spark.class_archive import archive_java_options, can_share_classes, driver_java_options, empty_conf_dir
from coordinator.spark.jars import cached_jars, delta_package, provided_delta, pyspark
from coordinator.spark.python_worker import python_worker
from coordinator.spark.own_classes import CONDITIONAL_PUT_CHECKPOINT_MANAGER, own_jar
from coordinator.storage import AZURE_SCHEMES, S3_SCHEMES

if TYPE_CHECKING:
    from coordinator.lakehouse import Lakehouse

__all__ = ["abfs_conf", "get_spark", "hadoop_location", "lakehouse_spark", "launch_jars", "object_store_conf", "read_spark_defaults",
           "spark_defaults_file", "write_streaming_checkpoints_in_place"]

#: The Spark setting that names the class writing streaming checkpoints, and the ones that write them in place
#: on S3 (:func:`write_streaming_checkpoints_in_place`), the first that loads: txcoord's own, one conditional PUT a
#: file, then Spark's, which checks for the file and its parent before its upload.
CHECKPOINT_MANAGER_SETTING = "spark.sql.streaming.checkpointFileManagerClass"
IN_PLACE_CHECKPOINT_MANAGERS = (CONDITIONAL_PUT_CHECKPOINT_MANAGER,
                                "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager")

#: Settings that only take effect when the JVM is launched; under spark-submit the launcher has
#: already applied them.
LAUNCH_SETTINGS = {"spark.master", "spark.jars", "spark.driver.memory", "spark.driver.extraJavaOptions"}


def spark_defaults_file() -> Path:
    """The Spark settings of every session txcoord starts: ``TXCOORD_SPARK_CONF``, else the file this
    package ships."""
    shipped = importlib.resources.files("coordinator.spark") / "spark-defaults.conf"
    return Path(os.environ.get("TXCOORD_SPARK_CONF") or str(shipped))


def object_store_conf(storage: Mapping[str, str]) -> dict[str, str]:
    """Spark settings that reach a lakehouse on S3 (``s3://`` or ``s3a://``) through S3A, and on Azure
    through ABFS (:func:`abfs_conf`), from the ``[storage]`` settings, with the ``AWS_*`` and ``AZURE_*``
    environment variables filling in.

    Example::

        object_store_conf({"aws_endpoint": "http://127.0.0.1:9000", "aws_allow_http": "true"})
        # {'spark.hadoop.fs.s3.impl': 'org.apache.hadoop.fs.s3a.S3AFileSystem', ...}
    """
    def setting(key: str, variable: str) -> Optional[str]:
        return storage.get(key) or os.environ.get(variable)

    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",  # the TOML's s3:// locations
            "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",  # and through FileContext
            # Uploads buffered in memory (checkpoint files are small): S3A's disk buffers need Hadoop's
            # checksumming local filesystem, which spark-defaults.conf replaces with the raw one.
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
    conf.update(abfs_conf(storage))
    return conf


def abfs_conf(storage: Mapping[str, str]) -> dict[str, str]:
    """Spark settings that reach an Azure lakehouse through Hadoop's ABFS connector, from ``[storage]``
    (``AZURE_*`` variables filling in): the account key, and for an emulator's endpoint
    (``azure_storage_endpoint`` naming the account in its path, as Azurite's does) its address and the
    Blob API, which ABFS 3.5 speaks to accounts without a hierarchical namespace.

    Example::

        abfs_conf({"azure_storage_account_key": "…", "azure_storage_endpoint": "http://127.0.0.1:10000/devstoreaccount1"})
        # {'spark.hadoop.fs.azure.account.key': '…', 'spark.hadoop.fs.azure.abfs.endpoint': '127.0.0.1:10000', ...}
    """
    # ABFS 3.5 collects metrics for the account by default, each filesystem instance with a scheduler thread that
    # is not a daemon and outlives the instance: the checker's JVM, done, would never exit.
    conf = {"spark.hadoop.fs.azure.metrics.collection.enabled": "false"}
    key = storage.get("azure_storage_account_key") or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
    if key:
        # Unqualified, ABFS takes it for any account: the lakehouse's URL names the account.
        conf["spark.hadoop.fs.azure.account.key"] = key
    endpoint = _azure_emulator(storage)
    if endpoint is not None:
        conf.update({"spark.hadoop.fs.azure.abfs.endpoint": f"{endpoint.hostname}:{endpoint.port or (80 if endpoint.scheme == 'http' else 443)}",
                     # No DFS endpoint on an emulator: ABFS must not probe it for a namespace, and goes by Blob.
                     "spark.hadoop.fs.azure.account.hns.enabled": "false",
                     "spark.hadoop.fs.azure.fns.account.service.type": "BLOB"})
        if endpoint.scheme == "http":
            # ABFS's default client, Apache HttpClient's, will not start without TLS; the JDK's will.
            conf.update({"spark.hadoop.fs.azure.always.use.https": "false",
                         "spark.hadoop.fs.azure.networking.library": "JDK_HTTP_URL_CONNECTION"})
    return conf


def hadoop_location(location: str, storage: Mapping[str, str]) -> str:
    """``location`` as Hadoop's connectors name it: an Azure location as ABFS takes it
    (``abfss://container@account.dfs.core.windows.net/prefix``, from ``az://container/prefix`` with the
    account in ``[storage]``; ``abfs://`` where ``azure_storage_endpoint`` is plain HTTP, an emulator's,
    as obstore and delta-rs speak it there); any other location as it is.

    Example::

        hadoop_location("az://lakehouse/lh/system", {"azure_storage_account_name": "acct"})
        # 'abfss://lakehouse@acct.dfs.core.windows.net/lh/system'
    """
    parsed = urlparse(location)
    if parsed.scheme not in AZURE_SCHEMES:
        return location
    authority = parsed.netloc
    if "@" not in authority:
        account = storage.get("azure_storage_account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        if not account:
            raise InvalidArgumentError(f"{location}: Spark reaches Azure through ABFS, which needs the account: "
                                       "name it in the location (abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX) "
                                       "or as [storage]'s azure_storage_account_name")
        authority = f"{authority}@{account}.dfs.core.windows.net"
    endpoint = _azure_emulator(storage)
    scheme = "abfs" if endpoint is not None and endpoint.scheme == "http" else "abfss"
    return f"{scheme}://{authority}{parsed.path}"


def _azure_emulator(storage: Mapping[str, str]):
    """``azure_storage_endpoint`` parsed, if it names the account in its path (an emulator's); else None."""
    endpoint = storage.get("azure_storage_endpoint") or os.environ.get("AZURE_STORAGE_ENDPOINT")
    parsed = urlparse(endpoint) if endpoint else None
    return parsed if parsed is not None and parsed.path.strip("/") else None


def read_spark_defaults(path: Optional[Path] = None) -> dict[str, str]:
    """Parse a ``spark-defaults.conf`` file (default: :func:`spark_defaults_file`): ``key value`` per
    line, ``#`` comments.

    Example::

        read_spark_defaults()["spark.sql.session.timeZone"]  # 'UTC'
    """
    settings: dict[str, str] = {}
    for line in (path or spark_defaults_file()).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        settings[key] = value.strip()
    return settings


def launch_jars(settings: Mapping[str, str]) -> list[str]:
    """The jars a session launches with: txcoord's cached Delta and S3A jars and its own classes (when a
    JDK compiled them: :func:`~coordinator.spark.own_classes.own_jar`), none of them when the Spark in use
    already has Delta (:func:`~coordinator.spark.jars.provided_delta`), then any jar ``settings`` list in
    ``spark.jars`` (a filesystem connector, for one).

    Example::

        launch_jars({"spark.jars": "/opt/jars/hadoop-aws.jar"})[-1]  # '/opt/jars/hadoop-aws.jar'
    """
    configured = [jar.strip() for jar in settings.get("spark.jars", "").split(",") if jar.strip()]
    if provided_delta(settings):
        return configured
    own = own_jar()
    return cached_jars() + ([str(own)] if own else []) + configured


def get_spark(app_name: str = "txcoord", conf: Optional[Mapping[str, str]] = None):
    """The Spark session, created on first call with Delta enabled.

    Settings come from :func:`spark_defaults_file`, then ``conf`` (which wins). Under
    ``spark-submit`` the launcher's master and jars are kept. The first session on a machine
    downloads the jars it needs (:mod:`coordinator.spark.jars`), unless Spark already has Delta.
    A JVM this call starts maps the driver's class archive once ``txcoord spark-setup`` has written
    it (:mod:`coordinator.spark.class_archive`), unless ``SPARK_CONF_DIR`` names a folder of its own.

    Example::

        spark = get_spark("checker", {"spark.sql.shuffle.partitions": "8"})
    """
    pyspark()
    from pyspark.sql import SparkSession

    # The checker's commit-log source runs in a Python worker: this interpreter, with this package.
    os.environ.setdefault("PYSPARK_PYTHON", python_worker())
    settings = read_spark_defaults()
    settings.update(conf or {})
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if under_spark_submit:
        settings = {k: v for k, v in settings.items() if k not in LAUNCH_SETTINGS}
    else:
        settings["spark.jars"] = ",".join(launch_jars(settings))
        if archive_java_options() and can_share_classes():
            # pyspark's launcher passes this process's environment to the JVM it starts.
            os.environ["SPARK_CONF_DIR"] = str(empty_conf_dir())
            settings["spark.driver.extraJavaOptions"] = driver_java_options(settings)
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _require_delta(spark)
    return spark


def lakehouse_spark(app_name: str, lakehouse: "Lakehouse", conf: Optional[Mapping[str, str]] = None):
    """:func:`get_spark`, with what reaches ``lakehouse``: S3A's and ABFS's settings (:func:`object_store_conf`)
    when it is on object storage.

    Example::

        spark = lakehouse_spark("analysis", Lakehouse.of(CoordinatorConfig.load("conf/coordinator.toml")))
        spark.read.format("delta").load(lakehouse.topic("ORDER_TOPIC")).show()
    """
    settings = {} if lakehouse.is_local else object_store_conf(lakehouse.storage)
    settings.update(conf or {})
    return get_spark(app_name, settings)


def write_streaming_checkpoints_in_place(spark, location: str) -> Optional[str]:
    """Have the streaming queries ``spark`` starts from now on write their checkpoint files in place, when
    ``location`` (a checkpoint's) is on S3 and one of :data:`IN_PLACE_CHECKPOINT_MANAGERS` is on the classpath;
    the manager's class, or None when they will be written the default way.

    Spark's default writes each checkpoint file to a temporary file and renames it: on S3 a copy and a
    delete, many requests one after another for each of a micro-batch's two checkpoint files. An upload makes
    a file appear whole or not at all, so writing in place is as safe, in a fraction of the requests: with
    txcoord's manager Spark's existence check, then one conditional PUT
    (docs/performance-log.md#the-checker-at-500-txns-25-ms-a-request-issue-45-point-3).
    A query with a checkpoint elsewhere (a local directory) must not start while this is set: either manager
    refuses a filesystem other than S3.

    Example::

        write_streaming_checkpoints_in_place(spark, "s3://bucket/lakehouse/system/_checkpoints/checker")
        # 'io.txcoord.spark.ConditionalPutCheckpointFileManager'
    """
    if urlparse(location).scheme not in S3_SCHEMES:
        return None
    for manager in IN_PLACE_CHECKPOINT_MANAGERS:
        if _loads(spark, manager):
            spark.conf.set(CHECKPOINT_MANAGER_SETTING, manager)
            return manager
    return None


def _require_delta(spark) -> None:
    if not _loads(spark, "io.delta.tables.DeltaTable"):
        raise SparkSetupError(
            "Spark started without the Delta jars: run spark-submit with --properties-file "
            "\"$(txcoord spark-setup --properties-file)\", or with --packages " + delta_package()
        )


def _loads(spark, class_name: str) -> bool:
    """Whether ``spark``'s JVM loads class ``class_name``."""
    from py4j.java_gateway import JavaClass

    # py4j answers a class it cannot load with a package placeholder, not an error.
    return isinstance(functools.reduce(getattr, class_name.split("."), spark.sparkContext._jvm), JavaClass)
