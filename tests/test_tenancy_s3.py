"""Tenancy on a real S3 server with one account per principal: the bucket policy `txcoord grants`
prints is all that keeps groups apart, and the checker refuses what a group may write but not claim.

The server (versitygw) keeps accounts of its own; its root account owns the bucket: with it the
platform team makes the lakehouse and its groups (``txcoord init``, ``txcoord add-group``) and sets
the policy ``txcoord grants --account ...`` prints, as it would with ``aws s3api put-bucket-policy``.
"""

from __future__ import annotations

import json
import uuid
from contextlib import ExitStack

import boto3
import pytest
from deltalake import DeltaTable

from coordinator import LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.commit_logs import CommitLogRef
from coordinator.config import CoordinatorConfig
from coordinator.doorbells import doorbell_key
from coordinator.exceptions import AccessDeniedError
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.tables import REJECTED
from support import end_record, half_record, wait_until
from support.producer_side import RecordingListener
from support.servers import require_s3_server
from tests.test_cli import txcoord

pytestmark = pytest.mark.object_store

BUCKET = "tenancy"  # not the other tests' bucket: Spark's S3A keeps one client per bucket
ROOT = f"s3://{BUCKET}/lh"
ACCOUNTS = {"checker": "svc-checker", "operators": "ops-alice", "analysts": "analyst-bob",
            "group order_group": "svc-orders", "group payment_group": "svc-payments",
            "consumer credits": "svc-credits", "consumer audit": "svc-audit"}
GRANTS = {"order_group": ["orders"], "payment_group": ["payments"]}
#: The consumer groups and the topics each may read (topics of their own: the other tests count what the
#: producers' topics hold).
CONSUMER_GRANTS = {"credits": ["stock"], "audit": ["ledger"]}
COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)


class Tenancy:
    """The lakehouse at :data:`ROOT` and every principal's ``[storage]`` settings."""

    def __init__(self, server):
        self.server = server
        self.storage = {principal: server.create_account(name, f"{name}-secret") for principal, name in ACCOUNTS.items()}

    def lakehouse(self, principal: str) -> Lakehouse:
        return Lakehouse(ROOT, self.storage[principal])

    def config(self, principal: str, **settings) -> CoordinatorConfig:
        return CoordinatorConfig(lakehouse=ROOT, storage=self.storage[principal], topic_grants=GRANTS, **settings)


@pytest.fixture(scope="module")
def tenancy(tmp_path_factory):
    require_s3_server()
    from coordinator.conformance.versitygw import S3Server

    work = tmp_path_factory.mktemp("s3-accounts")
    with S3Server(work / "data", log_file=str(work / "server.log"), with_accounts=True,
                  sidecar=True) as server:  # the policy outgrows the 4 KB of extended attributes ext4 keeps
        server.create_bucket(BUCKET)
        tenancy = Tenancy(server)
        # The platform team, as the bucket's owner: the lakehouse, its groups, and the policy `txcoord grants` prints.
        owner = work / "owner.toml"
        owner.write_text(f'lakehouse = "{ROOT}"\n[storage]\n'
                         + "".join(f'{key} = "{value}"\n' for key, value in server.storage_options.items()))
        for command in (["init"], *(["add-group", group] for group in GRANTS),
                        *(["add-consumer-group", group, "--topics", *topics, "--shares", "2"]
                          for group, topics in CONSUMER_GRANTS.items())):
            done = txcoord(*command, "--config", str(owner))
            assert done.returncode == 0, done.stderr
        accounts = [f"--account={principal.removeprefix('group ').replace('consumer ', 'consumer:')}={name}"
                    for principal, name in ACCOUNTS.items()]
        # versitygw refuses a policy naming s3:if-none-match (tests/test_commit_rewrites.py): the rest of it, here.
        granted = txcoord("grants", "--config", str(owner), "--json", "--allow-overwrites", *accounts)
        assert granted.returncode == 0, granted.stderr
        root = server.storage_options
        boto3.client("s3", endpoint_url=server.endpoint, region_name=root["aws_region"],
                     aws_access_key_id=root["aws_access_key_id"], aws_secret_access_key=root["aws_secret_access_key"],
                     ).put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(json.loads(granted.stdout)["s3_bucket_policy"]))
        yield tenancy


