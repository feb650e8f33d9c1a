"""The consumer groups' operator commands (``txcoord add-consumer-group``, ``consumer-groups``, ``dead-letters``)
against a real consumer, with no JVM; and producer -> checker -> consumer end to end."""

from __future__ import annotations

import json
import time

import pytest

from coordinator import ConsumeResult, CoordinatorConfig, TopicConsumer
from coordinator.cli import main
from coordinator.consumer.group import ConsumerGroup
from coordinator.lakehouse import Lakehouse, init_lakehouse, read_table
from support.clock import Clock
from support.consumers import RecordingListener, TopicFeed
from support.waiting import wait_until


@pytest.fixture
def settings(tmp_path):
    lakehouse = tmp_path / "lakehouse"
    init_lakehouse(str(lakehouse))
    toml = tmp_path / "coordinator.toml"
    toml.write_text(f"lakehouse = '{lakehouse}'\nconsumer_poll_interval_ms = 5\nconsumer_max_attempts = 2\n"
                    "consumer_retry_delays_ms = [1000]\nconsumer_heartbeat_ms = 60000\n")
    return CoordinatorConfig.load(toml, environ={}), str(toml)


def txcoord(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dead_letters_listed_redriven_discarded_and_the_group_described_and_reset(settings, capsys):
    config, toml = settings
    code, out, _ = txcoord(capsys, "add-consumer-group", "credits", "--topics", "ORDERS", "--shares", "2",
                           "--config", toml)
    assert code == 0 and "consumer group credits may read ORDERS (2 shares a topic)" in out
    assert "topics/ORDERS/" in out and "consumers/credits/progress/" in out
    feed = TopicFeed(config)
    feed.deliver("ORDERS", [("K1", b"bad-1"), ("K2", b"bad-2"), ("K3", b"good")])
    clock, healed = Clock(), set()
    clock.now = time.time()  # the commands take an instance for live by the wall clock

    def answer(message):
        return ConsumeResult.SUCCESS if message.body == b"good" or message.body in healed else ConsumeResult.FAILURE

    listener = RecordingListener(answer)
    with TopicConsumer("credits", ["ORDERS"], listener, config, clock=clock) as consumer:
        wait_until(lambda: len(listener.handled) >= 3, 30, "the first attempts")
        code, out, err = txcoord(capsys, "consumer-groups", "reset", "credits", "--topic", "ORDERS", "--to", "earliest",
                                 "--config", toml)
        assert code == 2 and "live instance" in err
        clock.now += 1.1
        dead = wait_until(lambda: len(_open(capsys, toml)) == 2 and _open(capsys, toml), 30, "two dead letters")
        assert {d["body"] for d in dead} == {"bad-1", "bad-2"} and {d["attempts"] for d in dead} == {2}
        code, out, _ = txcoord(capsys, "consumer-groups", "describe", "credits", "--json", "--config", toml)
        described = json.loads(out)
        assert described["live_instances"] == [consumer.instance_id] and described["open_dead_letters"] == 2
        orders = next(t for t in described["topics"] if t["topic"] == "ORDERS")
        assert orders["lag_messages"] == 0 and orders["latest_version"] == 0
        healed.add(b"bad-1")
        bad_1 = next(d for d in dead if d["body"] == "bad-1")
        code, out, _ = txcoord(capsys, "dead-letters", "redrive", "credits", "--msg-id", bad_1["msg_id"],
                               "--reason", "fixed the bug", "--config", toml)
        assert code == 0 and "1 dead letter(s) of credits redriven" in out
        again = wait_until(lambda: [m for m in listener.handled if m.topic_version == -1], 30, "the redrive")
        assert [(m.body, m.delivery_attempt, m.topic) for m in again] == [(b"bad-1", 1, "ORDERS")]
        code, out, err = txcoord(capsys, "dead-letters", "discard", "credits", "--msg-id", "nope", "--config", toml)
        assert code == 2 and "no open dead letter of message(s) nope" in err
        code, out, _ = txcoord(capsys, "dead-letters", "discard", "credits", "--all", "--config", toml)
        assert code == 0 and "1 dead letter(s) of credits discarded" in out
        assert _open(capsys, toml) == []
    feed.deliver("ORDERS", [("K4", b"later")])
    code, out, _ = txcoord(capsys, "consumer-groups", "describe", "credits", "--config", toml)
    assert "0 live instance(s)" in out and "lag 1 message(s)" in out
    code, out, _ = txcoord(capsys, "consumer-groups", "reset", "credits", "--topic", "ORDERS", "--to", "latest",
                           "--config", toml)
    assert code == 0 and "version 2" in out
    code, out, _ = txcoord(capsys, "consumer-groups", "describe", "credits", "--json", "--config", toml)
    assert next(t for t in json.loads(out)["topics"] if t["topic"] == "ORDERS")["lag_messages"] == 0
    actions = sorted(read_table(Lakehouse.of(config).consumer_table("credits", "operator_actions")).to_pylist(),
                     key=lambda action: action["acted_at"])
    assert [a["action"] for a in actions] == ["REDRIVE", "DISCARD", "RESET"]
    assert all("@" in a["operator"] for a in actions) and actions[0]["detail"] == "fixed the bug"
    # Reset to an offset: every message below it taken as handled, the rest delivered.
    code, out, _ = txcoord(capsys, "consumer-groups", "reset", "credits", "--topic", "ORDERS", "--to", "2",
                           "--config", toml)
    assert code == 0
    again = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], again, config, clock=clock):
        wait_until(lambda: len(again.handled) >= 2, 30, "the messages from offset 2")
    assert sorted(again.bodies()) == [b"good", b"later"]
    feed.close()


