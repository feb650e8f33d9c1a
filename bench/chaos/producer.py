"""One producer process of the chaos harness (``bench/chaos/run.py`` starts, kills and restarts it).

It owns a SQLite database, its local store and the harness's ground truth:

- ``orders``: the business rows its local transactions commit, one per transaction that
  committed locally (``status`` ``committed``, or ``review`` for one that can never be
  decided); ``order_messages``: the messages each of them announced. Check-backs answer
  from these tables, exactly as a real service would.
- ``attempts``: one row per planned transaction this process started to send, written
  before the send; ``transaction_id`` and ``returned_state`` are filled in only if the
  send returned. A row without them is a send in flight, or, once a restarted process has
  marked it ``INTERRUPTED``, one cut short by a kill.

Each transaction of the plan has a *kind* that decides how its local transaction goes.
Sends are paced over the run's sending window, from several threads so that halves are
group-committed; a restarted process skips what was already attempted and catches up.
With ``--hold-after N`` it starts no send once N are attempted (its earlier runs' included) and
waits there, answering check-backs, for the harness's kill: so the kill the harness planned after
the N-th send always finds this process with sends left, however late it started.

    python -m bench.chaos.producer --config chaos.toml --index 0 --plan plan-0.json \
        --db producer-0.db --start-at 1790000000.0 --send-seconds 30

Runs until SIGTERM (then shuts the producer down and exits 0), answering check-backs
after its last send.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from coordinator import CoordinatorConfig, LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.demo.services import sqlite_connection, sqlite_transaction
from coordinator.exceptions import HalfNotStoredError, HalfOutcomeUnknownError

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)

#: Kinds of planned transaction: how the local transaction goes.
KIND_COMMIT = "commit"
KIND_ROLLBACK = "rollback"
KIND_UNKNOWN_COMMIT = "unknown_then_commit"  # committed locally, outcome not reported: the check says COMMIT
KIND_UNKNOWN_ROLLBACK = "unknown_then_rollback"  # never reached the database: the check says ROLLBACK
KIND_UNKNOWN_FOREVER = "unknown_forever"  # held for review: every check says UNKNOW, so it is discarded
KIND_RAISES = "listener_raises"  # execute_local_transaction raises inside the SQLite transaction
KIND_MULTI = "multi_topic_commit"  # three messages in two topics, one local transaction
KINDS = (KIND_COMMIT, KIND_ROLLBACK, KIND_UNKNOWN_COMMIT, KIND_UNKNOWN_ROLLBACK, KIND_UNKNOWN_FOREVER, KIND_RAISES,
         KIND_MULTI)

#: How long a connection waits for another's lock: the harness's threads and processes share one database.
_LOCK_TIMEOUT_S = 60
#: A chaos process's main thread, waiting for SIGTERM, wakes this often (:func:`wait_for_signal`).
_WAKE_S = 0.5

ORDER_TOPIC = "CHAOS_ORDERS"
AUDIT_TOPIC = "CHAOS_AUDIT"
#: Topics of a multi-topic transaction's messages, in order.
MULTI_TOPICS = (ORDER_TOPIC, ORDER_TOPIC, AUDIT_TOPIC)

COMMITTED = "committed"
REVIEW = "review"
HALF_NOT_STORED = "HALF_NOT_STORED"
#: The storage never said whether the half was stored (HalfOutcomeUnknownError): local transaction not run.
HALF_OUTCOME_UNKNOWN = "HALF_OUTCOME_UNKNOWN"
INTERRUPTED = "INTERRUPTED"

SENDER_THREADS = 4
#: Distinct message keys over a run.
KEYS = 5


def group_of(index: int) -> str:
    """The producer group of producer process ``index``: one group per process, so that each
    check-back reaches the process whose database holds the answer."""
    return f"chaos_p{index}"


def body_of(plan_id: str, message_index: int) -> bytes:
    """A message body names its planned transaction, so the harness can map any half back to it.

    Example::

        plan_id_of(body_of("p0-00042", 1))  # 'p0-00042'
    """
    return f"{plan_id}:{message_index}".encode()


def key_of(plan_id: str) -> str:
    """The ``keys`` of a planned transaction's messages: one of :data:`KEYS`, shared by many transactions of every
    producer, so that the consumer group's per-key order (:mod:`bench.chaos.consumers`) is put to the test.

    Example::

        key_of("p1-00042")  # 'customer-2'
    """
    return f"customer-{int(plan_id.rsplit('-', 1)[1]) % KEYS}"


def plan_id_of(body: bytes) -> str:
    return bytes(body).decode(errors="replace").rsplit(":", 1)[0]


@dataclass(frozen=True)
class Planned:
    """One planned transaction."""

    plan_id: str
    kind: str

    def messages(self) -> list[Message]:
        topics = MULTI_TOPICS if self.kind == KIND_MULTI else (ORDER_TOPIC,)
        return [Message(topic, body_of(self.plan_id, index), keys=key_of(self.plan_id), tags=self.kind)
                for index, topic in enumerate(topics)]


class Store:
    """The producer's SQLite database; each call opens its own connection, so threads can share it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def connect(self) -> sqlite3.Connection:
        return sqlite_connection(self.path, _LOCK_TIMEOUT_S)

    def transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One SQLite transaction (:func:`coordinator.demo.services.sqlite_transaction`)."""
        return sqlite_transaction(self.path, _LOCK_TIMEOUT_S)

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query in the block sees the same state, and no writer is held up."""
        with contextlib.closing(self.connect()) as db:
            db.execute("BEGIN DEFERRED")
            try:
                yield db
            finally:
                db.execute("ROLLBACK")

    def create(self) -> None:
        with self.transaction() as db:
            db.execute("""CREATE TABLE IF NOT EXISTS orders (
                              transaction_id TEXT PRIMARY KEY,
                              plan_id        TEXT NOT NULL UNIQUE,
                              kind           TEXT NOT NULL,
                              status         TEXT NOT NULL CHECK (status IN ('committed', 'review')))""")
            db.execute("""CREATE TABLE IF NOT EXISTS order_messages (
                              msg_id         TEXT PRIMARY KEY,
                              transaction_id TEXT NOT NULL REFERENCES orders (transaction_id),
                              topic          TEXT NOT NULL,
                              body           BLOB NOT NULL)""")
            db.execute("""CREATE TABLE IF NOT EXISTS attempts (
                              plan_id        TEXT PRIMARY KEY,
                              kind           TEXT NOT NULL,
                              transaction_id TEXT,
                              returned_state TEXT)""")

    def mark_interrupted(self) -> int:
        """Mark the sends a killed predecessor left in flight; return how many."""
        with self.transaction() as db:
            return db.execute("UPDATE attempts SET returned_state = ? WHERE returned_state IS NULL",
                              (INTERRUPTED,)).rowcount

    def sends_in_flight(self) -> int:
        with contextlib.closing(self.connect()) as db:
            return db.execute("SELECT count(*) FROM attempts WHERE returned_state IS NULL").fetchone()[0]

    def attempts(self) -> int:
        """How many sends were attempted, by every run of the process."""
        with contextlib.closing(self.connect()) as db:
            return db.execute("SELECT count(*) FROM attempts").fetchone()[0]

    def attempted(self) -> set[str]:
        with contextlib.closing(self.connect()) as db:
            return {row[0] for row in db.execute("SELECT plan_id FROM attempts")}

    def record_attempt(self, planned: Planned) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO attempts (plan_id, kind) VALUES (?, ?)", (planned.plan_id, planned.kind))

    def record_return(self, plan_id: str, transaction_id: Optional[str], state: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE attempts SET transaction_id = ?, returned_state = ? WHERE plan_id = ?",
                       (transaction_id, state, plan_id))

    def status_of(self, transaction_id: str) -> Optional[str]:
        with contextlib.closing(self.connect()) as db:
            row = db.execute("SELECT status FROM orders WHERE transaction_id = ?", (transaction_id,)).fetchone()
        return None if row is None else row[0]


