"""One consumer process of the chaos harness (``bench/chaos/consumers.py`` starts, kills -9 and restarts it): an
instance of the consumer group :data:`GROUP` on both chaos topics, applying each message's effect exactly once in
a SQLite database the group's instances share, the exactly-once way of :mod:`coordinator.consumer.exactly_once`.

- ``effects``: one row per message applied, with no key of its own (``msg_id``, ``topic``, ``keys``,
  ``topic_version``, ``queue_offset``, the process): an effect applied twice shows as two rows, and the rows'
  order (``rowid``) is the order the effects committed in;
- ``txcoord_consumed``: the listener's record of what it applied, in the same transaction as the effect;
- ``--deliveries``: every delivery appended first (``msg_id`` a line), unbuffered, so that what a kill made the
  group deliver again shows.

Every message of the kind :data:`FAILING_KIND` (its tag) fails, every time: each must end as one dead letter,
never applied. Settings (:data:`SETTINGS`) are short, so that retries and dead letters happen within the run.

    python -m bench.chaos.consumer --config chaos.toml --db consumers.db --deliveries consumer-0.deliveries

Runs until SIGTERM (then closes the consumer, its calls finished and its progress saved, and exits 0).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import threading

from bench.chaos.producer import AUDIT_TOPIC, KIND_UNKNOWN_COMMIT, ORDER_TOPIC, stopped_by_signals
from coordinator import CoordinatorConfig, TopicConsumer
from coordinator.consumer.exactly_once import TransactionalListener

__all__ = ["FAILING_KIND", "GROUP", "SETTINGS", "SHARES", "TOPICS", "create_effects", "fails_always"]

GROUP = "chaos_consumers"
TOPICS = (ORDER_TOPIC, AUDIT_TOPIC)
#: Shares a topic is split into: a few, so that two instances each hold some and the run stays light.
SHARES = 4
#: Every message of this kind fails, every attempt: a kind every plan has (each kind at least once).
FAILING_KIND = KIND_UNKNOWN_COMMIT
#: Short timings: a dead instance's shares move within three heartbeats (3 s), a failing message is a dead letter
#: after its third attempt, a second or so after its first.
SETTINGS = {"consumer_heartbeat_ms": 1000, "consumer_commit_interval_ms": 1000, "consumer_max_attempts": 3,
            "consumer_retry_delays_ms": (200, 500), "consumer_threads": 4}
_LOCK_TIMEOUT_S = 60


def fails_always(tags: str) -> bool:
    """Whether the listener fails every delivery of a message with ``tags`` (its planned transaction's kind)."""
    return tags == FAILING_KIND


def create_effects(db: str) -> None:
    with sqlite3.connect(db, timeout=_LOCK_TIMEOUT_S) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS effects (msg_id TEXT NOT NULL, topic TEXT NOT NULL, keys TEXT, "
                           "topic_version INTEGER NOT NULL, queue_offset INTEGER NOT NULL, pid INTEGER NOT NULL)")


class Effects(TransactionalListener):
    """The effect: a row of ``effects``, in the transaction that records the message as applied."""

    def __init__(self, db: str, deliveries: str):
        super().__init__(lambda: sqlite3.connect(db, timeout=_LOCK_TIMEOUT_S), group=GROUP)
        self._deliveries = open(deliveries, "ab", buffering=0)
        self._deliveries_lock = threading.Lock()

    def apply(self, message, cursor) -> None:
        if fails_always(message.tags):
            raise RuntimeError(f"chaos: every message of kind {FAILING_KIND} fails")
        cursor.execute("INSERT INTO effects (msg_id, topic, keys, topic_version, queue_offset, pid) VALUES "
                       "(?, ?, ?, ?, ?, ?)", (message.msg_id, message.topic, message.keys, message.topic_version,
                                              message.queue_offset, os.getpid()))

    def consume(self, message):
        with self._deliveries_lock:
            self._deliveries.write(f"{message.msg_id}\n".encode())
        return super().consume(message)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--db", required=True, help="the group's SQLite database (effects and records)")
    parser.add_argument("--deliveries", required=True, help="every delivery appended here, a msg_id a line")
    args = parser.parse_args()
    stop = stopped_by_signals()
    create_effects(args.db)
    config = CoordinatorConfig.load(args.config, environ={}).replace(**SETTINGS)
    listener = Effects(args.db, args.deliveries)
    with TopicConsumer(GROUP, list(TOPICS), listener, config):
        stop.wait()
    listener.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
