"""Onboarding a producer group: `txcoord add-group` while the checker runs, and `txcoord grants`."""

from __future__ import annotations

import json

from coordinator import LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.checker.query import CheckerQuery
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse
from support import wait_until
from tests.test_cli import txcoord


class Commits(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def delivered(lakehouse: Lakehouse, topic: str) -> list[str]:
    key = f"topics/{topic}"
    return sorted(lakehouse.read(key, ["transaction_id"]).column(0).to_pylist()) if lakehouse.exists(key) else []


def test_a_group_added_while_the_checker_runs_is_taken_in_without_a_restart(spark, tmp_path):
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(f'lakehouse = "{tmp_path / "lakehouse"}"\ntrigger_interval_ms = 200\n')
    assert txcoord("init", "--config", str(config_file)).returncode == 0
    config = CoordinatorConfig.load(str(config_file))
    lakehouse = Lakehouse.of(config)
    checker = CheckerQuery(spark, config).start()
    try:
        running = checker.query.runId
        added = txcoord("add-group", "billing", "--config", str(config_file), "--json")
        assert added.returncode == 0, added.stderr
        report = json.loads(added.stdout)
        assert report["created"] == [lakehouse.commit_log("billing"), lakehouse.check_requests("billing")]
        assert {(g["principal"], g["prefix"]) for g in report["grants"]} == {
            ("group billing", "groups/billing/commit_log"), ("group billing", "groups/billing/_producers/"),
            ("group billing", "groups/billing/check_requests/"), ("group billing", "groups/billing.bell")}  # its own only

        with TransactionProducer("billing", Commits(), config) as producer:
            sent = producer.send_message_in_transaction(Message("INVOICE", b"invoice 1"))
        wait_until(lambda: delivered(lakehouse, "INVOICE") == [sent.transaction_id], timeout_s=60)
        assert checker.query.isActive and checker.query.runId == running  # the same run: no restart
    finally:
        checker.stop()

    again = txcoord("add-group", "billing", "--config", str(config_file), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["created"] == []  # idempotent


def test_grants_lists_every_principal_and_refuses_a_bucket_policy_for_a_local_lakehouse(tmp_path):
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(f'lakehouse = "{tmp_path / "lakehouse"}"\n')
    assert txcoord("init", "--config", str(config_file)).returncode == 0
    assert txcoord("add-group", "orders", "--config", str(config_file)).returncode == 0

    listed = txcoord("grants", "--config", str(config_file), "--json")
    assert listed.returncode == 0, listed.stderr
    grants = json.loads(listed.stdout)["grants"]
    assert {g["principal"] for g in grants} == {"checker", "operators", "analysts", "group orders"}
    assert {"principal": "operators", "access": ["read", "write"], "prefix": "operators/commit_log/", "exact": False} in grants
    assert {"principal": "group orders", "access": ["read", "write"], "prefix": "groups/orders.bell", "exact": True} in grants
    assert json.loads(listed.stdout)["s3_bucket_policy"] is None

    refused = txcoord("grants", "--config", str(config_file), "--account", "checker=svc-checker")
    assert refused.returncode == 2 and "is a local directory" in refused.stderr


def test_a_new_groups_statements_merge_into_the_buckets_policy_in_place():
    from coordinator.ops.tenancy import merged_policy, s3_bucket_policy

    root, role = "s3://bucket/lh", "arn:aws:iam::123456789012:role/{}".format
    current = s3_bucket_policy(root, {"checker": [role("checker")], "group a": [role("a")], "group b": [role("b")]})
    foreign = {"Sid": "SomeoneElses", "Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": "arn:aws:s3:::x"}
    current["Statement"].append(foreign)

    merged = merged_policy(current, s3_bucket_policy(root, {"group b": [role("b2")], "group c": [role("c")]}))

    principals = [statement["Principal"] for statement in merged["Statement"]]
    assert foreign in merged["Statement"] and {"AWS": [role("b")]} not in principals
    for kept in ("checker", "a", "b2", "c"):
        assert principals.count({"AWS": [role(kept)]}) == (2 if kept == "checker" else 5)  # a group's: and its Deny
    assert len({statement["Sid"] for statement in merged["Statement"]}) == len(merged["Statement"])
    assert all(statement["Sid"].isalnum() for statement in merged["Statement"])
