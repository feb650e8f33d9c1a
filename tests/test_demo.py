"""``python -m coordinator demo`` end to end: the real checker job, the credits service (a consumer group, no
Spark, killed -9 once mid-story), SQLite.

One demo run (12 orders, every fate at least once; the ``demo`` fixture of
``conftest.py``) is shared by the tests marked ``slow`` (about two minutes; they
run in ``make test``, first); each checks one promise against the resulting
tables and database, not against the printout.
The others test the demo's parts without Spark.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from coordinator.demo.story import DemoError, Job, Resolution, Tally, invariant_failures, report
from coordinator.demo.services import (CREDITS_GROUP, MIN_ORDERS, ORDER_TOPIC, CreditStore, Fate, Order,
                                       OrderListener, OrderStore, make_orders, order_id_of, points_for)
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.tables import CHECK_REQUESTS, DISCARDED, HALF, OP
from support import DEMO_ORDERS as ORDERS

CHECK_MAX = 3  # the demo's transaction_check_max
PLAN = {order.order_id: order for order in make_orders(ORDERS)}


def rows(path: str, *columns: str) -> list[dict]:
    return read_table(path, list(columns)).to_pylist()


@pytest.fixture(scope="module")
def order_of_transaction(demo) -> dict[str, int]:
    lakehouse, _, _ = demo
    return {row["transaction_id"]: order_id_of(row["body"]) for row in rows(Lakehouse(lakehouse).path(HALF), "transaction_id", "body")}


def confirmed_in_sqlite(lakehouse: Path, status: str = "confirmed") -> list[int]:
    with sqlite3.connect(lakehouse / "orders.db") as db:
        return sorted(r[0] for r in db.execute("SELECT order_id FROM orders WHERE status = ?", (status,)))


def credits_in_sqlite(lakehouse: Path) -> list[dict]:
    return CreditStore(str(lakehouse / "credits.db")).credits()


def test_every_plan_walks_every_path_and_is_reproducible():
    for count in (MIN_ORDERS, ORDERS, 40, 100):
        orders = make_orders(count)
        assert set(o.fate for o in orders) == set(Fate)
        assert orders == make_orders(count)
        assert [o.order_id for o in orders] == list(range(1, count + 1))
    assert Counter(o.fate for o in make_orders(40))[Fate.STUCK] == 2
    with pytest.raises(ValueError):
        make_orders(MIN_ORDERS - 1)


@pytest.mark.parametrize(
    "fate, state, status, check",
    [
        (Fate.COMMIT, "COMMIT_MESSAGE", "confirmed", "COMMIT_MESSAGE"),
        (Fate.DECLINED, "ROLLBACK_MESSAGE", None, "ROLLBACK_MESSAGE"),
        (Fate.CRASH_AFTER_COMMIT, "UNKNOW", "confirmed", "COMMIT_MESSAGE"),
        (Fate.CRASH_BEFORE_DB, "UNKNOW", None, "ROLLBACK_MESSAGE"),
        (Fate.STUCK, "UNKNOW", "manual_review", "UNKNOW"),
    ],
)
def test_the_order_service_plays_each_fate_and_answers_checks_from_sqlite(tmp_path, fate, state, status, check):
    store = OrderStore(str(tmp_path / "orders.db"))
    store.create()
    listener = OrderListener(store)
    order = Order(7, "ada", 19.99, fate)

    assert listener.execute_local_transaction(order.message(), order).value == state
    assert store.status_of(7) == status
    assert listener.check_local_transaction(order.message()).value == check


def test_a_dead_job_is_reported_with_the_end_of_its_log(tmp_path):
    job = Job("checker", [sys.executable, "-c", "print('line one'); print('boom'); raise SystemExit(3)"],
              tmp_path / "job.log").start()
    job.process.wait(30)
    with pytest.raises(DemoError, match=r"(?s)checker job exited unexpectedly with code 3.*boom"):
        job.ensure_running()


def test_a_job_is_stopped_with_sigterm(tmp_path):
    graceful = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
                "print('ready', flush=True); time.sleep(60)")
    job = Job("credits", [sys.executable, "-c", graceful], tmp_path / "job.log").start()
    deadline = time.monotonic() + 30
    while "ready" not in (tmp_path / "job.log").read_text():
        assert time.monotonic() < deadline, "the job never said it was ready"
        time.sleep(0.05)
    assert job.stop(timeout_s=30) == 0


def test_the_invariant_catches_a_duplicate_delivery_with_equal_counts():
    sent = {"t1": Order(1, "ada", 10.0, Fate.COMMIT), "t2": Order(2, "alan", 20.0, Fate.COMMIT)}
    tally = Tally(resolutions={1: Resolution("COMMIT", False), 2: Resolution("COMMIT", False)},
                  confirmed=[1, 2], topic_order_ids=[1, 1], credit_order_ids=[1, 2])
    assert invariant_failures(tally, sent) == [
        "messages in topic differ from confirmed orders in SQLite: missing [2], extra [1]"
    ]


@pytest.mark.slow
def test_demo_exits_zero_and_reports_its_outcome_as_json(demo):
    lakehouse, result, seconds = demo
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    print(f"demo with {ORDERS} orders took {seconds:.0f} s")
    outcome = json.loads(result.stdout)
    assert "invariant holds" in result.stderr  # the commentary, kept off stdout
    assert outcome["invariant_holds"] and outcome["failures"] == [] and outcome["orders_sent"] == ORDERS
    confirmed = len(confirmed_in_sqlite(lakehouse))
    assert outcome["confirmed_orders"] == outcome["messages_in_topic"] == outcome["credits_granted"] == confirmed
    assert outcome["credits_service_killed"] == 1
    assert "killed the credits service (exit -9)" in result.stderr and "restarted it" in result.stderr
    assert outcome["discarded"] == sum(1 for o in PLAN.values() if o.fate is Fate.STUCK)


@pytest.mark.slow
def test_orders_in_sqlite_equal_messages_in_topic_equal_credits(demo):
    lakehouse, _, _ = demo
    confirmed = confirmed_in_sqlite(lakehouse)
    in_topic = sorted(order_id_of(r["body"]) for r in rows(Lakehouse(lakehouse).topic(ORDER_TOPIC), "body"))
    credited = sorted(r["order_id"] for r in credits_in_sqlite(lakehouse))
    # Lists, not sets: a duplicate delivery or a double credit must show.
    assert confirmed == in_topic == credited
    assert confirmed == sorted(o.order_id for o in PLAN.values() if o.fate.expected_outcome == "COMMIT")


@pytest.mark.slow
def test_every_order_ends_as_its_fate_requires(demo, order_of_transaction):
    lakehouse, _, _ = demo
    outcome, by_check = {}, {}
    for row in rows(Lakehouse(lakehouse).path(OP), "transaction_id", "outcome", "check_id"):
        order_id = order_of_transaction[row["transaction_id"]]
        assert order_id not in outcome, f"order {order_id} resolved twice"
        outcome[order_id], by_check[order_id] = row["outcome"], row["check_id"] is not None
    assert outcome == {order_id: order.fate.expected_outcome for order_id, order in PLAN.items()}
    # Orders whose producer never decided can only have been decided by a check-back.
    undecided = {Fate.CRASH_AFTER_COMMIT, Fate.CRASH_BEFORE_DB}
    assert all(by_check[i] for i, order in PLAN.items() if order.fate in undecided)


@pytest.mark.slow
def test_stuck_orders_are_checked_the_maximum_times_then_discarded(demo, order_of_transaction):
    lakehouse, _, _ = demo
    checks = Counter(order_of_transaction[r["transaction_id"]] for r in rows(Lakehouse(lakehouse).path(CHECK_REQUESTS), "transaction_id"))
    assert max(checks.values()) <= CHECK_MAX
    stuck = sorted(i for i, order in PLAN.items() if order.fate is Fate.STUCK)
    discarded = rows(Lakehouse(lakehouse).path(DISCARDED), "transaction_id", "check_times")
    assert sorted(order_of_transaction[r["transaction_id"]] for r in discarded) == stuck
    assert all(r["check_times"] == CHECK_MAX for r in discarded)
    assert all(checks[i] == CHECK_MAX for i in stuck)
    # Still in the order database, awaiting a human: never confirmed, never announced.
    assert confirmed_in_sqlite(lakehouse, "manual_review") == stuck


@pytest.mark.slow
def test_credits_follow_the_points_rule(demo):
    lakehouse, _, _ = demo
    credits = {r["order_id"]: r["points"] for r in credits_in_sqlite(lakehouse)}
    assert credits and credits == {i: points_for(PLAN[i].amount) for i in credits}


@pytest.mark.slow
def test_replaying_the_whole_topic_grants_nothing_twice(demo, tmp_path):
    """The credits group reset to the earliest message: every order is delivered again, none is credited again."""
    from coordinator.config import CoordinatorConfig
    from coordinator.consumer import TopicConsumer
    from coordinator.demo.credits import CreditsListener
    from coordinator.ops.consumer_groups import reset_consumer_group
    from support import wait_until

    lakehouse, _, _ = demo
    copy = tmp_path / "lakehouse"
    shutil.copytree(lakehouse, copy)
    config = CoordinatorConfig(lakehouse=str(copy))
    before = sorted((r["order_id"], r["points"]) for r in credits_in_sqlite(copy))
    reset_consumer_group(config, CREDITS_GROUP, ORDER_TOPIC, "earliest", operator="tester")
    delivered = []

    class Counting(CreditsListener):
        def consume(self, message):
            delivered.append(message.msg_id)
            return super().consume(message)

    listener = Counting(str(copy / "credits.db"))
    with TopicConsumer(CREDITS_GROUP, [ORDER_TOPIC], listener, config):
        wait_until(lambda: len(delivered) >= len(before), 120, "every order delivered again")
    listener.close()
    assert len(set(delivered)) == len(before)
    assert sorted((r["order_id"], r["points"]) for r in credits_in_sqlite(copy)) == before


def test_the_verdict_separates_a_broken_invariant_from_a_failed_job():
    from coordinator.config import CoordinatorConfig

    plan = [Order(1, "ada", 10.0, Fate.COMMIT)]
    sent = {"t1": plan[0]}
    good = Tally(resolutions={1: Resolution("COMMIT", False)}, confirmed=[1], topic_order_ids=[1], credit_order_ids=[1])
    lines: list[str] = []

    assert report(good, plan, sent, [], CoordinatorConfig(), [], lines.append, "") == 0
    assert lines[-1] == "invariant holds: orders in SQLite = messages in topic = credits granted = 1"

    lines.clear()
    assert report(good, plan, sent, [], CoordinatorConfig(), ["the checker job exited with code 1"], lines.append, "") == 1
    assert lines[-2:] == ["FAILED: the checker job exited with code 1",
                          "invariant holds: orders in SQLite = messages in topic = credits granted = 1"]

    lines.clear()
    lost = Tally(resolutions={1: Resolution("COMMIT", False)}, confirmed=[1], topic_order_ids=[], credit_order_ids=[])
    assert report(lost, plan, sent, [], CoordinatorConfig(), [], lines.append, "") == 1
    assert lines[-1] == "INVARIANT FAILED: orders in SQLite 1, messages in topic 0, credits granted 0"
