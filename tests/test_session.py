"""The Spark session's setup: which jars a session launches with, and what ``spark-submit`` is given."""

from coordinator.checker import session


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
