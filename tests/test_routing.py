"""Each check goes to one live producer instance of its group (``coordinator.control.instances``)."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
from collections import Counter

import pyarrow.compute as pc
from deltalake import DeltaTable

from coordinator.control.instances import FORGET_AFTER_S, ProducerInstances
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.tables import CHECK_REQUESTS
from support import Clock, half_record, wait_until
from support.producer_side import commit_log_rows

UTC = dt.timezone.utc

# A producer instance of group "routed" whose every answer is UNKNOW, until killed. Live for three heartbeats
# (3 min) after its last: a stopped one is still live for the round after the stop however long that round's
# batch takes on a loaded machine, and a running one never drops out of a round (1 s heartbeats once left one
# out in CI). A killed one is passed over at once all the same: its process is gone from this host.
UNSURE_INSTANCE = """
import sys, time
from coordinator import CoordinatorConfig, LocalTransactionState, TransactionListener, TransactionProducer

class Unsure(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW

with TransactionProducer("routed", Unsure(), CoordinatorConfig(lakehouse=sys.argv[1], producer_heartbeat_ms=60000)) as p:
    print(p.instance_id, flush=True)
    time.sleep(600)
"""


def test_an_instance_is_live_while_it_renews_and_forgotten_long_after(tmp_path):
    clock = Clock()
    instances = ProducerInstances(str(tmp_path), clock=clock)
    for instance in ("a", "b", "c"):
        instances.announce("g", instance, heartbeat_s=2.0)
    instances.announce("other/../group", "d", heartbeat_s=2.0)  # any group name stays one directory
    assert [i.instance_id for i in instances.live("g")] == ["a", "b", "c"]
    assert [i.instance_id for i in instances.live("other/../group")] == ["d"]

    instances.withdraw("g", "b")
    clock.now += 5.0
    instances.announce("g", "c", heartbeat_s=2.0)
    assert [i.instance_id for i in instances.live("g")] == ["a", "c"]
    clock.now += 2.0  # "a" was last seen 7 s ago: more than three heartbeats
    assert [i.instance_id for i in instances.live("g")] == ["c"]
    assert instances.files.list("groups/g/_producers") == ["groups/g/_producers/a.json", "groups/g/_producers/c.json"]
    clock.now += FORGET_AFTER_S
    assert instances.live("g") == [] and len(instances.files.list("groups/g/_producers")) == 2  # reading deletes nothing
    instances.forget("g", instances.survey("g").stale)
    assert instances.files.list("groups/g/_producers") == []


def test_an_instance_whose_process_is_gone_from_this_host_is_passed_over_at_once(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; from coordinator.control.instances import "
                              "ProducerInstances; ProducerInstances(sys.argv[1]).announce('g', 'child', 60.0); "
                              "print('announced', flush=True); time.sleep(120)", str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "announced\n"
        instances = ProducerInstances(str(tmp_path))
        assert [i.instance_id for i in instances.live("g")] == ["child"]
        child.kill()
        child.wait(10)
        assert instances.live("g") == []  # 60 s heartbeats, but its process is gone
    finally:
        child.kill()


def test_checks_spread_over_the_live_instances_and_move_on_when_one_is_gone():
    live = [type("Instance", (), {"instance_id": name})() for name in ("a", "b", "c")]
    first = Counter(ProducerInstances.address("g", live, f"t{i}", 1) for i in range(300))
    assert set(first) == {"a", "b", "c"} and min(first.values()) > 60
    moved = sum(ProducerInstances.address("g", live, f"t{i}", 1) != ProducerInstances.address("g", live, f"t{i}", 2)
                for i in range(300))
    assert moved > 100  # the next check of a transaction often goes elsewhere
    assert ProducerInstances.address("g", [], "t1", 1) is None  # none known: any instance may answer


def check_requests(lakehouse: str) -> list[dict]:
    """The checks issued to group "routed", from its own table (the one its instances follow; the
    checker creates it with the group's first check)."""
    path = Lakehouse(lakehouse).check_requests("routed")
    if not DeltaTable.is_deltatable(path):
        return []
    return read_table(path, ["check_id", "check_times", "producer_instance"], pc.field("producer_group") == "routed").to_pylist()


def answers(lakehouse: str) -> Counter:
    return Counter(r["check_id"] for r in commit_log_rows(lakehouse, "routed") if r["kind"] == "END" and r["check_id"])


def test_three_instances_answer_each_check_once_and_a_killed_ones_checks_go_to_the_others(checker):
    lakehouse, transactions = checker.config.lakehouse, 30
    children = [subprocess.Popen([sys.executable, "-c", UNSURE_INSTANCE, lakehouse], stdout=subprocess.PIPE, text=True)
                for _ in range(3)]
    try:
        process_of = {child.stdout.readline().strip(): child for child in children}
        wait_until(lambda: len(ProducerInstances(lakehouse).live("routed")) == 3, 60)
        checker.write(*[half_record(f"t{i}", group="routed") for i in range(transactions)])
        checker.run()
        now = dt.datetime.now(UTC) + dt.timedelta(seconds=7)  # past the 6 s immunity

        def check_round() -> list[dict]:
            nonlocal now
            before = {r["check_id"] for r in check_requests(lakehouse)}
            checker.run(now=now)
            now += dt.timedelta(seconds=61)  # the next round: past the 60 s check interval
            issued = [r for r in check_requests(lakehouse) if r["check_id"] not in before]
            assert len(issued) == transactions
            return issued

        def answered(issued: list[dict]) -> bool:
            counted = answers(lakehouse)
            return all(counted[r["check_id"]] for r in issued)

        first = check_round()
        assert {r["producer_instance"] for r in first} == set(process_of)  # spread over all three
        wait_until(lambda: answered(first), 60)

        killed = sorted(process_of)[0]
        process_of[killed].send_signal(signal.SIGSTOP)  # still announced: checks go to it, unanswered
        second = check_round()
        lost = [r for r in second if r["producer_instance"] == killed]
        assert lost and {r["producer_instance"] for r in second} == set(process_of)
        wait_until(lambda: answered([r for r in second if r not in lost]), 60)
        process_of[killed].send_signal(signal.SIGKILL)
        process_of[killed].wait(10)

        third = check_round()  # the next interval
        assert {r["producer_instance"] for r in third} == set(process_of) - {killed}
        wait_until(lambda: answered(third), 60)

        checker.run(now=now)  # takes in the last answers
        counted = answers(lakehouse)
        assert [counted[r["check_id"]] for r in lost] == [0] * len(lost)
        assert all(counted[r["check_id"]] == 1 for r in first + second + third if r not in lost)  # exactly once
        assert len(checker.rows("rejected")) == 0
        recorded = read_table(Lakehouse(lakehouse).path(CHECK_REQUESTS), ["check_id", "producer_instance"],
                              pc.field("producer_group") == "routed").to_pylist()  # the checker's own record
        assert sorted(recorded, key=str) == sorted(({k: r[k] for k in ("check_id", "producer_instance")}
                                                    for r in check_requests(lakehouse)), key=str)
    finally:
        for child in children:
            child.kill()
            child.wait(10)
