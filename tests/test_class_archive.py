"""The driver JVM's class archive: ``txcoord spark-setup`` writes it with a training run of the
checker, and every launch txcoord makes (``spark-submit`` from :func:`spark_submit`, and ``txcoord
checker``'s own JVM) maps it; a JVM that cannot use it starts as before, without a word about it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from coordinator.spark import class_archive, jars, submit
from support import CheckerJob, Job, first_batch_after, wait_until, write_config


def mapped_files(pid: int) -> set[str]:
    """The files process ``pid`` has mapped into its memory."""
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps if len(line.split(maxsplit=5)) == 6}


def jvm_of(job: Job) -> Optional[int]:
    """The driver JVM's pid: the job's own process under spark-submit (its scripts exec java), else its
    child (pyspark's launch of ``txcoord checker``); None before it runs."""
    import psutil

    process = psutil.Process(job.pid)
    return next((p.pid for p in [process, *process.children(recursive=True)] if p.name() == "java"), None)


def test_nothing_maps_an_archive_before_one_is_written(own_cache):
    assert class_archive.archive_java_options() == []
    assert "SharedArchiveFile" not in submit.submit_properties().read_text()


def test_the_archive_is_named_after_the_jdk_it_is_for(own_cache, tmp_path, monkeypatch):
    here = class_archive.class_archive()
    other_jdk = tmp_path / "jdk"
    (other_jdk / "bin").mkdir(parents=True)
    (other_jdk / "bin" / "java").write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(other_jdk))
    assert class_archive.class_archive() != here
    assert class_archive.class_archive().parent == here.parent


def test_a_folder_of_spark_settings_of_its_own_keeps_a_launch_off_the_archive(own_cache, tmp_path):
    assert class_archive.can_share_classes({"SPARK_CONF_DIR": str(class_archive.empty_conf_dir())})
    assert not class_archive.can_share_classes({"SPARK_CONF_DIR": str(tmp_path)})
    assert class_archive.can_share_classes({}) == (not (jars.spark_home() / "conf").is_dir())


def test_a_jvm_that_cannot_use_the_archive_starts_and_says_nothing(own_cache):
    archive = class_archive.class_archive()
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(os.urandom(1 << 20))  # not an archive: as one written by another JDK build

    options = class_archive.archive_java_options()
    assert options[0] == f"-XX:SharedArchiveFile={archive}"
    java = subprocess.run([str(class_archive._java()), *options, "-version"], capture_output=True, text=True,
                          timeout=60)
    assert java.returncode == 0
    assert [line for line in java.stderr.splitlines() if "version" not in line and "Runtime" not in line
            and "VM" not in line] == []
    assert options[0] in submit.submit_properties().read_text()


def test_spark_setup_says_why_no_archive_was_written_and_succeeds(own_cache, tmp_path, monkeypatch):
    from coordinator.spark.session import spark_defaults_file

    broken = tmp_path / "spark-defaults.conf"  # a driver JVM that cannot start
    broken.write_text(re.sub(r"^spark\.driver\.memory .*$", "spark.driver.memory 1k", spark_defaults_file().read_text(),
                             flags=re.MULTILINE))
    monkeypatch.setenv("TXCOORD_SPARK_CONF", str(broken))

    setup = subprocess.run([sys.executable, "-m", "coordinator", "spark-setup", "--json"], capture_output=True,
                           text=True, timeout=300)
    assert setup.returncode == 0, setup.stderr
    assert "no class archive written: the training checker did not deliver" in setup.stderr
    assert "Too small maximum heap" in setup.stderr  # the end of its log says why
    assert json.loads(setup.stdout)["class_archive"] is None
    assert not class_archive.class_archive().exists()
    assert list(class_archive.class_archive().parent.glob("*.jsa*")) == []  # no staged archive left


@pytest.mark.slow
def test_spark_setup_writes_the_archive_and_the_checkers_launches_map_it(own_cache, tmp_path):
    from coordinator.lakehouse import init_lakehouse

    stale = class_archive.class_archive().with_name("classes-0123456789abcdef.jsa")  # of a JDK since removed
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"not mapped by anything")
    other_spark = tmp_path / "other-spark"
    (other_spark / "jars").mkdir(parents=True)
    (other_spark / "jars" / "spark-core.jar").write_bytes(b"")
    kept = stale.with_name(f"classes-{class_archive._identity(class_archive._java(), other_spark)}.jsa")
    kept.write_bytes(b"another installation's, still in place")
    kept.with_suffix(".json").write_text(json.dumps({"java": str(class_archive._java()), "spark_home": str(other_spark)}))
    setup = subprocess.run([sys.executable, "-m", "coordinator", "spark-setup", "--json"], capture_output=True,
                           text=True, timeout=600)
    assert setup.returncode == 0, setup.stderr
    archive = class_archive.class_archive()
    assert json.loads(setup.stdout)["class_archive"] == str(archive)
    assert archive.stat().st_size > 50_000_000  # Spark's, Delta's and the streaming classes
    assert not stale.exists() and kept.exists()
    assert f"-XX:SharedArchiveFile={archive}" in submit.submit_properties().read_text()
    assert list(Path(json.loads(setup.stdout)["spark_conf_dir"]).iterdir()) == []

    lakehouse = tmp_path / "lakehouse"
    init_lakehouse(str(lakehouse))  # a fresh one: the checker's first batch is a heartbeat
    config = write_config(str(lakehouse), trigger_interval_ms=200)
    with CheckerJob(config, str(lakehouse), str(tmp_path / "submitted.log")) as checker:
        checker.wait_ready(300)
        assert str(archive) in mapped_files(jvm_of(checker))
    assert checker.exit_code() == 0
    assert "[cds" not in Path(tmp_path / "submitted.log").read_text()

    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    environment.pop("SPARK_CONF_DIR", None)
    command = [sys.executable, "-m", "coordinator", "checker", "--config", config]
    with Job(command, tmp_path / "in-process.log", env=environment).start() as checker:
        wait_until(lambda: first_batch_after(str(lakehouse), checker.started_wall), 300,
                   "txcoord checker's first batch", poll_s=0.5)
        assert str(archive) in mapped_files(jvm_of(checker))
    assert checker.exit_code() == 0
    assert "[cds" not in Path(tmp_path / "in-process.log").read_text()
