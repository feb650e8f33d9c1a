"""The shipped alert rules, checked by promtool, and a real Prometheus server scraping a running checker."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from coordinator.checker.query import CheckerQuery
from coordinator.lakehouse import Lakehouse
from coordinator.producer.commit_log import CommitLogWriter
from support import REPO_ROOT
from support import end_record, half_record, wait_until
from tests.test_cli import txcoord

RULES = REPO_ROOT / "coordinator" / "resources" / "txcoord-alerts.yml"
RULE_TESTS = Path(__file__).parent / "prometheus" / "txcoord-alerts-test.yml"


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"no {binary} on PATH: `make test` installs Debian's prometheus package (apt-get install prometheus)")
    return path


def test_the_alert_rules_are_valid_and_fire_as_their_unit_tests_say():
    promtool = require("promtool")
    printed = txcoord("alert-rules")
    assert printed.returncode == 0 and printed.stdout == RULES.read_text()  # what an installed package hands out
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                            cwd=RULE_TESTS.parent)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


class Prometheus:
    """A Prometheus server scraping ``target`` every second, evaluating the shipped rules every second."""

    def __init__(self, workdir: Path, target: str):
        self.port = _free_port()
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "txcoord-checker", "static_configs": [{"targets": [target]}]}]}))
        self.process = subprocess.Popen(
            [require("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(workdir / "prometheus.log", "wb"), stderr=subprocess.STDOUT)
        wait_until(self._ready, timeout_s=30)

    def _get(self, path: str, **query) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.loads(response.read())

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def value(self, query: str) -> float | None:
        """The query's one value now, or ``None`` when it has none."""
        result = self._get("/api/v1/query", query=query)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def alert_state(self, name: str) -> str | None:
        """``pending`` or ``firing`` for alert ``name``, or ``None`` when it is inactive."""
        alerts = self._get("/api/v1/alerts")["data"]["alerts"]
        return next((alert["state"] for alert in alerts if alert["labels"]["alertname"] == name), None)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def test_prometheus_scrapes_the_checker_sees_transactions_flow_and_pages_when_no_checker_runs(spark, config, tmp_path):
    config = config.replace(metrics_port=0, trigger_interval_ms=200)
    checker = CheckerQuery(spark, config).start()
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{checker.metrics_port}")
        wait_until(lambda: prometheus.value("txcoord_checker_lease_held") == 1, timeout_s=30)
        # (pending at the first evaluation, before the first scrape; inactive from the next)
        wait_until(lambda: prometheus.alert_state("TxcoordNoChecker") is None, timeout_s=60)
        with CommitLogWriter(Lakehouse.of(config), "g") as writer:
            for i in range(3):
                writer.submit([half_record(f"t{i}", topic="ORDERS")]).result()
                writer.submit([end_record(f"t{i}")]).result()
        wait_until(lambda: prometheus.value('sum(txcoord_messages_delivered_total{topic="ORDERS"})') == 3, timeout_s=60)
        assert prometheus.value('txcoord_transactions_ended_total{outcome="commit"}') == 3
        assert prometheus.value("sum(txcoord_pending_half_messages)") == 0

        checker.stop()
        checker = None
        wait_until(lambda: prometheus.alert_state("TxcoordNoChecker") == "pending", timeout_s=30)
        assert prometheus.value('up{job="txcoord-checker"}') == 0
        wait_until(lambda: prometheus.alert_state("TxcoordNoChecker") == "firing", timeout_s=90)  # after its minute
    finally:
        if checker is not None:
            checker.stop()
        if prometheus is not None:
            prometheus.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_prometheus_scrapes_the_consumer_groups_lag_and_fires_on_a_dead_letter_until_it_is_discarded(config, tmp_path):
    """The consumer groups' metrics as the checker job serves them (its exporter, no Spark needed for them)."""
    from coordinator import ConsumeResult, TopicConsumer
    from coordinator.checker.exporter import CheckerExporter
    from coordinator.jobs.consumer_metrics import watch_consumer_groups
    from coordinator.ops.consumer_groups import add_consumer_group, discard_dead_letters
    from support.consumers import RecordingListener, TopicFeed

    config = config.replace(consumer_max_attempts=1, consumer_poll_interval_ms=5, consumer_heartbeat_ms=60_000)
    add_consumer_group(config, "credits", ["ORDERS"], shares=2, operator="platform@test")
    feed = TopicFeed(config)
    feed.deliver("ORDERS", [("K1", b"bad"), ("K2", b"good")])
    feed.close()
    exporter = CheckerExporter()
    watch_consumer_groups(exporter.registry, config)
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{exporter.serve('127.0.0.1', 0)}")
        lag = 'txcoord_consumer_lag_messages{group="credits", topic="ORDERS"}'
        wait_until(lambda: prometheus.value(lag) == 2, timeout_s=60)
        assert prometheus.value('txcoord_consumer_dead_letters{group="credits"}') == 0
        assert prometheus.alert_state("TxcoordConsumerDeadLetters") is None
        listener = RecordingListener(lambda m: ConsumeResult.FAILURE if m.body == b"bad" else ConsumeResult.SUCCESS)
        with TopicConsumer("credits", ["ORDERS"], listener, config):
            wait_until(lambda: prometheus.alert_state("TxcoordConsumerDeadLetters") == "firing", timeout_s=60)
        wait_until(lambda: prometheus.value(lag) == 0, timeout_s=60)  # progress saved as the consumer closed
        discard_dead_letters(config, "credits", reason="refunded by hand", operator="alice@test")
        wait_until(lambda: prometheus.alert_state("TxcoordConsumerDeadLetters") is None, timeout_s=60)
        assert prometheus.value('txcoord_consumer_dead_letters{group="credits"}') == 0
    finally:
        exporter.close()
        if prometheus is not None:
            prometheus.stop()