def test_grants_lists_the_consumer_groups_beside_the_producer_groups(settings, capsys):
    config, toml = settings
    assert txcoord(capsys, "add-group", "order_group", "--config", toml)[0] == 0
    for group, topics in (("credits", ["ORDERS"]), ("audit", ["ORDERS", "AUDIT_*"])):
        assert txcoord(capsys, "add-consumer-group", group, "--topics", *topics, "--config", toml)[0] == 0
    Lakehouse.of(config).files.put("consumers/broken/_grant.json", b"not a grant")
    code, out, err = txcoord(capsys, "grants", "--json", "--config", toml)
    assert code == 0 and "left out: consumers/broken/_grant.json is not consumer group 'broken''s grant" in err
    grants = {(g["principal"], g["prefix"], tuple(g["access"])) for g in json.loads(out)["grants"]}
    assert ("group order_group", "groups/order_group/_producers/", ("read", "write", "delete")) in grants
    assert ("consumer credits", "topics/ORDERS/", ("read",)) in grants
    assert ("consumer audit", "topics/AUDIT_*/", ("read",)) in grants
    assert ("consumer audit", "consumers/audit/shares/", ("read", "write", "delete")) in grants
    assert ("operators", "consumers/*/progress/", ("read", "write", "delete")) in grants
    assert not any(principal == "consumer broken" for principal, _, _ in grants)
    code, out, _ = txcoord(capsys, "grants", "--config", toml)
    assert code == 0 and "consumer credits" in out and "group order_group" in out
    # --account names a consumer group's principal consumer:GROUP; one the lakehouse lacks is refused, not ignored.
    code, _, err = txcoord(capsys, "grants", "--config", toml, "--account", "consumer:nobody=svc-x")
    assert code == 2 and "no 'consumer nobody'" in err and "txcoord add-consumer-group nobody" in err
    code, _, err = txcoord(capsys, "add-consumer-group", "credits", "--topics", "ORDERS", "--config", toml,
                           "--account", "consumer:credits=svc-credits")
    assert code == 2 and "is a local directory" in err  # a bucket policy is for S3 (tests/test_tenancy_s3.py)


def test_a_consumer_groups_bucket_policy_grants_its_topics_and_refuses_what_s3_cannot_match():
    from coordinator.exceptions import InvalidArgumentError
    from coordinator.ops.tenancy import s3_bucket_policy

    policy = s3_bucket_policy("s3://b/lh", {"consumer credits": ["svc-credits"]},
                              consumer_groups={"credits": ("ORDERS", "AUDIT_*"), "audit": ("LEDGER",)})
    statements = policy["Statement"]
    assert statements and all(s["Sid"].startswith("TxcoordConsumer") and s["Principal"] == {"AWS": ["svc-credits"]}
                              for s in statements)
    resources = {r for s in statements for r in s["Resource"]}
    assert {"arn:aws:s3:::b/lh/topics/ORDERS/*", "arn:aws:s3:::b/lh/topics/AUDIT_*/*",
            "arn:aws:s3:::b/lh/consumers/credits/progress/*"} <= resources
    assert not any("LEDGER" in r or "consumers/audit" in r for r in resources)  # another group's: not credits'
    with pytest.raises(InvalidArgumentError, match=r"no \[\.\.\.\]"):
        s3_bucket_policy("s3://b/lh", {"consumer credits": ["svc-credits"]}, consumer_groups={"credits": ("ORDER_[AB]",)})


def _open(capsys, toml):
    code, out, _ = txcoord(capsys, "dead-letters", "list", "credits", "--json", "--config", toml)
    assert code == 0
    return json.loads(out)["dead_letters"]


def test_a_message_goes_from_a_producer_through_the_checker_to_a_consumer(settings, checker_for):
    config, _ = settings
    checker = checker_for(config)
    from support.records import end_record, half_record

    # Two commits: the halves' queue offsets follow the log's versions (within one commit their order is the checker's).
    checker.write(half_record("t1", topic="ORDERS", body=b"one", keys="K"))
    checker.write(half_record("t2", topic="ORDERS", body=b"two", keys="K"))
    checker.write(end_record("t2"), end_record("t1"))
    checker.run()
    ConsumerGroup(Lakehouse.of(config), "credits").write_grant(["ORDERS"], 4, "tester")
    listener = RecordingListener()
    with TopicConsumer("credits", ["ORDERS"], listener, config):
        wait_until(lambda: len(listener.handled) >= 2, 30, "both messages")
    assert listener.bodies() == [b"one", b"two"]  # the key's queue offsets, not the order the ends came in
    assert [m.transaction_id for m in listener.handled] == ["t1", "t2"]
    assert listener.handled[0].queue_offset < listener.handled[1].queue_offset


@pytest.fixture
def checker_for():
    from support.batches import ManualChecker

    return ManualChecker
