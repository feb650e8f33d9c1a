"""A consumer process whose exactly-once listener can SIGKILL itself at one point of one message's handling:
what the kill -9 tests of :mod:`coordinator.consumer.exactly_once` restart again and again.

Each message's effect is a row ``(msg_id, body)`` in a table with no key of its own (SQLite, PostgreSQL or
Delta), so an effect applied twice shows as two rows. Every delivery is appended to ``--deliveries`` first
(one ``msg_id`` a line), so a test can tell that a message was delivered again.

Points (``--kill-at POINT --kill-body BODY``): ``before-effect``, ``after-effect`` (applied, not committed;
databases only: a Delta write is its commit) and ``after-commit`` (committed, the consumer not told).

Example::

    python -m support.exactly_once_worker --lakehouse L --backend sqlite --target credits.db \\
        --effects credits --deliveries deliveries.txt --kill-at after-commit --kill-body m3
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

POINTS = ("before-effect", "after-effect", "after-commit")


def listener(args):
    import pyarrow as pa

    from coordinator.consumer.exactly_once import DeltaTableListener, TransactionalListener

    def kill_at(point, message):
        if args.kill_at == point and message.body == args.kill_body.encode():
            os.kill(os.getpid(), signal.SIGKILL)

    deliveries = open(args.deliveries, "ab", buffering=0)

    def delivered(message):
        deliveries.write(f"{message.msg_id}\n".encode())

    if args.backend == "delta":
        class Effects(DeltaTableListener):
            def rows(self, message):
                kill_at("before-effect", message)
                return pa.table({"msg_id": [message.msg_id], "body": [message.body]})

            def consume(self, message):
                delivered(message)
                result = super().consume(message)
                kill_at("after-commit", message)
                return result

        return Effects(args.target, group=args.group)

    if args.backend == "sqlite":
        import sqlite3

        connect = lambda: sqlite3.connect(args.target, timeout=30)  # noqa: E731
        mark = "?"
    else:
        import psycopg

        connect = lambda: psycopg.connect(args.target)  # noqa: E731
        mark = "%s"

    class Effects(TransactionalListener):
        def apply(self, message, cursor):
            kill_at("before-effect", message)
            cursor.execute(f"INSERT INTO {args.effects} (msg_id, body) VALUES ({mark}, {mark})",
                           (message.msg_id, message.body))
            kill_at("after-effect", message)

        def consume(self, message):
            delivered(message)
            result = super().consume(message)
            kill_at("after-commit", message)
            return result

    return Effects(connect, group=args.group, table=args.records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lakehouse", required=True)
    parser.add_argument("--group", default="credits")
    parser.add_argument("--topic", default="ORDERS")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "delta"), required=True)
    parser.add_argument("--target", required=True, help="the SQLite file, PostgreSQL DSN or Delta table")
    parser.add_argument("--effects", default="effects", help="the effects table (SQLite, PostgreSQL)")
    parser.add_argument("--records", default="txcoord_consumed", help="the record table (SQLite, PostgreSQL)")
    parser.add_argument("--deliveries", required=True)
    parser.add_argument("--kill-at", choices=POINTS)
    parser.add_argument("--kill-body", default="")
    args = parser.parse_args()

    from coordinator import CoordinatorConfig, TopicConsumer

    config = CoordinatorConfig(lakehouse=args.lakehouse, consumer_heartbeat_ms=1000, consumer_poll_interval_ms=5,
                               consumer_commit_interval_ms=1, consumer_threads=2, consumer_retry_delays_ms=(100,))
    with TopicConsumer(args.group, [args.topic], listener(args), config):
        threading.Event().wait()  # until killed


if __name__ == "__main__":
    main()