def log_version(tenancy: Tenancy, key: str) -> int:
    return DeltaTable(tenancy.lakehouse("checker").key_path(key), storage_options=tenancy.storage["checker"]).version()


def test_a_group_writes_only_its_own_log_and_reads_only_its_own_check_requests(tenancy):
    payments = tenancy.lakehouse("group payment_group")
    for target in (CommitLogRef.of_group("order_group"), CommitLogRef.operators()):
        before = log_version(tenancy, target.key)
        with pytest.raises(AccessDeniedError, match=target.key) as denied:
            with CommitLogWriter(payments, target) as writer:
                writer.submit([half_record(uuid.uuid4().hex, group="order_group", topic="orders")]).result()
        assert "denied" in str(denied.value)
        # Nor around the product's API: the storage itself refuses the next commit of the log.
        next_commit = f"{target.key}/_delta_log/{before + 1:020d}.json"
        with pytest.raises(AccessDeniedError, match=next_commit):
            payments.files.create(next_commit, b'{"commitInfo":{}}')
        assert log_version(tenancy, target.key) == before  # nothing written
    with pytest.raises(AccessDeniedError, match="groups/order_group/check_requests"):
        read_table(payments.check_requests("order_group"), storage=payments.storage)
    with pytest.raises(AccessDeniedError, match="system/half"):
        payments.read("system/half")
    read_table(payments.check_requests("payment_group"), storage=payments.storage)  # its own: granted
    # Its further logs are its own as well: a second instance makes one and writes it (a rollback: the module's
    # other tests count what is delivered); no other group may.
    settings = tenancy.config("group payment_group")
    with TransactionProducer("payment_group", Shop(), settings) as first, \
            TransactionProducer("payment_group", RecordingListener(ROLLBACK), settings) as second:
        assert (first.commit_log.number, second.commit_log.number) == (0, 1)
        second.send_message_in_transaction(Message(GRANTS["payment_group"][0], b"refused", keys="r-second"))
    assert log_version(tenancy, "groups/payment_group/commit_log.1") >= 2
    with pytest.raises(AccessDeniedError, match="groups/payment_group/commit_log.1"):
        tenancy.lakehouse("group order_group").files.create(
            "groups/payment_group/commit_log.1/_delta_log/00000000000000000099.json", b'{"commitInfo":{}}')

    # Its doorbell, that one key, is its own too (coordinator.doorbells); no other group's, and nothing beside it.
    payments.files.put(doorbell_key("payment_group"), b"rung")
    for key in (doorbell_key("order_group"), f"{doorbell_key('payment_group')}.x", "groups/payment_group.bellx"):
        with pytest.raises(AccessDeniedError, match=key):
            payments.files.put(key, b"rung")

    analysts = tenancy.lakehouse("analysts")
    analysts.read("system/half")
    with pytest.raises(AccessDeniedError, match="groups/order_group/commit_log"):
        with CommitLogWriter(analysts, "order_group") as writer:
            writer.submit([half_record(uuid.uuid4().hex, group="order_group", topic="orders")]).result()

    operators = tenancy.lakehouse("operators")
    with CommitLogWriter(operators, CommitLogRef.operators()) as writer:  # theirs alone
        writer.submit([end_record("nothing-open", group="order_group", check_id="operator-test")]).result()
    with pytest.raises(AccessDeniedError, match="groups/payment_group/check_requests"):
        read_table(operators.check_requests("payment_group"), storage=operators.storage)


class Shop(TransactionListener):
    """``c-*`` commit; ``u-*`` answer UNKNOW, then their check commits ``u-*-even`` and rolls back the others."""

    def execute_local_transaction(self, msg, arg):
        return COMMIT if msg.keys.startswith("c-") else UNKNOW

    def check_local_transaction(self, msg):
        return COMMIT if int(msg.keys.rsplit("-", 1)[1]) % 2 == 0 else ROLLBACK


