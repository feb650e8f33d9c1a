"""The checker's Prometheus endpoint (``metrics_port``): served while it runs, moving as transactions flow."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.checker.query import CheckerQuery
from coordinator.config import CoordinatorConfig
from coordinator.exceptions import ConfigError
from coordinator.lakehouse import Lakehouse
from coordinator.producer.commit_log import CommitLogWriter
from support import end_record, half_record, wait_until


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample at ``http://127.0.0.1:port/metrics``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def lag_read(port: int) -> float:
    """The checker's lag in commit-log versions, as scraped."""
    return scrape(port)[("txcoord_commit_log_lag_versions", ())]


def test_the_checker_serves_its_metrics_and_they_move_as_transactions_flow(spark, config):
    config = config.replace(metrics_port=0, trigger_interval_ms=200)
    checker = CheckerQuery(spark, config).start()
    try:
        port = checker.metrics_port
        before = scrape(port)
        assert before[("txcoord_checker_lease_held", ())] == 1 and before[("txcoord_checker_standby", ())] == 0
        with CommitLogWriter(Lakehouse.of(config), "g") as writer:
            writer.submit([half_record("paid", topic="ORDERS"), half_record("refused", topic="ORDERS"),
                           half_record("open", topic="ORDERS")]).result()
            writer.submit([end_record("paid"), end_record("refused", "ROLLBACK_MESSAGE"),
                           end_record("paid", group="intruder"), end_record("open", "UNKNOW", check_id="open-1")]).result()

        def moved():
            # A batch's samples are set one after another, so a scrape can fall between two of them: wait for the
            # delivery and for the pending gauge the same batch sets after its counters (3 halves, then 1).
            now = scrape(port)
            delivered = now.get(("txcoord_messages_delivered_total", (("topic", "ORDERS"),))) == 1
            return now if delivered and now.get(("txcoord_pending_half_messages", (("topic", "ORDERS"),))) == 1 else None

        after = wait_until(moved, timeout_s=60)
        assert after[("txcoord_transactions_ended_total", (("outcome", "commit"),))] == 1
        assert after[("txcoord_transactions_ended_total", (("outcome", "rollback"),))] == 1
        assert after[("txcoord_half_messages_stored_total", ())] == 3
        assert after[("txcoord_check_answers_total", (("answer", "unknown"),))] == 1  # "open" stays pending
        assert after[("txcoord_commit_to_visible_seconds_count", (("topic", "ORDERS"),))] == 1
        assert 0 < after[("txcoord_commit_to_visible_seconds_sum", (("topic", "ORDERS"),))] < 60
        assert after[("txcoord_half_to_end_seconds_count", ())] == 2  # "paid" and "refused"
        assert after[("txcoord_records_rejected_total", ())] == 1  # the intruder's END, in g's log
        assert after[("txcoord_pending_half_messages", (("topic", "ORDERS"),))] == 1  # "open"
        assert after[("txcoord_half_messages_ended_total", (("outcome", "commit"), ("topic", "ORDERS")))] == 1
        assert after[("txcoord_half_messages_ended_total", (("outcome", "rollback"), ("topic", "ORDERS")))] == 1
        assert 0 < after[("txcoord_oldest_pending_transaction_age_seconds", ())] < 120
        assert scrape(port)[("txcoord_oldest_pending_transaction_age_seconds", ())] >= after[
            ("txcoord_oldest_pending_transaction_age_seconds", ())]  # as of each scrape
        assert after[("txcoord_batches_total", ())] >= 1
        assert after[("txcoord_batch_duration_seconds_count", ())] == after[("txcoord_batches_total", ())]
        assert after[("txcoord_last_batch_timestamp_seconds", ())] > 0
        caught_up = wait_until(lambda: lag_read(port) == 0, timeout_s=30)
        assert caught_up and scrape(port)[("txcoord_commit_log_lag_seconds", ())] == 0
    finally:
        checker.stop()
    assert before[("txcoord_oldest_pending_transaction_age_seconds", ())] == 0  # nothing was pending
    with pytest.raises(urllib.error.URLError):  # stopped: nothing served any more
        scrape(port)


def test_metrics_are_not_served_unless_asked_and_a_bad_port_is_refused(tmp_path):
    assert CoordinatorConfig(lakehouse=str(tmp_path)).metrics_port is None
    for bad in (-1, 70000, "9464", True):
        with pytest.raises(ConfigError, match="metrics_port must be a TCP port"):
            CoordinatorConfig(lakehouse=str(tmp_path), metrics_port=bad)
    assert CoordinatorConfig.load(None, environ={"TXCOORD_METRICS_PORT": "9464"}).metrics_port == 9464


