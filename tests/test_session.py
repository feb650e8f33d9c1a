"""Spark's setup from an installed package: which jars a session launches with, where they are
cached and fetched from, and what ``spark-submit`` is given."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.exceptions import InvalidArgumentError, SparkSetupError
from coordinator.spark import jars, own_classes, python_worker, session, submit


def test_jars_listed_in_the_spark_defaults_come_after_the_cached_delta_jars():
    own = own_classes.own_jar()
    cached = jars.cached_jars() + ([str(own)] if own else [])  # txcoord's own classes, compiled by a JDK
    assert any("delta-spark" in jar for jar in cached)
    assert session.launch_jars({}) == cached
    assert session.launch_jars({"spark.jars": " /opt/a.jar, /opt/b.jar ,"}) == cached + ["/opt/a.jar", "/opt/b.jar"]


def test_the_settings_and_the_lock_ship_inside_the_package():
    package = Path(jars.__file__).parent
    assert session.spark_defaults_file() == package / "spark-defaults.conf"
    assert jars.JARS_LOCK == package / "spark-jars.lock"
    assert session.read_spark_defaults()["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_the_jar_cache_is_the_users_unless_overridden(monkeypatch, tmp_path):
    monkeypatch.delenv(jars.CACHE_DIR_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jars.cache_dir() == tmp_path / "xdg" / "txcoord"
    monkeypatch.setenv(jars.CACHE_DIR_VARIABLE, str(tmp_path / "mine"))
    assert jars.jars_dir().parent.parent == tmp_path / "mine" / "spark"


def test_an_azure_location_is_given_to_hadoop_as_abfs_names_it(monkeypatch):
    """ABFS takes the account from the URL and TLS from the scheme: ``az://`` gets the account from ``[storage]``,
    and an emulator's plain-HTTP endpoint (obstore and delta-rs speak HTTP there) makes ``abfss`` ``abfs``."""
    for variable in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ENDPOINT"):
        monkeypatch.delenv(variable, raising=False)
    real = "abfss://lh@acct.dfs.core.windows.net/p/system/_checkpoints/checker"
    assert session.hadoop_location(real, {}) == real
    assert session.hadoop_location("az://lh/p/x", {"azure_storage_account_name": "acct"}) == "abfss://lh@acct.dfs.core.windows.net/p/x"
    emulator = {"azure_storage_endpoint": "http://127.0.0.1:10000/devstoreaccount1", "azure_storage_account_key": "k"}
    assert session.hadoop_location(real, emulator) == real.replace("abfss://", "abfs://")
    assert session.hadoop_location("s3://bucket/p", emulator) == "s3://bucket/p"
    with pytest.raises(InvalidArgumentError, match="azure_storage_account_name"):
        session.hadoop_location("az://lh/p", {})
    conf = session.object_store_conf(emulator)
    assert (conf["spark.hadoop.fs.azure.account.key"], conf["spark.hadoop.fs.azure.abfs.endpoint"]) == ("k", "127.0.0.1:10000")
    assert conf["spark.hadoop.fs.azure.fns.account.service.type"] == "BLOB"
    assert not any("fs.azure.account" in key for key in session.object_store_conf({"azure_storage_account_name": "acct"}))


def test_spark_submit_gets_the_jars_and_the_launch_settings_in_a_file_beside_the_cache():
    properties = submit.submit_properties()

    written = session.read_spark_defaults(properties)
    defaults = session.read_spark_defaults()
    assert properties.parent.parent == jars.jars_dir().parent
    assert written["spark.jars"].split(",") == session.launch_jars(defaults)
    assert written["spark.driver.memory"] == defaults["spark.driver.memory"]
    assert "spark.master" not in written  # spark-submit's --master decides
    conf_dir = Path(submit.spark_job_environment()["SPARK_CONF_DIR"])
    assert conf_dir.is_dir() and not any(conf_dir.iterdir())  # the settings come from the properties file


def test_each_job_is_a_file_of_the_package_that_spark_submit_runs():
    argv, env = submit.spark_submit("checker", "--config", "c.toml", conf={"spark.driver.memory": "1g"})
    assert argv[0] == str(Path(sys.executable).parent / "spark-submit")
    assert argv[1:5] == ["--properties-file", str(submit.submit_properties()), "--conf", "spark.driver.memory=1g"]
    assert argv[5] == str(Path(submit.__file__).parent.parent / "jobs" / "checker.py")
    assert argv[6:] == ["--config", "c.toml"]
    assert env["PYSPARK_PYTHON"] == python_worker.python_worker()
    assert env["PYSPARK_DRIVER_PYTHON"] == sys.executable


def test_sparks_python_workers_import_pyspark_compiled_from_its_package_not_from_sparks_zip():
    """Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on a worker's path and gives the worker 10 s to
    connect back; from the zip every start compiles pyspark again. The worker's Python drops that zip alone."""
    import pyspark

    package = Path(pyspark.__file__).parent
    own_zip = package / "python" / "lib" / "pyspark.zip"
    assert own_zip.is_file()
    path = os.pathsep.join([str(own_zip), "/elsewhere/first", str(package / "python" / "lib" / "py4j-x.zip"), "/a b"])
    shown = subprocess.run(
        [python_worker.python_worker(), "-c", "import json, sys, pyspark; print(json.dumps([sys.executable, pyspark.__file__, sys.path]))"],
        env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, check=True)
    executable, imported, sys_path = json.loads(shown.stdout)
    assert executable == sys.executable
    assert imported == pyspark.__file__
    assert str(own_zip) not in sys_path
    assert sys_path[1:4] == ["/elsewhere/first", str(package / "python" / "lib" / "py4j-x.zip"), "/a b"]
    # A process Spark started (the checker's driver) imported pyspark from the zip: it names the same worker.
    from_zip = subprocess.run(
        [sys.executable, "-c", "import pyspark; from coordinator.spark.python_worker import python_worker; "
                               "print(pyspark.__file__); print(python_worker())"],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(own_zip), os.getcwd()])), capture_output=True, text=True, check=True)
    assert from_zip.stdout.split() == [str(own_zip / "pyspark" / "__init__.py"), python_worker.python_worker()]