def start_checker(spark, tenancy: Tenancy, **settings):
    """The streaming checker with the checker's account, for this bucket only (the session's other tests use another)."""
    from coordinator.checker.query import CheckerQuery
    from coordinator.spark import object_store_conf

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in object_store_conf(tenancy.storage["checker"]).items():
        setting = key.removeprefix("spark.hadoop.")
        hadoop.set(setting.replace("fs.s3a.", f"fs.s3a.bucket.{BUCKET}.", 1), value)
    return CheckerQuery(spark, tenancy.config("checker", trigger_interval_ms=200, **settings)).start()


def test_forgeries_are_refused_and_every_groups_traffic_is_delivered_exactly_once(spark, tenancy):
    checker = start_checker(spark, tenancy, transaction_timeout_ms=1000, transaction_check_interval_ms=1000)
    try:
        with ExitStack() as running:
            producers = {group: running.enter_context(TransactionProducer(
                group, Shop(), tenancy.config(f"group {group}", transaction_timeout_ms=1000))) for group in GRANTS}
            for group, producer in producers.items():
                for kind, count in (("c", 6), ("u", 4)):
                    for i in range(count):
                        producer.send_message_in_transaction(Message(GRANTS[group][0], b"paid", keys=f"{kind}-{group}-{i}"))
            with CommitLogWriter(tenancy.lakehouse("group payment_group"), "payment_group") as forger:
                forger.submit([half_record("claims-orders", group="order_group", topic="orders", keys="forged-1"),
                               end_record("claims-orders", group="order_group")]).result()
                forger.submit([half_record("ungranted", group="payment_group", topic="orders", keys="forged-2"),
                               end_record("ungranted", group="payment_group")]).result()
                forger.submit([half_record("operator-mark", group="payment_group", topic="payments", keys="forged-3")]).result()
                forger.submit([end_record("operator-mark", group="payment_group", check_id="operator-forged")]).result()
            for group, topics in GRANTS.items():
                wait_until(lambda: sorted(delivered(tenancy, topics[0])) == expected(group), timeout_s=120)
    finally:
        checker.stop()

    for group, topics in GRANTS.items():
        assert sorted(delivered(tenancy, topics[0])) == expected(group)  # each exactly once, no forgery
    rejected = tenancy.lakehouse("analysts").read(REJECTED, ["transaction_id", "commit_log", "reason"])
    reasons = {}
    for row in rejected.to_pylist():
        reasons.setdefault(row["transaction_id"], []).append((row["commit_log"], row["reason"]))
    assert {log for log, _ in reasons["claims-orders"]} == {"groups/payment_group/commit_log"}
    assert all("order_group" in reason for _, reason in reasons["claims-orders"])
    assert any("orders" in reason and "grant" in reason for _, reason in reasons["ungranted"])
    assert any("operator" in reason for _, reason in reasons["operator-mark"])


def delivered(tenancy: Tenancy, topic: str) -> list[str]:
    analysts = tenancy.lakehouse("analysts")
    key = f"topics/{topic}"
    return analysts.read(key, ["keys"]).column(0).to_pylist() if analysts.exists(key) else []


def expected(group: str) -> list[str]:
    return sorted([f"c-{group}-{i}" for i in range(6)] + [f"u-{group}-{i}" for i in (0, 2)])


