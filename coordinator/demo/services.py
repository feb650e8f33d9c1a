"""The two services of the demo (docs/design.md#the-problem): an order service on SQLite, and the credits table.

The order service keeps orders in its own SQLite database and announces each one
on ``ORDER_TOPIC`` with a transactional message. Each demo order has a *fate*,
fixed in advance from its index, that decides how its local transaction goes —
so every path of the protocol is walked, the same way on every run.

The credits service grants points in its own SQLite database (:class:`CreditStore`) from a consumer
group, with no Spark (:mod:`coordinator.demo.credits`); its database and points rule live here, so the
demo reads its results directly.

Example::

    store = OrderStore("demo-lakehouse/orders.db")
    store.create()
    listener = OrderListener(store)
    orders = make_orders(12)          # orders[i].fate: Fate.COMMIT, Fate.DECLINED, ...
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import random
import sqlite3
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from coordinator.producer.listener import TransactionListener
from coordinator.producer.message import Message
from coordinator.protocol import LocalTransactionState, Outcome

ORDER_TOPIC = "ORDER_TOPIC"
ORDER_GROUP = "order_group"
#: Seed of the default demo plan; the same seed gives the same orders and fates.
DEFAULT_SEED = 7

CONFIRMED = "confirmed"
MANUAL_REVIEW = "manual_review"

#: The credits service's consumer group (:mod:`coordinator.demo.credits`).
CREDITS_GROUP = "credits"


class Fate(enum.Enum):
    """How a demo order's local transaction goes, and how the protocol must end it."""

    #: Inserted and committed; the producer reports COMMIT.
    COMMIT = "commit"
    #: Payment declined inside the transaction: the insert is rolled back; the producer reports ROLLBACK.
    DECLINED = "declined"
    #: Committed in SQLite, then the service "crashes" before reporting (UNKNOW): check-back finds it, COMMIT.
    CRASH_AFTER_COMMIT = "crash_after_commit"
    #: "Crashes" before reaching the database (UNKNOW): check-back finds no order, ROLLBACK.
    CRASH_BEFORE_DB = "crash_before_db"
    #: Held for manual review: every check-back answers UNKNOW, so the coordinator discards it.
    STUCK = "stuck"

    @property
    def expected_outcome(self) -> str:
        """The op-queue outcome this fate must end in: ``COMMIT``, ``ROLLBACK`` or ``DISCARD``.

        Example::

            Fate.CRASH_AFTER_COMMIT.expected_outcome  # 'COMMIT'
        """
        return {
            Fate.COMMIT: Outcome.COMMIT,
            Fate.CRASH_AFTER_COMMIT: Outcome.COMMIT,
            Fate.DECLINED: Outcome.ROLLBACK,
            Fate.CRASH_BEFORE_DB: Outcome.ROLLBACK,
            Fate.STUCK: Outcome.DISCARD,
        }[self]


#: Smallest demo that still walks every path (one order per fate).
MIN_ORDERS = len(Fate)
_CUSTOMERS = ("ada", "grace", "linus", "barbara", "edsger", "margaret", "alan", "frances")


@dataclass(frozen=True)
class Order:
    """One demo order and what will happen to it."""

    order_id: int
    customer: str
    amount: float
    fate: Fate

    def body(self) -> bytes:
        """The message body: the order as JSON.

        Example::

            Order(1, "ada", 12.5, Fate.COMMIT).body()  # b'{"order_id": 1, "customer": "ada", "amount": 12.5}'
        """
        return json.dumps({"order_id": self.order_id, "customer": self.customer, "amount": self.amount}).encode()

    def message(self) -> Message:
        """The "order created" message announcing this order."""
        return Message(ORDER_TOPIC, self.body(), keys=f"order-{self.order_id}", tags="created")


