"""`txcoord upgrade` takes a lakehouse of the version where every group shared one commit log to
commit logs per group, losing and duplicating nothing.

The lakehouse is one that version really wrote (``fixtures/make_lakehouse_before_tenancy.py`` says
how, and what it holds): delivered, rolled-back and pending transactions, and commits made while its
checker was down.
"""

from __future__ import annotations

import json
import tarfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from coordinator import LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.checker.query import CheckerQuery
from coordinator.config import CoordinatorConfig
from coordinator.exceptions import OutdatedLakehouseError
from coordinator.lakehouse import SHARED_LOG_KEY, Lakehouse, read_table
from coordinator.tables import COMMIT_LOG, REJECTED
from support import end_record, half_record, wait_until
from support.lakehouse import append_rows
from tests.test_cli import txcoord

FIXTURE = Path(__file__).parent / "fixtures" / "lakehouse_before_tenancy.tar.gz"
GROUPS = {"order_group": "orders", "payment_group": "payments"}
COMMIT, ROLLBACK = LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE


class AfterUpgrade(TransactionListener):
    """New sends commit; of the three transactions left pending, checks commit the 0th and 2nd, roll back the 1st."""

    def execute_local_transaction(self, msg, arg):
        return COMMIT

    def check_local_transaction(self, msg):
        return ROLLBACK if msg.keys.endswith("-1") else COMMIT


def expected(group: str) -> list[str]:
    return sorted([f"c-{group}-{i}" for i in range(10)] + [f"d-{group}-{i}" for i in range(5)]
                  + [f"p-{group}-0", f"p-{group}-2"] + [f"n-{group}-{i}" for i in range(5)])


def delivered_keys(lakehouse: Lakehouse, topic: str) -> list[str]:
    return sorted(read_table(lakehouse.topic(topic), ["keys"]).column("keys").to_pylist())


@pytest.fixture
def earlier_lakehouse(tmp_path) -> tuple[CoordinatorConfig, Path]:
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(tmp_path, filter="data")
    config_file = tmp_path / "coordinator.toml"
    # The fixture's halves were stored when it was made: nothing may expire for its age.
    config_file.write_text(f'lakehouse = "{tmp_path / "lakehouse"}"\ntransaction_timeout_ms = 1000\n'
                           'transaction_check_interval_ms = 1000\nfile_reserved_time_hours = 1000000\n')
    return CoordinatorConfig.load(str(config_file)), config_file


def test_a_lakehouse_of_the_shared_commit_log_is_upgraded_losing_and_duplicating_nothing(spark, earlier_lakehouse):
    config, config_file = earlier_lakehouse
    lakehouse = Lakehouse.of(config)
    before = {topic: delivered_keys(lakehouse, topic) for topic in GROUPS.values()}
    assert before == {topic: sorted(f"c-{group}-{i}" for i in range(10)) for group, topic in GROUPS.items()}

    with pytest.raises(OutdatedLakehouseError, match="txcoord upgrade"):
        CheckerQuery(spark, config).start()

    upgraded = txcoord("upgrade", "--config", str(config_file), "--json")
    assert upgraded.returncode == 0, upgraded.stderr
    done = json.loads(upgraded.stdout)
    shared_log = lakehouse.key_path(SHARED_LOG_KEY)
    assert done["done"] and done["groups"] == sorted(GROUPS)
    assert done["shared_log_end"] == DeltaTable(shared_log).version() + 1  # all it holds is taken in
    again = json.loads(txcoord("upgrade", "--config", str(config_file), "--json").stdout)
    assert again == done  # idempotent: no second epoch, the same end of the shared log

    checker = CheckerQuery(spark, config).start()
    try:
        # A producer still on the shared log after the upgrade: refused, never delivered.
        append_rows(shared_log, COMMIT_LOG, [half_record("late", group="order_group", topic="orders", keys="late"),
                                             end_record("late", group="order_group")])
        with ExitStack() as running:
            producers = [running.enter_context(TransactionProducer(group, AfterUpgrade(), config)) for group in GROUPS]
            for producer, (group, topic) in zip(producers, GROUPS.items()):
                for i in range(5):
                    producer.send_message_in_transaction(Message(topic, b"after", keys=f"n-{group}-{i}"))
            for group, topic in GROUPS.items():
                wait_until(lambda: delivered_keys(lakehouse, topic) == expected(group), timeout_s=90)
            wait_until(lambda: read_table(lakehouse.path(REJECTED), filter=pc.field("transaction_id") == "late").num_rows == 2)
    finally:
        checker.stop()

    for group, topic in GROUPS.items():
        keys = read_table(lakehouse.topic(topic), ["keys"]).column("keys").to_pylist()
        assert Counter(keys) == Counter(expected(group))  # each exactly once, no rollback, nothing of "late"
    late = read_table(lakehouse.path(REJECTED), ["reason", "commit_log"], filter=pc.field("transaction_id") == "late")
    assert set(late.column("commit_log").to_pylist()) == {SHARED_LOG_KEY}
    assert all("after `txcoord upgrade` retired it" in reason for reason in late.column("reason").to_pylist())
