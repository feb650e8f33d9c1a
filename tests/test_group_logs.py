"""A group's commit logs, one per instance running at once (``coordinator.commit_logs``,
``ProducerInstances.claim_log``): claimed without two instances taking the same one, found by the
checker without gaps, and each read as its group's own."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from support import Clock, end_record, half_record
from support.producer_side import RecordingListener
from coordinator import CoordinatorConfig, Message, TransactionProducer
from coordinator.commit_logs import LOGS_PER_GROUP, CommitLogRef, CommitLogs, Layout
from coordinator.control.instances import ProducerInstances
from coordinator.exceptions import InvalidArgumentError
from coordinator.lakehouse import Lakehouse, create_table
from coordinator.tables import COMMIT_LOG


def test_a_groups_further_logs_are_its_own_and_no_other_name_is_a_log():
    assert CommitLogRef.of_group("g", 3) == CommitLogRef("groups/g/commit_log.3")
    assert (CommitLogRef("groups/g/commit_log.3").group, CommitLogRef("groups/g/commit_log.3").number) == ("g", 3)
    assert (CommitLogRef("groups/g/commit_log").group, CommitLogRef("groups/g/commit_log").number) == ("g", 0)
    for name in ("commit_log.0", "commit_log.03", f"commit_log.{LOGS_PER_GROUP}", "commit_log.x", "commit_log.-1",
                 "commit_log.", "commit_log.\uff11", "commit_logs", "commit_log.1.2"):
        assert CommitLogRef(f"groups/g/{name}").group is None, name
        with pytest.raises(InvalidArgumentError):
            CommitLogRef.of(f"groups/g/{name}")
    with pytest.raises(InvalidArgumentError):
        CommitLogRef.of_group("g", LOGS_PER_GROUP)


def test_instances_claim_the_lowest_free_log_and_take_over_one_whose_instance_is_gone(tmp_path):
    clock = Clock()
    instances = ProducerInstances(str(tmp_path), clock=clock)
    for instance in ("a", "b", "c"):
        instances.announce("g", instance, heartbeat_s=2.0)
    assert [instances.claim_log("g", i).number for i in ("a", "b", "c")] == [0, 1, 2]
    assert instances.claim_log("g", "b").number == 1  # its own claim stays its own

    clock.now += 5.0
    for instance in ("a", "c", "d"):
        instances.announce("g", instance, heartbeat_s=2.0)  # "b" stopped renewing: not live after 6 s
    assert instances.claim_log("g", "d").number == 3  # "b" is still live
    clock.now += 2.0
    instances.announce("e", "x", heartbeat_s=2.0)  # another group's instance takes its own first log
    for instance in ("a", "c", "d", "e"):
        instances.announce("g", instance, heartbeat_s=2.0)
    assert instances.claim_log("g", "e").number == 1  # "b" is gone: its log is free again
    assert instances.claim_log("e", "x").number == 0


def test_bytes_that_are_no_claim_count_as_free_and_with_every_log_taken_an_instance_shares_one(tmp_path):
    instances = ProducerInstances(str(tmp_path))
    instances.files.put("groups/g/_producers/commit_log.0.claim", b"\xff not json")
    instances.announce("g", "a", heartbeat_s=60.0)
    assert instances.claim_log("g", "a").number == 0

    for number in range(1, LOGS_PER_GROUP):
        instances.announce("g", f"i{number}", heartbeat_s=60.0)
        assert instances.claim_log("g", f"i{number}").number == number
    instances.announce("g", "late", heartbeat_s=60.0)
    shared = instances.claim_log("g", "late")
    assert shared.group == "g" and shared == instances.claim_log("g", "late")  # the same one every time


def test_the_checker_finds_every_log_of_a_group_and_looks_only_past_those_it_knows(tmp_path):
    lakehouse = Lakehouse(str(tmp_path))
    for ref in (CommitLogRef.of_group("g", n) for n in range(3)):
        create_table(COMMIT_LOG, lakehouse.key_path(ref.key))
    create_table(COMMIT_LOG, lakehouse.key_path("groups/g/commit_log.x"))  # the group's own bytes: no log
    create_table(COMMIT_LOG, lakehouse.key_path("groups/h/commit_log"))
    logs = CommitLogs(lakehouse)
    assert [ref.key for ref in logs.discover()] == [
        "groups/g/commit_log", "groups/g/commit_log.1", "groups/g/commit_log.2", "groups/h/commit_log",
        "operators/commit_log"]

    probed = []
    exists = lakehouse.files.exists
    lakehouse.files.exists = lambda key: probed.append(key) or exists(key)
    assert [ref.key for ref in logs.discover(Layout(), known=["groups/g/commit_log.2"])] == [
        "groups/g/commit_log", "groups/g/commit_log.1", "groups/g/commit_log.2", "groups/h/commit_log",
        "operators/commit_log"]
    assert sorted(probed) == ["groups/g/commit_log.3/_delta_log/00000000000000000000.json",
                              "groups/h/commit_log.1/_delta_log/00000000000000000000.json"]


def test_an_instance_makes_the_logs_below_its_own_so_that_a_reader_finds_its_log(tmp_path):
    config = CoordinatorConfig(lakehouse=str(tmp_path / "lakehouse"))
    instances = ProducerInstances(config.lakehouse)
    for instance in ("a", "b"):  # two instances that claimed logs 0 and 1, then died before writing
        instances.announce("g", instance, heartbeat_s=60.0)
        instances.claim_log("g", instance)
    with TransactionProducer("g", RecordingListener(), config) as producer:
        producer.send_message_in_transaction(Message("ORDER_TOPIC", b"x"))
        assert producer.commit_log.number == 2
    assert [ref.key for ref in CommitLogs(Lakehouse(config.lakehouse)).discover() if ref.group == "g"] == [
        "groups/g/commit_log", "groups/g/commit_log.1", "groups/g/commit_log.2"]


def test_records_of_a_groups_further_log_are_its_groups_and_one_naming_another_group_is_refused(checker):
    checker.write(half_record("mine", group="g"), log="groups/g/commit_log")
    checker.write(half_record("also-mine", group="g"), log="groups/g/commit_log.1")
    checker.write(half_record("forged", group="victim"), log="groups/g/commit_log.1")
    checker.write(*[end_record(t, group="g") for t in ("mine", "also-mine")], log="groups/g/commit_log.1")
    checker.run()
    assert sorted(r.transaction_id for r in checker.rows("op") if r.outcome == "COMMIT") == ["also-mine", "mine"]
    refused = checker.rows("rejected")
    assert [(r.transaction_id, r.commit_log) for r in refused] == [("forged", "groups/g/commit_log.1")]
    assert "names producer group 'victim'" in refused[0].reason
    assert checker.rows("half", pc.field("transaction_id") == "forged") == []
