"""``python -m coordinator demo`` end to end: the real checker job, the credits job, SQLite.

One demo run (12 orders, every fate at least once) is shared by the tests of this
module; each checks one promise against the resulting tables and database, not
against the printout. Marked ``slow`` (about two minutes); it runs in ``make test``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from coordinator.demo import read_table
from coordinator.demo_services import CREDITS, ORDER_TOPIC, Fate, make_orders, order_id_of, points_for
from coordinator.spark import PROJECT_ROOT
from coordinator.tables import CHECK_REQUESTS, DISCARDED, HALF, OP, topic_path

pytestmark = pytest.mark.slow

ORDERS = 12
CHECK_MAX = 3  # the demo's transaction_check_max
PLAN = {order.order_id: order for order in make_orders(ORDERS)}


def rows(path: str, *columns: str) -> list[dict]:
    return read_table(path, list(columns)).to_pylist()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Run the demo once; yield ``(lakehouse, completed process, seconds)``."""
    lakehouse = tmp_path_factory.mktemp("demo") / "lakehouse"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXCOORD_")}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", "--lakehouse", str(lakehouse), "--orders", str(ORDERS),
         "--timeout", "240"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=420,
    )
    return lakehouse, result, time.monotonic() - started


@pytest.fixture(scope="module")
def order_of_transaction(demo) -> dict[str, int]:
    lakehouse, _, _ = demo
    return {row["transaction_id"]: order_id_of(row["body"]) for row in rows(HALF.path(str(lakehouse)), "transaction_id", "body")}


def confirmed_in_sqlite(lakehouse: Path, status: str = "confirmed") -> list[int]:
    with sqlite3.connect(lakehouse / "orders.db") as db:
        return sorted(r[0] for r in db.execute("SELECT order_id FROM orders WHERE status = ?", (status,)))


def test_the_plan_walks_every_path():
    assert set(o.fate for o in PLAN.values()) == set(Fate)


def test_demo_exits_zero(demo):
    _, result, seconds = demo
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    print(f"demo with {ORDERS} orders took {seconds:.0f} s")


def test_orders_in_sqlite_equal_messages_in_topic_equal_credits(demo):
    lakehouse, _, _ = demo
    confirmed = confirmed_in_sqlite(lakehouse)
    in_topic = sorted(order_id_of(r["body"]) for r in rows(topic_path(str(lakehouse), ORDER_TOPIC), "body"))
    credited = sorted(r["order_id"] for r in rows(CREDITS.path(str(lakehouse)), "order_id"))
    # Lists, not sets: a duplicate delivery or a double credit must show.
    assert confirmed == in_topic == credited
    assert confirmed == sorted(o.order_id for o in PLAN.values() if o.fate.expected_outcome == "COMMIT")


def test_every_order_ends_as_its_fate_requires(demo, order_of_transaction):
    lakehouse, _, _ = demo
    outcome, by_check = {}, {}
    for row in rows(OP.path(str(lakehouse)), "transaction_id", "outcome", "check_id"):
        order_id = order_of_transaction[row["transaction_id"]]
        assert order_id not in outcome, f"order {order_id} resolved twice"
        outcome[order_id], by_check[order_id] = row["outcome"], row["check_id"] is not None
    assert outcome == {order_id: order.fate.expected_outcome for order_id, order in PLAN.items()}
    # Orders whose producer never decided can only have been decided by a check-back.
    undecided = {Fate.CRASH_AFTER_COMMIT, Fate.CRASH_BEFORE_DB}
    assert all(by_check[i] for i, order in PLAN.items() if order.fate in undecided)


def test_stuck_orders_are_checked_the_maximum_times_then_discarded(demo, order_of_transaction):
    lakehouse, _, _ = demo
    checks = Counter(order_of_transaction[r["transaction_id"]] for r in rows(CHECK_REQUESTS.path(str(lakehouse)), "transaction_id"))
    assert max(checks.values()) <= CHECK_MAX
    stuck = sorted(i for i, order in PLAN.items() if order.fate is Fate.STUCK)
    discarded = rows(DISCARDED.path(str(lakehouse)), "transaction_id", "check_times")
    assert sorted(order_of_transaction[r["transaction_id"]] for r in discarded) == stuck
    assert all(r["check_times"] == CHECK_MAX for r in discarded)
    assert all(checks[i] == CHECK_MAX for i in stuck)
    # Still in the order database, awaiting a human: never confirmed, never announced.
    assert confirmed_in_sqlite(lakehouse, "manual_review") == stuck


def test_credits_follow_the_points_rule(demo):
    lakehouse, _, _ = demo
    credits = {r["order_id"]: r["points"] for r in rows(CREDITS.path(str(lakehouse)), "order_id", "points")}
    assert credits and credits == {i: points_for(PLAN[i].amount) for i in credits}
