"""The Spark session's setup: which jars a session launches with, and what ``spark-submit`` is given."""

import hashlib

import pytest

from coordinator.checker import session
from coordinator.exceptions import SparkSetupError


def test_jars_listed_in_the_spark_defaults_come_after_the_cached_delta_jars():
    cached = session.cached_jars()
    assert any("delta-spark" in jar for jar in cached)
    assert session.launch_jars({}) == cached
    assert session.launch_jars({"spark.jars": " /opt/a.jar, /opt/b.jar ,"}) == cached + ["/opt/a.jar", "/opt/b.jar"]


def test_spark_submit_gets_the_jars_and_the_launch_settings_in_a_file_of_the_cache(tmp_path, monkeypatch):
    properties = tmp_path / "spark-conf" / "spark-defaults.conf"
    monkeypatch.setattr(session, "SPARK_SUBMIT_PROPERTIES", properties)
    session._write_spark_submit_properties()

    written = session.read_spark_defaults(properties)
    defaults = session.read_spark_defaults()
    assert written["spark.jars"].split(",") == session.launch_jars(defaults)
    assert written["spark.driver.memory"] == defaults["spark.driver.memory"]
    assert "spark.master" not in written  # spark-submit's --master decides
    assert session.spark_job_environment()["SPARK_CONF_DIR"] == str(session.SPARK_SUBMIT_PROPERTIES.parent)


def test_the_lock_pins_every_cached_jar_for_these_pyspark_and_delta_versions():
    pinned = session._read_lock(session.spark_packages())

    cached = {jar.rsplit("/", 1)[1] for jar in session.cached_jars()}
    assert cached == {f"{group}_{artifact}-{version}.jar" for group, artifact, version in map(
        lambda coordinates: coordinates.split(":"), pinned)}


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A Maven repository on disk holding one jar, a lock pinning it, and a jar cache to fill."""
    jar = tmp_path / "repo" / "org" / "example" / "lib" / "1.0" / "lib-1.0.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"PK jar bytes")
    monkeypatch.setattr(session, "MAVEN_CENTRAL", (tmp_path / "repo").as_uri())
    monkeypatch.setattr(session, "JARS_LOCK", tmp_path / "spark-jars.lock")
    monkeypatch.setattr(session, "JARS_DIR", tmp_path / "cache" / "jars")
    monkeypatch.setattr(session, "SPARK_SUBMIT_PROPERTIES", tmp_path / "cache" / "spark-conf" / "spark-defaults.conf")
    monkeypatch.setattr(session, "spark_packages", lambda: ["org.example:lib:1.0"])

    def lock(packages: str, digest: str) -> None:
        session.JARS_LOCK.write_text(f"# packages {packages}\norg.example:lib:1.0 {digest}\n")

    return lock, hashlib.sha256(jar.read_bytes()).hexdigest()


def test_setup_downloads_what_the_lock_pins_and_once(repository):
    lock, digest = repository
    lock("org.example:lib:1.0", digest)

    assert session.install_delta_jars() == [str(session.JARS_DIR / "org.example_lib-1.0.jar")]
    session.MAVEN_CENTRAL = "file:///nowhere"  # a second setup finds the cache complete
    assert session.install_delta_jars() == [str(session.JARS_DIR / "org.example_lib-1.0.jar")]
    assert session.read_spark_defaults(session.SPARK_SUBMIT_PROPERTIES)["spark.jars"].startswith(
        str(session.JARS_DIR / "org.example_lib-1.0.jar"))


def test_a_jar_that_does_not_match_its_pinned_digest_is_refused_and_nothing_is_cached(repository):
    lock, digest = repository
    lock("org.example:lib:1.0", "0" * 64)

    with pytest.raises(SparkSetupError, match="does not match the SHA-256"):
        session.install_delta_jars()
    assert not session.JARS_DIR.exists()


def test_a_lock_of_other_versions_says_how_to_relock(repository):
    lock, digest = repository
    lock("org.example:lib:0.9", digest)

    with pytest.raises(SparkSetupError, match=r"pins the jars of org\.example:lib:0\.9.*--lock"):
        session.install_delta_jars()