def test_the_lock_pins_every_cached_jar_for_these_pyspark_and_delta_versions():
    pinned = jars._read_lock(jars.spark_packages())

    cached = {jar.rsplit("/", 1)[1] for jar in jars.cached_jars()}
    assert cached == {f"{group}_{artifact}-{version}.jar" for group, artifact, version in map(
        lambda coordinates: coordinates.split(":"), pinned)}


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A Maven repository on disk holding one jar, a lock pinning it, and an empty jar cache."""
    jar = tmp_path / "repo" / "org" / "example" / "lib" / "1.0" / "lib-1.0.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"PK jar bytes")
    monkeypatch.setenv(jars.MAVEN_REPOSITORY_VARIABLE, (tmp_path / "repo").as_uri())
    monkeypatch.setenv(jars.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setattr(jars, "JARS_LOCK", tmp_path / "spark-jars.lock")
    monkeypatch.setattr(jars, "spark_packages", lambda: ["org.example:lib:1.0"])

    def lock(packages: str, digest: str) -> None:
        jars.JARS_LOCK.write_text(f"# packages {packages}\norg.example:lib:1.0 {digest}\n")

    return lock, hashlib.sha256(jar.read_bytes()).hexdigest()


def test_the_first_need_downloads_what_the_lock_pins_with_a_progress_display_then_works_offline(repository, capfd,
                                                                                                  monkeypatch):
    lock, digest = repository
    lock("org.example:lib:1.0", digest)

    assert jars.cached_jars() == [str(jars.jars_dir() / "org.example_lib-1.0.jar")]
    said = capfd.readouterr().err
    assert "caching the 1 jars" in said and "cached 1 jars" in said
    monkeypatch.setenv(jars.MAVEN_REPOSITORY_VARIABLE, "http://127.0.0.1:9/unreachable")
    assert jars.cached_jars() == [str(jars.jars_dir() / "org.example_lib-1.0.jar")]
    assert capfd.readouterr().err == ""  # nothing fetched, nothing said


def test_an_unreachable_repository_is_named_and_nothing_is_cached(repository, monkeypatch):
    lock, digest = repository
    lock("org.example:lib:1.0", digest)
    monkeypatch.setenv(jars.MAVEN_REPOSITORY_VARIABLE, "http://127.0.0.1:9/unreachable")

    with pytest.raises(SparkSetupError, match=r"could not download http://127\.0\.0\.1:9/unreachable/org/example"):
        jars.cached_jars()
    assert not jars.jars_dir().exists()


def test_a_jar_that_does_not_match_its_pinned_digest_is_refused_and_nothing_is_cached(repository):
    lock, digest = repository
    lock("org.example:lib:1.0", "0" * 64)

    with pytest.raises(SparkSetupError, match="does not match the SHA-256"):
        jars.cached_jars()
    assert not jars.jars_dir().exists()


def test_a_lock_for_another_pyspark_and_delta_pair_says_what_to_install(repository):
    lock, digest = repository
    lock("org.example:lib:0.9", digest)

    with pytest.raises(SparkSetupError, match=r"runs Spark with org\.example:lib:0\.9.*pip install 'txcoord\[spark\]'"):
        jars.cached_jars()


def test_a_newer_delta_patch_release_drives_the_locked_jars_but_another_spark_or_minor_does_not():
    locked = "io.delta:delta-spark_4.2_2.13:4.4.0"
    assert jars._release_line(locked) == jars._release_line("io.delta:delta-spark_4.2_2.13:4.4.1")
    assert jars._release_line(locked) != jars._release_line("io.delta:delta-spark_4.2_2.13:4.5.0")
    assert jars._release_line(locked) != jars._release_line("io.delta:delta-spark_4.1_2.13:4.4.0")
    assert jars._release_line("org.apache.hadoop:hadoop-aws:3.5.0") != jars._release_line("org.apache.hadoop:hadoop-aws:3.5.1")


def test_a_spark_that_already_has_delta_is_used_as_it_is_with_nothing_downloaded(tmp_path):
    """A cluster's own Spark installation with Delta in its jars/ folder: no cache, no download, Delta works."""
    import pyspark

    home = tmp_path / "spark-home"
    home.mkdir()
    shipped = Path(pyspark.__file__).parent
    for entry in shipped.iterdir():
        if entry.name != "jars":
            (home / entry.name).symlink_to(entry)
    (home / "jars").mkdir()
    for jar in (shipped / "jars").iterdir():
        (home / "jars" / jar.name).symlink_to(jar)
    for jar in map(Path, jars.cached_jars()):  # named as Maven names them: artifact-version.jar
        (home / "jars" / jar.name.split("_", 1)[1]).symlink_to(jar)
    cache = tmp_path / "empty-cache"
    probe = ("from coordinator.spark import get_spark, submit_properties\n"
             "assert submit_properties() is None\n"
             "spark = get_spark('cluster-delta')\n"
             f"spark.range(3).write.format('delta').save({str(tmp_path / 't')!r})\n"
             f"print(spark.read.format('delta').load({str(tmp_path / 't')!r}).count())\n")
    environment = dict(os.environ, SPARK_HOME=str(home), TXCOORD_CACHE_DIR=str(cache),
                       TXCOORD_MAVEN_REPOSITORY="http://127.0.0.1:9/unreachable")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=environment, timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "3"
    assert not cache.exists()
