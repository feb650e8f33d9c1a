"""txcoord's own Java class for Spark (:mod:`coordinator.spark.own_classes`): compiled once into the cache
with the JDK at hand, and sessions launched without it, saying why, when there is none."""

from __future__ import annotations

import logging
import shutil
import zipfile

import pytest

from coordinator.spark import own_classes
from coordinator.spark.session import launch_jars


@pytest.fixture(autouse=True)
def warnings_anew():
    own_classes._warn_once.cache_clear()


@pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK's javac (sudo apt-get install default-jdk-headless)")
def test_the_classes_are_compiled_once_into_the_cache_and_launched_with(own_cache, monkeypatch):
    jar = own_classes.own_jar()

    with zipfile.ZipFile(jar) as archive:
        assert "io/txcoord/spark/ConditionalPutCheckpointFileManager.class" in archive.namelist()
    compiled = jar.stat().st_mtime_ns
    monkeypatch.setenv("PATH", "")  # the next need finds the jar: no compiler wanted
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert own_classes.own_jar() == jar and jar.stat().st_mtime_ns == compiled
    assert str(jar) in launch_jars({})


def test_without_a_jdk_sessions_launch_without_them_and_say_so_once(own_cache, monkeypatch, caplog):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("JAVA_HOME", raising=False)

    with caplog.at_level(logging.WARNING, logger=own_classes.__name__):
        assert own_classes.own_jar() is None
        assert own_classes.own_jar() is None
    assert [record.getMessage().split(":")[0] for record in caplog.records] == ["no JDK (javac) found"]
    assert not any("txcoord-" in jar for jar in launch_jars({}))


def test_the_checkpoint_manager_refuses_a_filesystem_without_conditional_creates(spark, tmp_path):
    """It never writes a batch's checkpoint file unconditionally: a disk refuses the create outright."""
    from pyspark.errors import IllegalArgumentException

    jvm = spark.sparkContext._jvm
    manager = jvm.io.txcoord.spark.ConditionalPutCheckpointFileManager(
        jvm.org.apache.hadoop.fs.Path(tmp_path.as_uri()), spark.sparkContext._jsc.hadoopConfiguration())

    with pytest.raises(IllegalArgumentException, match="fs.option.create.conditional.overwrite"):
        manager.createAtomic(jvm.org.apache.hadoop.fs.Path((tmp_path / "offsets" / "0").as_uri()), False)
    assert not (tmp_path / "offsets" / "0").exists()