def test_the_console_shows_and_does_only_what_each_users_account_may(spark, tenancy, tmp_path):
    """Console users with storage accounts of their own: the operators' account may end a transaction,
    the analysts' reads but the storage refuses its END, a group's account reads none of the checker's tables."""
    from coordinator.ops.audit import outcome, transaction_timeline
    from coordinator.ops.pending import pending_transactions
    from coordinator.web import OPERATOR, VIEWER, ConsoleUsers
    from support.console_client import running_console, signed_in

    users = ConsoleUsers(tmp_path / "console-users.toml")
    password = "a-password-long-enough"
    for name, role, principal in (("alice", OPERATOR, "operators"), ("bob", OPERATOR, "analysts"),
                                  ("carol", VIEWER, "group payment_group")):
        users.add(name, role, password, storage=tenancy.storage[principal])
    checker = start_checker(spark, tenancy, transaction_timeout_ms=600_000)  # immune from checks for the test
    try:
        with CommitLogWriter(tenancy.lakehouse("group order_group"), "order_group") as producer:
            producer.submit([half_record("console-pending", group="order_group", topic="orders")]).result()
        operators = tenancy.config("operators")
        # (The module's lakehouse is shared: a test run before on this worker may have left its own pending.)
        wait_until(lambda: "console-pending" in [t.transaction_id for t in pending_transactions(operators)], 120)
        # The console's own account is the analysts': read-only, as a shared console's should be.
        with running_console(tenancy.config("analysts"), users.path) as url:
            alice, bob, carol = (signed_in(url, name, password) for name in ("alice", "bob", "carol"))
            for session in (alice, bob):
                assert 'data-transaction="console-pending"' in session.get("/pending").text
            refused = carol.get("/pending")
            assert refused.status_code == 403 and "Refused by the storage" in refused.text and "system/" in refused.text

            before = log_version(tenancy, "operators/commit_log")
            form = {"reason": "cancelled by support", "confirm": "y"}
            denied = bob.post("/transactions/console-pending/rollback", form)
            assert denied.status_code == 403 and "operators/commit_log" in denied.text
            assert log_version(tenancy, "operators/commit_log") == before  # nothing written

            assert alice.post("/transactions/console-pending/rollback", form).status_code == 302
            lakehouse = tenancy.lakehouse("operators")
            wait_until(lambda: outcome(transaction_timeline(lakehouse, "console-pending")) == "ROLLBACK", 120)
    finally:
        checker.stop()
    [end] = [e for e in transaction_timeline(tenancy.lakehouse("operators"), "console-pending") if e.step == "end request"]
    assert "from operator alice" in end.detail and end.detail.endswith(": cancelled by support")