class LocalRollback(Exception):
    """Raised inside a local transaction of kind ``rollback`` to undo it."""


class ListenerFailure(Exception):
    """Raised out of ``execute_local_transaction`` by kind ``listener_raises``."""


class ChaosListener(TransactionListener):
    """Plays each planned transaction's kind against SQLite, and answers checks from SQLite."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def execute_local_transaction(self, msg, planned: Planned) -> LocalTransactionState:
        if planned.kind == KIND_UNKNOWN_ROLLBACK:
            return UNKNOW  # "crashed" before reaching the database
        messages = msg if isinstance(msg, list) else [msg]
        status = REVIEW if planned.kind == KIND_UNKNOWN_FOREVER else COMMITTED
        try:
            with self.store.transaction() as db:
                db.execute("INSERT INTO orders (transaction_id, plan_id, kind, status) VALUES (?, ?, ?, ?)",
                           (messages[0].transaction_id, planned.plan_id, planned.kind, status))
                db.executemany("INSERT INTO order_messages (msg_id, transaction_id, topic, body) VALUES (?, ?, ?, ?)",
                               [(m.msg_id, m.transaction_id, m.topic, m.body) for m in messages])
                if planned.kind == KIND_ROLLBACK:
                    raise LocalRollback(planned.plan_id)
                if planned.kind == KIND_RAISES:
                    raise ListenerFailure(f"{planned.plan_id}: the local transaction failed")
        except LocalRollback:
            return ROLLBACK
        return UNKNOW if planned.kind in (KIND_UNKNOWN_COMMIT, KIND_UNKNOWN_FOREVER) else COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        status = self.store.status_of(msg.transaction_id)
        if status == COMMITTED:
            return COMMIT
        return UNKNOW if status == REVIEW else ROLLBACK


def send_plan(producer: TransactionProducer, store: Store, plan: list[Planned], start_at: float,
              send_seconds: float, stop: threading.Event, hold_after: Optional[int] = None) -> None:
    """Send every planned transaction not yet attempted, each no earlier than its slot in the window,
    until ``stop`` is set; with ``hold_after``, start no send once that many are attempted (waiting
    for ``stop``)."""
    attempted = store.attempted()
    slots = [(start_at + position * send_seconds / len(plan), planned)
             for position, planned in enumerate(plan) if planned.plan_id not in attempted]
    started = len(attempted)
    lock = threading.Lock()

    def sender() -> None:
        nonlocal started
        while True:
            with lock:
                if not slots:
                    return
                if hold_after is not None and started >= hold_after:
                    stop.wait()
                    return
                due, planned = slots.pop(0)
                started += 1
            if stop.wait(max(0.0, due - time.time())):
                return
            store.record_attempt(planned)
            try:
                messages = planned.messages()
                if planned.kind == KIND_MULTI:
                    result = producer.send_messages_in_transaction(messages, planned)
                else:
                    result = producer.send_message_in_transaction(messages[0], planned)
            except HalfNotStoredError:
                store.record_return(planned.plan_id, None, HALF_NOT_STORED)
                continue
            except HalfOutcomeUnknownError as unknown:
                store.record_return(planned.plan_id, unknown.transaction_id, HALF_OUTCOME_UNKNOWN)
                continue
            store.record_return(planned.plan_id, result.transaction_id, result.local_transaction_state.value)

    threads = [threading.Thread(target=sender, name=f"sender-{n}") for n in range(SENDER_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def stopped_by_signals() -> threading.Event:
    """A chaos process's start: warnings logged to its log (stderr), and an event SIGTERM or SIGINT sets."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(threadName)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def wait_for_signal(stop: threading.Event) -> None:
    """In the main thread, until SIGTERM or SIGINT set ``stop``. Woken every :data:`_WAKE_S`: Python runs a signal's
    handler in the main thread, once that thread runs Python code again, and the kernel may hand the signal to
    another thread (a SIGTERM right after a SIGCONT, say), which leaves a wait with no timeout asleep for good."""
    while not stop.wait(_WAKE_S):
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--plan", required=True, help="JSON list of [plan_id, kind]")
    parser.add_argument("--db", required=True)
    parser.add_argument("--start-at", type=float, required=True, help="epoch seconds the sending window opens")
    parser.add_argument("--send-seconds", type=float, required=True)
    parser.add_argument("--done-file", required=True, help="created once every planned send was attempted")
    parser.add_argument("--hold-after", type=int, help="start no send once this many are attempted (then wait for a kill)")
    args = parser.parse_args()
    stop = stopped_by_signals()
    store = Store(args.db)
    store.create()
    store.mark_interrupted()
    plan = [Planned(plan_id, kind) for plan_id, kind in json.loads(Path(args.plan).read_text())]
    config = CoordinatorConfig.load(args.config, environ={})
    with TransactionProducer(group_of(args.index), ChaosListener(store), config) as producer:
        send_plan(producer, store, plan, args.start_at, args.send_seconds, stop, args.hold_after)
        if not stop.is_set():
            Path(args.done_file).touch()
        wait_for_signal(stop)  # keep answering check-backs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
