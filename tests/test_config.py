"""Configuration: RocketMQ's defaults, a TOML file, TXCOORD_* overrides, and refusals."""

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import ConfigError
from coordinator.lakehouse import Lakehouse


def write_toml(tmp_path, text):
    path = tmp_path / "coordinator.toml"
    path.write_text(text)
    return path


def test_defaults_are_rocketmqs():
    config = CoordinatorConfig()
    assert config.transaction_timeout_ms == 6000
    assert config.transaction_check_interval_ms == 60000
    assert config.transaction_check_max == 15
    assert config.file_reserved_time_hours == 72


def test_missing_default_file_means_all_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert CoordinatorConfig.load(environ={}) == CoordinatorConfig()


def test_toml_file_is_read(tmp_path):
    path = write_toml(tmp_path, 'lakehouse = "/data/lh"\ntransaction_check_max = 5\n')
    config = CoordinatorConfig.load(path, environ={})
    assert config.lakehouse == "/data/lh"
    assert config.transaction_check_max == 5
    assert config.transaction_timeout_ms == 6000


def test_environment_overrides_the_file(tmp_path):
    path = write_toml(tmp_path, 'lakehouse = "/data/lh"\ntransaction_check_max = 5\n')
    environ = {"TXCOORD_TRANSACTION_CHECK_MAX": " 7 ", "TXCOORD_LAKEHOUSE": "/other", "UNRELATED": "x"}
    config = CoordinatorConfig.load(path, environ=environ)
    assert config.transaction_check_max == 7
    assert config.lakehouse == "/other"


@pytest.mark.parametrize(
    "text",
    [
        "transaction_check_max = 0\n",
        "transaction_check_max = -3\n",
        'transaction_check_max = "15"\n',
        "transaction_check_max = true\n",
        "transaction_timeout_ms = 1.5\n",
        'lakehouse = ""\n',
        "no_such_setting = 1\n",
        "this is not toml\n",
        'topic_grants = "ORDER_*"\n',
        '[topic_grants]\norder_group = "ORDER_*"\n',
        '[topic_grants]\norder_group = ["ORDER_*", ""]\n',
        '[topic_grants]\norder_group = [1]\n',
        'rebuild_in_spark = "sometimes"\n',
        'rebuild_in_spark = true\n',
    ],
)
def test_bad_files_are_refused(tmp_path, text):
    with pytest.raises(ConfigError):
        CoordinatorConfig.load(write_toml(tmp_path, text), environ={})


@pytest.mark.parametrize("value", ["abc", "", "1.5", "0"])
def test_bad_environment_values_are_refused(tmp_path, value):
    with pytest.raises(ConfigError):
        CoordinatorConfig.load(write_toml(tmp_path, ""), environ={"TXCOORD_TRANSACTION_TIMEOUT_MS": value})


def test_a_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        CoordinatorConfig.load(tmp_path / "absent.toml", environ={})


def test_where_the_checker_rebuilds_is_auto_unless_set(tmp_path):
    assert CoordinatorConfig().rebuild_in_spark == "auto"
    assert CoordinatorConfig.load(write_toml(tmp_path, ""), environ={
        "TXCOORD_REBUILD_IN_SPARK": "always"}).rebuild_in_spark == "always"
    with pytest.raises(ConfigError, match="auto, always, never"):
        CoordinatorConfig().replace(rebuild_in_spark="Spark")


def test_replace_validates_too():
    assert CoordinatorConfig().replace(transaction_timeout_ms=500).transaction_timeout_ms == 500
    with pytest.raises(ConfigError):
        CoordinatorConfig().replace(transaction_timeout_ms=0)


@pytest.mark.parametrize("location", ["gs://bucket/lh", "hdfs://nn/lh"])
def test_a_lakehouse_on_a_store_the_producers_cannot_reach_is_refused_not_taken_for_a_local_path(location):
    with pytest.raises(ConfigError, match="is not supported; a lakehouse is a local path, on S3-compatible storage"):
        CoordinatorConfig(lakehouse=location)


@pytest.mark.parametrize("location", ["s3://bucket/lh", "abfss://c@account.dfs.core.windows.net/lh", "az://c/lh"])
def test_a_lakehouse_on_s3_or_azure_is_object_storage(location):
    assert Lakehouse(CoordinatorConfig(lakehouse=location).lakehouse).root == location
    assert not Lakehouse(location).is_local


def test_topic_grants_are_read_from_their_table_and_off_without_it(tmp_path):
    text = '[topic_grants]\norder_group = ["ORDER_TOPIC", "AUDIT_*"]\nquiet_group = []\n'
    config = CoordinatorConfig.load(write_toml(tmp_path, text), environ={})

    assert config.topic_grants == {"order_group": ("ORDER_TOPIC", "AUDIT_*"), "quiet_group": ()}
    assert CoordinatorConfig.load(write_toml(tmp_path, ""), environ={}).topic_grants is None


def test_consumer_defaults_start_at_the_earliest_and_retry_on_rocketmqs_ladder():
    config = CoordinatorConfig()
    assert config.consumer_start_from == "earliest"
    assert config.consumer_max_attempts == 16
    assert config.consumer_retry_delays_ms[:3] == (10_000, 30_000, 60_000)
    assert config.consumer_retry_delays_ms[-1] == 7_200_000 and len(config.consumer_retry_delays_ms) == 16


def test_consumer_settings_from_the_file_and_the_environment(tmp_path):
    path = write_toml(tmp_path, 'consumer_start_from = "2025-06-01T00:00:00+00:00"\n'
                                "consumer_retry_delays_ms = [1000, 5000]\n")
    config = CoordinatorConfig.load(path, environ={"TXCOORD_CONSUMER_MAX_ATTEMPTS": "4"})
    assert config.consumer_retry_delays_ms == (1000, 5000) and config.consumer_max_attempts == 4
    config = CoordinatorConfig.load(path, environ={"TXCOORD_CONSUMER_RETRY_DELAYS_MS": "10, 20"})
    assert config.consumer_retry_delays_ms == (10, 20)


@pytest.mark.parametrize("text", [
    'consumer_start_from = "yesterday"\n',
    'consumer_start_from = "2025-06-01T00:00:00"\n',  # no zone: whose midnight?
    "consumer_retry_delays_ms = []\n",
    "consumer_retry_delays_ms = [1000, -1]\n",
    'consumer_retry_delays_ms = "1000"\n',
    "consumer_max_attempts = 0\n",
    "consumer_timeout_ms = 0\n",
])
def test_bad_consumer_settings_are_refused(tmp_path, text):
    with pytest.raises(ConfigError):
        CoordinatorConfig.load(write_toml(tmp_path, text), environ={})


def test_the_java_client_knows_every_key_this_config_has():
    """The Java client refuses keys it does not know (as this one does): a key added here and not there breaks
    every Java service reading the same file. Read from its source, so this holds without a JVM."""
    import dataclasses
    import re
    from pathlib import Path

    source = (Path(__file__).parent.parent / "clients/java/src/main/java/io/txcoord/client/CoordinatorConfig.java").read_text()
    listed = re.search(r"KNOWN_KEYS = Set\.of\((.*?)\);", source, re.S).group(1)
    java_keys = set(re.findall(r'"([a-z_]+)"', listed))
    assert java_keys == {f.name for f in dataclasses.fields(CoordinatorConfig)}