def plan_fates(count: int, seed: int = DEFAULT_SEED) -> list[Fate]:
    """The fate of each of ``count`` orders: every fate at least once, mostly commits.

    One or two orders get stuck (two from 30 orders on); the rest are drawn with a
    seeded RNG, so a plan is the same on every run.

    Example::

        plan_fates(5)  # each Fate once, in a seeded order
    """
    if count < MIN_ORDERS:
        raise ValueError(f"at least {MIN_ORDERS} orders are needed to walk every path, got {count}")
    rng = random.Random(seed)
    stuck = 2 if count >= 30 else 1
    fates = [Fate.COMMIT, Fate.DECLINED, Fate.CRASH_AFTER_COMMIT, Fate.CRASH_BEFORE_DB] + [Fate.STUCK] * stuck
    drawable = [Fate.COMMIT, Fate.DECLINED, Fate.CRASH_AFTER_COMMIT, Fate.CRASH_BEFORE_DB]
    fates += rng.choices(drawable, weights=[70, 10, 10, 10], k=count - len(fates))
    rng.shuffle(fates)
    return fates


def make_orders(count: int, seed: int = DEFAULT_SEED) -> list[Order]:
    """``count`` orders, ids 1..count, with seeded customers, amounts and fates.

    Example::

        [o.order_id for o in make_orders(5)]  # [1, 2, 3, 4, 5]
    """
    fates = plan_fates(count, seed)
    # A separate stream from the fates', so changing the fate rules keeps the amounts.
    rng = random.Random(seed * 1_000_003 + 1)
    return [
        Order(index + 1, rng.choice(_CUSTOMERS), round(rng.uniform(5, 250), 2), fate)
        for index, fate in enumerate(fates)
    ]


def points_for(amount: float) -> int:
    """Loyalty points for an order: one per whole currency unit.

    Example::

        points_for(12.99)  # 12
    """
    return math.floor(amount)


class PaymentDeclined(Exception):
    """Raised inside the order's local transaction to roll it back."""


class OrderStore:
    """The order service's own database: a SQLite file with an ``orders`` table.

    Each call opens its own connection, so the producer's threads and the
    check-back worker's pool can use one store at once.

    Example::

        store = OrderStore("orders.db")
        store.create()
        with store.transaction() as db:
            store.insert(db, order, CONFIRMED)
        store.status_of(order.order_id)  # 'confirmed'
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def create(self) -> None:
        """Create the ``orders`` table if missing. ``status`` is ``confirmed`` or ``manual_review``."""
        with self.transaction() as db:
            db.execute(
                """CREATE TABLE IF NOT EXISTS orders (
                       order_id   INTEGER PRIMARY KEY,
                       customer   TEXT NOT NULL,
                       amount     REAL NOT NULL CHECK (amount > 0),
                       status     TEXT NOT NULL CHECK (status IN ('confirmed', 'manual_review')),
                       created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                   )"""
            )

    def transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A connection inside one SQLite transaction (:func:`sqlite_transaction`).

        Example::

            with store.transaction() as db:
                db.execute("DELETE FROM orders")
        """
        return sqlite_transaction(self.path, timeout_s=30)

    @staticmethod
    def insert(db: sqlite3.Connection, order: Order, status: str) -> None:
        """Insert ``order`` with ``status`` on ``db`` (inside a :meth:`transaction`)."""
        db.execute(
            "INSERT INTO orders (order_id, customer, amount, status) VALUES (?, ?, ?, ?)",
            (order.order_id, order.customer, order.amount, status),
        )

    def status_of(self, order_id: int) -> Optional[str]:
        """The order's status, or ``None`` if the database never saw it.

        Example::

            store.status_of(404)  # None
        """
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db:
            row = db.execute("SELECT status FROM orders WHERE order_id = ?", (order_id,)).fetchone()
        return None if row is None else row[0]

    def order_ids(self, status: str = CONFIRMED) -> list[int]:
        """Ids of the orders with ``status``, ascending.

        Example::

            store.order_ids()  # the confirmed orders: [1, 2, 5, ...]
        """
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db:
            return [row[0] for row in db.execute("SELECT order_id FROM orders WHERE status = ? ORDER BY order_id", (status,))]