def test_latencies_counted_a_batch_at_a_time_are_served_as_prometheus_clients_histogram_serves_them():
    from dataclasses import replace

    import pyarrow as pa
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from coordinator.checker.batch import BatchSummary
    from coordinator.checker.exporter import _LATENCY_BUCKETS, CheckerExporter

    batches = [{"ORDERS": [0.05, 0.1, 0.3, 1.0, 2.5], "PAYMENTS": [7.0]}, {"ORDERS": [45.0, 1000.0, 0.1]}]
    exporter = CheckerExporter()
    reference = CollectorRegistry()
    one_by_one = Histogram("txcoord_commit_to_visible_seconds", "", ["topic"], buckets=_LATENCY_BUCKETS,
                           registry=reference)
    for batch_id, latencies in enumerate(batches):
        exporter.batch_done(replace(BatchSummary(batch_id), commit_to_visible_s={
            topic: pa.chunked_array([seconds], pa.float64()) for topic, seconds in latencies.items()}))
        for topic, seconds in latencies.items():
            for value in seconds:
                one_by_one.labels(topic).observe(value)

    def samples(registry, name):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(generate_latest(registry).decode())
                for s in family.samples if s.name.startswith(name) and not s.name.endswith("_created")}

    served = samples(exporter.registry, "txcoord_commit_to_visible_seconds")
    assert served == samples(reference, "txcoord_commit_to_visible_seconds")
    assert served[("txcoord_commit_to_visible_seconds_count", (("topic", "ORDERS"),))] == 8
    assert served[("txcoord_commit_to_visible_seconds_bucket", (("le", "0.1"), ("topic", "ORDERS")))] == 3
    assert samples(exporter.registry, "txcoord_half_to_end_seconds_count") == {("txcoord_half_to_end_seconds_count", ()): 0}


def test_the_endpoint_serves_each_consumer_groups_lag_retries_and_dead_letters_as_describe_shows_them(config):
    """Served by the checker's exporter (the checker job registers them), computed at each scrape; one group whose
    records cannot be read is left out and counted, the others are served."""
    import datetime as dt

    from coordinator import ConsumeResult, TopicConsumer
    from coordinator.checker.exporter import CheckerExporter
    from coordinator.jobs.consumer_metrics import watch_consumer_groups
    from coordinator.lakehouse import read_table
    from coordinator.ops.consumer_groups import add_consumer_group, describe_consumer_group
    from support.consumers import RecordingListener, TopicFeed

    config = config.replace(consumer_max_attempts=1, consumer_poll_interval_ms=5, consumer_heartbeat_ms=60_000)
    for group in ("credits", "audit"):
        add_consumer_group(config, group, ["ORDERS"], shares=2, operator="platform@test")
    feed = TopicFeed(config)
    feed.deliver("ORDERS", [("K1", b"bad"), ("K2", b"good"), (None, b"good too")])
    committed = min(read_table(Lakehouse.of(config).topic("ORDERS"), ["commit_timestamp"]).column(0).to_pylist())
    now = committed + dt.timedelta(seconds=42)
    exporter = CheckerExporter()
    watch_consumer_groups(exporter.registry, config, clock=lambda: now)
    port = exporter.serve("127.0.0.1", 0)
    try:
        def sample(name: str, group: str, topic: str | None = "ORDERS") -> float | None:
            labels = (("group", group),) + ((("topic", topic),) if topic else ())
            return scrape(port).get((f"txcoord_consumer_{name}", tuple(sorted(labels))))

        for group in ("credits", "audit"):
            assert sample("lag_messages", group) == 3 and sample("lag_seconds", group) == 42
            assert sample("dead_letters", group, None) == 0 and sample("live_instances", group, None) == 0
        listener = RecordingListener(lambda m: ConsumeResult.FAILURE if m.body == b"bad" else ConsumeResult.SUCCESS)
        with TopicConsumer("credits", ["ORDERS"], listener, config):
            wait_until(lambda: sample("dead_letters", "credits", None) == 1, 30, "the dead letter served")
            assert sample("live_instances", "credits", None) == 1
        served = scrape(port)
        described = describe_consumer_group(config, "credits", now)
        [orders] = [t for t in described.topics if t.topic == "ORDERS"]
        assert served[("txcoord_consumer_lag_messages", (("group", "credits"), ("topic", "ORDERS")))] == orders.lag_messages == 0
        assert served[("txcoord_consumer_lag_seconds", (("group", "credits"), ("topic", "ORDERS")))] == 0
        assert served[("txcoord_consumer_retrying_messages", (("group", "credits"), ("topic", "ORDERS")))] == 0
        assert served[("txcoord_consumer_live_instances", (("group", "credits"),))] == 0
        assert sample("lag_messages", "audit") == 3  # another group's lag is its own
        assert served[("txcoord_consumer_groups_unreadable", ())] == 0

        Lakehouse.of(config).files.put("consumers/audit/progress/ORDERS/0.json", b"not a progress record")
        broken = scrape(port)
        assert broken[("txcoord_consumer_groups_unreadable", ())] == 1
        assert ("txcoord_consumer_lag_messages", (("group", "audit"), ("topic", "ORDERS"))) not in broken
        assert broken[("txcoord_consumer_dead_letters", (("group", "credits"),))] == 1  # the others still served
    finally:
        exporter.close()
        feed.close()