def test_a_consumer_group_reads_only_its_granted_topics_and_writes_only_its_own_records(tenancy, tmp_path):
    """Each consumer group with its own account, under the policy `txcoord grants` printed: it consumes its topic
    and writes its own progress and dead letters; an ungranted topic is refused naming the grant it lacks, by the
    product and by the storage; another group's progress and dead letters, its own grant, the operators' actions
    and its redrive table are the storage's to refuse."""
    from coordinator import ConsumeResult, TopicConsumer
    from coordinator.consumer.group import ConsumerGroup, ShareProgress
    from coordinator.consumer.topic_log import TopicLog
    from coordinator.lakehouse import create_table
    from coordinator.ops.consumer_groups import discard_dead_letters, open_dead_letters, redrive_dead_letters
    from coordinator.tables import DEAD_LETTERS
    from support.consumers import RecordingListener, TopicFeed

    feed = TopicFeed(tenancy.config("checker"))  # topics are the checker's to write
    feed.deliver("stock", [("s-1", b"restocked"), ("s-2", b"poison")])
    feed.deliver("ledger", [("l-1", b"entry")])
    feed.close()
    settings = {"consumer_max_attempts": 1, "consumer_poll_interval_ms": 20, "consumer_heartbeat_ms": 60_000}
    credits_config = tenancy.config("consumer credits", **settings)
    healed: set[bytes] = set()
    listener = RecordingListener(lambda m: ConsumeResult.FAILURE if m.body == b"poison" and m.body not in healed
                                 else ConsumeResult.SUCCESS)
    operators = tenancy.config("operators")
    with TopicConsumer("credits", ["stock"], listener, credits_config):
        dead = wait_until(lambda: open_dead_letters(operators, "credits"), 60, "credits' dead letter")
    assert sorted(listener.bodies()) == [b"poison", b"restocked"] and [d["body"] for d in dead] == [b"poison"]
    progress, _ = ConsumerGroup(tenancy.lakehouse("operators"), "credits").progress("stock", 0)
    assert progress is not None  # written by credits' own account

    # An ungranted topic: refused by the product, naming the grant it lacks, before any read...
    with pytest.raises(AccessDeniedError, match=r"may not read topic 'ledger': its grant \(consumers/credits/_grant.json\) "
                                                r"names stock.*txcoord add-consumer-group credits --topics stock ledger"):
        TopicConsumer("credits", ["ledger"], RecordingListener(), credits_config).start()
    # ...and around the product, by the storage, under the policy `txcoord grants` printed.
    credits = tenancy.lakehouse("consumer credits")
    with pytest.raises(AccessDeniedError, match="topics/ledger"):
        TopicLog(credits.files, "topics/ledger").rows(0)
    with pytest.raises(AccessDeniedError, match="topics/ledger"):
        credits.read("topics/ledger")

    # Another group's progress and dead letters are not credits' to write; nor are its own grant, the operators'
    # actions on it, or its redrive table.
    audit = ConsumerGroup(credits, "audit")
    with pytest.raises(AccessDeniedError, match="consumers/audit/progress/ledger/0.json"):
        audit.save_progress("ledger", 0, ShareProgress(99), None, "forger")
    with pytest.raises(AccessDeniedError, match="consumers/audit/dead_letters"):
        create_table(DEAD_LETTERS, credits.consumer_table("audit", "dead_letters"), credits.storage)
    with pytest.raises(AccessDeniedError, match="consumers/audit/dead_letters"):
        credits.files.create("consumers/audit/dead_letters/_delta_log/00000000000000000000.json", b'{"commitInfo":{}}')
    with pytest.raises(AccessDeniedError, match="consumers/credits/_grant.json"):
        ConsumerGroup(credits, "credits").write_grant(["stock", "ledger"], 2, "credits itself")
    for act in (discard_dead_letters, redrive_dead_letters):
        with pytest.raises(AccessDeniedError, match="consumers/credits/(operator_actions|redrive)"):
            act(credits_config, "credits", reason="by the group itself")
    assert len(open_dead_letters(operators, "credits")) == 1  # nothing closed
    assert ConsumerGroup(tenancy.lakehouse("operators"), "audit").progress("ledger", 0) == (None, None)

    # In the console, an operator with the group's own account is refused by the storage; with the operators'
    # account, the redrive goes through, and credits' own account consumes it.
    from coordinator.web import OPERATOR, ConsoleUsers
    from support.console_client import running_console, signed_in

    users, password = ConsoleUsers(tmp_path / "console-users.toml"), "a-password-long-enough"
    for name, principal in (("alice", "operators"), ("olga", "consumer credits")):
        users.add(name, OPERATOR, password, storage=tenancy.storage[principal])
    healed.add(b"poison")
    with running_console(tenancy.config("operators"), users.path) as url:
        olga, alice = signed_in(url, "olga", password), signed_in(url, "alice", password)
        assert f'data-msg-id="{dead[0]["msg_id"]}"' in olga.get("/consumers/credits").text  # its own: readable
        refused = olga.post("/consumers/credits/dead-letters/redrive", {"msg_id": dead[0]["msg_id"]},
                            token=olga.csrf_token("/consumers/credits"))
        assert refused.status_code == 403 and "Refused by the storage" in refused.text and "consumers/credits/" in refused.text
        assert len(open_dead_letters(operators, "credits")) == 1
        done = alice.post("/consumers/credits/dead-letters/redrive", {"msg_id": dead[0]["msg_id"], "reason": "fixed"},
                          token=alice.csrf_token("/consumers/credits"))
        assert done.status_code == 302 and "1 dead letter(s) of credits redriven" in alice.get("/consumers/credits").text
    with TopicConsumer("credits", ["stock"], listener, credits_config):
        wait_until(lambda: listener.bodies().count(b"poison") == 2, 60, "the redriven message")
    assert open_dead_letters(operators, "credits") == []

    # audit, with its own account, reads its topic, and not credits' records.
    audit_config = tenancy.config("consumer audit", **settings)
    entries = RecordingListener()
    with TopicConsumer("audit", ["ledger"], entries, audit_config):
        wait_until(lambda: entries.bodies() == [b"entry"], 60, "audit's entry")
    with pytest.raises(AccessDeniedError, match="consumers/credits/progress"):
        ConsumerGroup(tenancy.lakehouse("consumer audit"), "credits").progress("stock", 0)
