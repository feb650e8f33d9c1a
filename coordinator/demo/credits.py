"""The credits service: grants loyalty points for every order announced on ``ORDER_TOPIC``, with no Spark.

An instance of consumer group ``credits`` (:class:`~coordinator.consumer.TopicConsumer`) hands each committed
order to :class:`CreditsListener`, a :class:`~coordinator.consumer.exactly_once.TransactionalListener` on the
service's own SQLite database (:class:`~coordinator.demo.services.CreditStore`): the credit row and the
message's id are one local transaction, so an order delivered again (after a ``kill -9``, which the demo
does once) grants nothing twice.

Run it with Python; SIGTERM or SIGINT stops it gracefully (the calls under way finish, progress is saved,
then exit 0)::

    python -m coordinator.demo.credits --config demo-lakehouse/demo.toml --db demo-lakehouse/credits.db

The group must be granted the topic first (``txcoord add-consumer-group credits --topics ORDER_TOPIC``; the
demo does it).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sqlite3
import sys
import threading
import time
from typing import Optional

from coordinator.config import CoordinatorConfig
from coordinator.consumer import ConsumedMessage, TopicConsumer
from coordinator.consumer.exactly_once import TransactionalListener
from coordinator.demo.services import CREDITS_GROUP, ORDER_TOPIC, CreditStore, points_for
from coordinator.lakehouse import Lakehouse

__all__ = ["CreditsListener", "main", "wait_for_table"]

log = logging.getLogger("credits")


class CreditsListener(TransactionalListener):
    """Inserts one credit per order into the :class:`CreditStore` at ``db``, exactly once per message; a body
    that is not an order is recorded as handled and grants nothing.

    Example::

        listener = CreditsListener("demo-lakehouse/credits.db")
        with TopicConsumer(CREDITS_GROUP, [ORDER_TOPIC], listener, config):
            ...
    """

    def __init__(self, db: str):
        super().__init__(lambda: sqlite3.connect(db, timeout=30), group=CREDITS_GROUP)

    def apply(self, message: ConsumedMessage, cursor) -> None:
        """Insert the order's credit with ``cursor`` (the transaction that records the message).

        Example::

            listener.apply(message, cursor)   # one row in credits: order 7, ada, 12 points
        """
        try:
            order = json.loads(message.body)
            order_id, customer, amount = int(order["order_id"]), str(order["customer"]), float(order["amount"])
        except (ValueError, KeyError, TypeError):
            log.warning("message %s is not an order; nothing granted", message.msg_id)
            return
        cursor.execute("INSERT INTO credits (order_id, customer, points, msg_id, queue_offset) VALUES (?, ?, ?, ?, ?)",
                       (order_id, customer, points_for(amount), message.msg_id, message.queue_offset))
        log.info("order %d: %d points to %s (message %s, attempt %d)", order_id, points_for(amount), customer,
                 message.msg_id, message.delivery_attempt)


def wait_for_table(lakehouse: Lakehouse, table: str, give_up: threading.Event, timeout_s: Optional[float] = None) -> bool:
    """Wait until ``table`` (a path in ``lakehouse``) is a Delta table: a topic's appears on its first delivery.
    ``False`` if ``give_up`` is set or ``timeout_s`` passes first.

    Example::

        wait_for_table(Lakehouse("lh"), "topics/ORDER_TOPIC", threading.Event(), 30)   # True once it exists
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not lakehouse.exists(table):
        if give_up.is_set() or (deadline is not None and time.monotonic() > deadline):
            return False
        give_up.wait(0.5)
    return True


def main(argv: list[str] | None = None) -> int:
    """Run the credits service until SIGTERM or SIGINT; the exit code.

    Example::

        main(["--config", "demo-lakehouse/demo.toml", "--db", "demo-lakehouse/credits.db"])
    """
    parser = argparse.ArgumentParser(prog="credits", description="Grant loyalty points for the orders on ORDER_TOPIC.")
    parser.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    parser.add_argument("--db", required=True, help="the service's SQLite database (created if absent)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    config = CoordinatorConfig.load(args.config)
    CreditStore(args.db).create()
    lakehouse = Lakehouse.of(config)
    log.info("waiting for %s", lakehouse.topic(ORDER_TOPIC))
    if not wait_for_table(lakehouse, f"topics/{ORDER_TOPIC}", stop):
        return 0
    listener = CreditsListener(args.db)
    with TopicConsumer(CREDITS_GROUP, [ORDER_TOPIC], listener, config):
        log.info("credits service consuming %s as group %s", ORDER_TOPIC, CREDITS_GROUP)
        # Woken twice a second: a SIGTERM the kernel hands to another thread runs its handler only when this
        # thread next runs Python, which a wait with no timeout never does.
        while not stop.wait(0.5):
            pass
    listener.close()
    log.info("credits service stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
