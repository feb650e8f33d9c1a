"""One consumer process of the chaos harness (``bench/chaos/consumers.py`` starts, kills -9, pauses and restarts
it): an instance of the consumer group :data:`GROUP` on both chaos topics, applying each message's effect exactly
once in a SQLite database the group's instances share, the exactly-once way of
:mod:`coordinator.consumer.exactly_once`.

- ``effects``: one row per message applied, with no key of its own (``msg_id``, ``topic``, ``keys``,
  ``topic_version``, ``queue_offset``, the process): an effect applied twice shows as two rows, and the rows'
  order (``rowid``) is the order the effects committed in;
- ``txcoord_consumed``: the listener's record of what it applied, in the same transaction as the effect;
- ``--calls``: every listener call, a JSON line at its start (wall time, pid, the message and where it was read)
  and one at its end (wall time, and whether it applied the effect, skipped a message applied already, or
  failed), appended unbuffered: what the verdict reads the calls' order and overlaps from, and what a kill made
  the group deliver again;
- the gaps the instance itself reports in its proof of holding its shares (``coordinator.consumer``'s warning
  that it "went N s without proving its hold", after a pause or a stall the harness did not make: a loaded
  machine starves a process too), a ``gap`` line each in the calls log;
- ``--pause-request``: a file the harness writes to have the process that makes the group's next call stop itself
  (SIGSTOP) inside it, before the call inserts its record or while it holds its transaction (the file says which),
  writing a ``pause`` line first; the harness sends SIGCONT.

Every message of the kind :data:`FAILING_KIND` (its tag) fails every delivery from its topic: each ends as a dead
letter. Redriven by an operator, it is applied if :func:`fixed_by_redrive` (the operator fixed what made it
fail), else it fails again and is a new dead letter. Settings (:data:`SETTINGS`) are short, so that retries, dead
letters and a paused instance's shares moving happen within the run.

    python -m bench.chaos.consumer --config chaos.toml --db consumers.db --calls consumer-0.calls \\
        --pause-request consumers.pause

Runs until SIGTERM (then closes the consumer, its calls finished and its progress saved, and exits 0).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

#: Set by SIGTERM or SIGINT from before the imports below (a second or more on a loaded machine): the harness may
#: stop a consumer it has just started, for a reset, and one stopped while importing must still end cleanly.
_STOP = threading.Event()
for _signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_signum, lambda *_: _STOP.set())

from bench.chaos.producer import AUDIT_TOPIC, KIND_UNKNOWN_COMMIT, ORDER_TOPIC, stopped_by_signals, wait_for_signal  # noqa: E402
from coordinator import CoordinatorConfig, TopicConsumer  # noqa: E402
from coordinator.consumer.exactly_once import TransactionalListener  # noqa: E402

__all__ = ["BEFORE_RECORD", "FAILING_KIND", "GROUP", "HOLDING_TRANSACTION", "SETTINGS", "SHARES", "TOPICS",
           "create_effects", "fails_from_topic", "fixed_by_redrive", "write_atomically"]

GROUP = "chaos_consumers"
TOPICS = (ORDER_TOPIC, AUDIT_TOPIC)
#: Shares a topic is split into: a few, so that two instances each hold some and the run stays light.
SHARES = 4
#: Every message of this kind fails, every attempt from its topic: a kind every plan has (each kind at least once).
FAILING_KIND = KIND_UNKNOWN_COMMIT
#: Short timings: a dead instance's shares move within three heartbeats (3 s), a failing message is a dead letter
#: after its third attempt, a second or so after its first.
SETTINGS = {"consumer_heartbeat_ms": 1000, "consumer_commit_interval_ms": 1000, "consumer_max_attempts": 3,
            "consumer_retry_delays_ms": (200, 500), "consumer_threads": 4}
#: Where in a call a requested pause stops the process: before the call inserts its record (the message not yet
#: claimed by this call), or inside its transaction (record and effect inserted, not committed: the database's
#: write lock held).
BEFORE_RECORD = "before its record"
HOLDING_TRANSACTION = "holding its transaction"
_LOCK_TIMEOUT_S = 60
#: How coordinator.consumer.membership words a gap in an instance's proof of its hold (its arguments: the instance,
#: the seconds since it last proved it).
_GAP_WARNING = "consumer %s went %.1f s without proving its hold"


def fails_from_topic(tags: str) -> bool:
    """Whether the listener fails every delivery from its topic of a message with ``tags`` (its planned kind)."""
    return tags == FAILING_KIND


def fixed_by_redrive(msg_id: str) -> bool:
    """Whether a message of the failing kind succeeds once an operator redrives it (about half of them, by a stable
    hash of the id); the others fail from the redrive table too, and are dead letters again."""
    return hashlib.blake2b(msg_id.encode(), digest_size=1).digest()[0] % 2 == 0


def _fails(message) -> bool:
    redriven = message.topic_version == -1
    return fails_from_topic(message.tags) and not (redriven and fixed_by_redrive(message.msg_id))


def create_effects(db: str) -> None:
    with sqlite3.connect(db, timeout=_LOCK_TIMEOUT_S) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS effects (msg_id TEXT NOT NULL, topic TEXT NOT NULL, keys TEXT, "
                           "topic_version INTEGER NOT NULL, queue_offset INTEGER NOT NULL, pid INTEGER NOT NULL)")


class Calls:
    """The process's calls log (see the module's docstring): a JSON line each, appended under a lock."""

    def __init__(self, path: str):
        self._file = open(path, "ab", buffering=0)
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self.pid = os.getpid()

    def start(self, message) -> int:
        number = next(self._numbers)
        self.write({"call": number, "pid": self.pid, "start": time.time(), "topic": message.topic,
                    "msg_id": message.msg_id, "keys": message.keys, "version": message.topic_version,
                    "offset": message.queue_offset, "attempt": message.delivery_attempt})
        return number

    def end(self, number: int, outcome: str) -> None:
        self.write({"call": number, "pid": self.pid, "end": time.time(), "outcome": outcome})

    def write(self, line: dict) -> None:
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        with self._lock:
            self._file.write(data)


class Gaps(logging.Handler):
    """Each gap the consumer reports in its proof of holding its shares, written to the calls log: when it renewed
    after it (``gap``, wall time) and how long it had gone without proof (``seconds``)."""

    def __init__(self, calls: Calls):
        super().__init__(logging.WARNING)
        self.calls = calls

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith(_GAP_WARNING) and len(record.args or ()) >= 2:
            self.calls.write({"gap": record.created, "pid": self.calls.pid, "seconds": record.args[1]})


class Effects(TransactionalListener):
    """The effect: a row of ``effects``, in the transaction that records the message as applied. Each call is
    logged (:class:`Calls`), and a pause the harness requested is made inside one."""

    def __init__(self, db: str, calls: Calls, pause_request: Path):
        super().__init__(lambda: sqlite3.connect(db, timeout=_LOCK_TIMEOUT_S), group=GROUP)
        self._calls, self._pause_request = calls, pause_request
        self._call = threading.local()

    def apply(self, message, cursor) -> None:
        if not _fails(message):
            cursor.execute("INSERT INTO effects (msg_id, topic, keys, topic_version, queue_offset, pid) VALUES "
                           "(?, ?, ?, ?, ?, ?)", (message.msg_id, message.topic, message.keys, message.topic_version,
                                                  message.queue_offset, os.getpid()))
        self._pause_if(HOLDING_TRANSACTION)
        if _fails(message):
            raise RuntimeError(f"chaos: every message of kind {FAILING_KIND} fails"
                               + (" from its topic" if fixed_by_redrive(message.msg_id) else ""))
        self._call.applied = True

    def consume(self, message):
        call = self._call
        call.number, call.applied, call.pause = self._calls.start(message), False, self._take_pause_request()
        outcome = "failed"
        try:
            self._pause_if(BEFORE_RECORD)
            result = super().consume(message)
            outcome = "applied" if call.applied else "skipped"
            return result
        finally:
            self._calls.end(call.number, outcome)
            if call.pause is not None:  # a message applied already never holds a transaction: the next call pauses
                write_atomically(self._pause_request, call.pause)

    def _take_pause_request(self):
        """The position of a pause the harness requested, taken by this call alone (a rename: one call wins)."""
        taken = self._pause_request.with_name(f"{self._pause_request.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            os.rename(self._pause_request, taken)
        except FileNotFoundError:
            return None
        position = taken.read_text().strip()
        taken.unlink()
        return position

    def _pause_if(self, position: str) -> None:
        call = self._call
        if call.pause != position:
            return
        call.pause = None
        self._calls.write({"pause": time.time(), "pid": self._calls.pid, "call": call.number, "at": position})
        os.kill(os.getpid(), signal.SIGSTOP)


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or not at all (a pause request: the harness writes it, a call may give it back)."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.new")
    temporary.write_text(text)
    os.replace(temporary, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--db", required=True, help="the group's SQLite database (effects and records)")
    parser.add_argument("--calls", required=True, help="every listener call's start and end appended here")
    parser.add_argument("--pause-request", required=True,
                        help="a pause inside the group's next call, when the harness writes it")
    args = parser.parse_args()
    stop = stopped_by_signals()
    if _STOP.is_set():  # stopped before the handlers above took over: nothing taken, nothing to hand back
        return 0
    create_effects(args.db)
    config = CoordinatorConfig.load(args.config, environ={}).replace(**SETTINGS)
    calls = Calls(args.calls)
    logging.getLogger("coordinator.consumer").addHandler(Gaps(calls))
    listener = Effects(args.db, calls, Path(args.pause_request))
    with TopicConsumer(GROUP, list(TOPICS), listener, config):
        wait_for_signal(stop)
    listener.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
