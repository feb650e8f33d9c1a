"""The Java client (clients/java, issue 55 point 3) against the real checker: its example order service sends
transactions and answers the checker's check-back, on a local disk and on the S3 server. What it commits
reaches topics/ORDER_TOPIC exactly once, what it rolls back never, and the UNKNOW ones are checked back and
answered from its database. The Maven build is made once per session (support.java_client)."""

import json
import subprocess
from collections import Counter

import pytest

from support import checker_on_fresh_lakehouse
from support.java_client import JAVA_CLIENT, JVM_OPTIONS
from support.waiting import wait_until

pytestmark = pytest.mark.slow

ORDERS = 6  # order i: i % 3 == 0 commits, 1 rolls back, 2 answers UNKNOW and is checked back (commit)


def topic_rows(lakehouse, topic: str) -> list[dict]:
    from deltalake import DeltaTable

    path = lakehouse.key_path(f"topics/{topic}")
    try:
        table = DeltaTable(path, storage_options=lakehouse.storage or None)
    except Exception:  # not created before its first delivery
        return []
    return table.to_pyarrow_table(columns=["transaction_id", "msg_id", "keys", "body"]).to_pylist()


def run_order_service(directory, java_client, tmp_path, group="order_group") -> list[dict]:
    service = subprocess.run(
        ["java", *JVM_OPTIONS, "-cp", java_client, str(JAVA_CLIENT / "examples" / "OrderService.java"), "--config",
         f"{directory}/bench.toml", "--group", group, "--orders", str(ORDERS), "--db", str(tmp_path / "orders-db"),
         "--wait-s", "180"],
        capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in service.stdout.splitlines() if line.startswith("{")]
    assert service.returncode == 0, f"{service.stdout[-3000:]}\n{service.stderr[-3000:]}"
    return lines


def check_delivery(lakehouse, lines):
    sent = [line for line in lines if line["event"] == "sent"]
    assert [line["send_status"] for line in sent] == ["SEND_OK"] * ORDERS
    states = {line["transaction_id"]: line["local_state"] for line in sent}
    assert Counter(states.values()) == {"COMMIT_MESSAGE": 2, "ROLLBACK_MESSAGE": 2, "UNKNOW": 2}
    checks = [line for line in lines if line["event"] == "check"]
    unknown = {t for t, state in states.items() if state == "UNKNOW"}
    assert {check["transaction_id"] for check in checks} >= unknown
    assert all(check["state"] == "COMMIT_MESSAGE" for check in checks if check["transaction_id"] in unknown)
    assert lines[-1] == {"event": "done", "checked_all": True}

    delivered = {t for t, state in states.items() if state != "ROLLBACK_MESSAGE"}
    wait_until(lambda: {row["transaction_id"] for row in topic_rows(lakehouse, "ORDER_TOPIC")} >= delivered,
               timeout_s=180, what="the committed and checked-back orders on ORDER_TOPIC", poll_s=1)
    rows = topic_rows(lakehouse, "ORDER_TOPIC")
    assert Counter(row["transaction_id"] for row in rows) == {t: 1 for t in delivered}  # once each; rollbacks never
    by_transaction = {line["transaction_id"]: line for line in sent}
    for row in rows:
        order = by_transaction[row["transaction_id"]]["order"]
        assert row["msg_id"] == by_transaction[row["transaction_id"]]["msg_id"]
        assert (row["keys"], json.loads(row["body"])) == (f"order-{order}", {"order": order})


def test_the_java_order_service_on_a_local_disk(java_client, tmp_path):
    from coordinator.lakehouse import Lakehouse

    directory, checker = checker_on_fresh_lakehouse(str(tmp_path / "lakehouse"), "java-client", trigger_ms=200,
                                                    transaction_timeout_ms=1000)
    with checker:
        checker.wait_ready(300)
        lines = run_order_service(directory, java_client, tmp_path)
        check_delivery(Lakehouse(directory), lines)


def test_the_java_order_service_on_s3(java_client, s3_lakehouse, tmp_path):
    directory, checker = checker_on_fresh_lakehouse(str(tmp_path / "config"), "java-client-s3", trigger_ms=200,
                                                    object_store=s3_lakehouse, transaction_timeout_ms=1000)
    with checker:
        checker.wait_ready(300)
        lines = run_order_service(directory, java_client, tmp_path)
        check_delivery(s3_lakehouse, lines)