def sqlite_connection(path: str, timeout_s: float) -> sqlite3.Connection:
    """A connection to the SQLite database at ``path``, waiting up to ``timeout_s`` for a lock, in WAL mode (so
    check-back reads run while a local transaction writes), with no transaction of its own: its transactions
    are exactly the ``BEGIN`` … ``COMMIT`` its user issues.

    Example::

        with contextlib.closing(sqlite_connection("orders.db", timeout_s=30)) as db:
            db.execute("SELECT count(*) FROM orders").fetchone()
    """
    db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
    except BaseException:
        db.close()
        raise
    return db


@contextlib.contextmanager
def sqlite_transaction(path: str, timeout_s: float) -> Iterator[sqlite3.Connection]:
    """A connection (:func:`sqlite_connection`) inside one SQLite transaction: committed when the block ends,
    rolled back on any exception. A service's local transaction, as the demo's and the chaos harness's
    producers run theirs.

    Example::

        with sqlite_transaction("orders.db", timeout_s=30) as db:
            db.execute("DELETE FROM orders")
    """
    with contextlib.closing(sqlite_connection(path, timeout_s)) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


class OrderListener(TransactionListener):
    """The order service's local transaction and its answer to check-backs.

    ``execute_local_transaction(msg, order)`` plays out ``order.fate``;
    ``check_local_transaction`` looks the order up in SQLite, as a real service
    would: confirmed → COMMIT, absent → ROLLBACK, held for review → UNKNOW.

    Example::

        producer = TransactionProducer(ORDER_GROUP, OrderListener(store), config).start()
        producer.send_message_in_transaction(order.message(), order)
    """

    def __init__(self, store: OrderStore) -> None:
        self.store = store

    def execute_local_transaction(self, msg: Message, order: Any) -> LocalTransactionState:
        if order.fate is Fate.CRASH_BEFORE_DB:
            return LocalTransactionState.UNKNOW  # died before the database saw anything
        status = MANUAL_REVIEW if order.fate is Fate.STUCK else CONFIRMED
        try:
            with self.store.transaction() as db:
                self.store.insert(db, order, status)
                if order.fate is Fate.DECLINED:
                    raise PaymentDeclined(f"order {order.order_id}: payment declined")
        except PaymentDeclined:
            return LocalTransactionState.ROLLBACK_MESSAGE  # the insert was rolled back with the transaction
        if order.fate in (Fate.CRASH_AFTER_COMMIT, Fate.STUCK):
            # Committed locally, but the outcome never reaches the coordinator as a decision.
            return LocalTransactionState.UNKNOW
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        status = self.store.status_of(order_id_of(msg.body))
        if status == CONFIRMED:
            return LocalTransactionState.COMMIT_MESSAGE
        if status is None:
            return LocalTransactionState.ROLLBACK_MESSAGE
        return LocalTransactionState.UNKNOW  # held for manual review: this service cannot decide


def order_id_of(body: bytes) -> int:
    """The order id in a message body.

    Example::

        order_id_of(b'{"order_id": 7, "customer": "ada", "amount": 9.5}')  # 7
    """
    return int(json.loads(body)["order_id"])


class CreditStore:
    """The credits service's SQLite database: one row per credit granted (no key of its own, so a credit
    granted twice shows as two rows), beside the exactly-once listener's record table.

    Example::

        store = CreditStore("demo-lakehouse/credits.db")
        store.create()
        store.credits()   # [{'order_id': 7, 'customer': 'ada', 'points': 12}, ...]
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def create(self) -> None:
        """Create the credits table if absent.

        Example::

            CreditStore("credits.db").create()
        """
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db, db:
            db.execute("CREATE TABLE IF NOT EXISTS credits (order_id INTEGER NOT NULL, customer TEXT NOT NULL, "
                       "points INTEGER NOT NULL, msg_id TEXT NOT NULL, queue_offset INTEGER NOT NULL)")

    def credits(self) -> list[dict]:
        """Every credit granted, in the order granted; ``[]`` before the service made its table.

        Example::

            sum(c["points"] for c in store.credits())   # 1234
        """
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db:
            try:
                rows = db.execute("SELECT order_id, customer, points FROM credits ORDER BY rowid").fetchall()
            except sqlite3.OperationalError:  # no table yet: the service has not started
                return []
        return [{"order_id": order_id, "customer": customer, "points": points} for order_id, customer, points in rows]
