"""The exactly-once listeners (coordinator/consumer/exactly_once.py): an effect in SQLite, in a real PostgreSQL
server (Debian's, started for the session) and in a Delta table, applied once whatever is delivered again,
proven by a consumer process killed -9 at every point of a message's handling and restarted."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections import Counter

import pyarrow as pa
import pytest

from coordinator import ConsumeResult, ConsumedMessage, CoordinatorConfig
from coordinator.consumer.exactly_once import DeltaTableListener, TransactionalListener
from coordinator.consumer.group import ConsumerGroup, share_of
from coordinator.exceptions import IncompleteListenerError, InvalidArgumentError
from coordinator.lakehouse import Lakehouse
from support.consumers import TopicFeed, grant
from support.processes import Job, child_environment
from support.waiting import wait_until


def message(msg_id: str, body: bytes = b"x") -> ConsumedMessage:
    return ConsumedMessage(topic="ORDERS", msg_id=msg_id, transaction_id="t", keys="K", tags=None, body=body,
                           queue_offset=7, topic_version=3)


class Effects(TransactionalListener):
    """Inserts ``(msg_id, body)`` into ``effects`` (no key: twice is two rows); fails when the body says so."""

    mark = "?"

    def apply(self, message, cursor):
        cursor.execute(f"INSERT INTO effects (msg_id, body) VALUES ({self.mark}, {self.mark})",
                       (message.msg_id, message.body))
        if message.body == b"fail":
            raise RuntimeError("the effect's own check failed")


def sqlite_effects(path) -> Counter:
    with sqlite3.connect(path) as db:
        return Counter(dict(db.execute("SELECT msg_id, count(*) FROM effects GROUP BY msg_id").fetchall()))


@pytest.fixture
def sqlite_db(tmp_path):
    path = str(tmp_path / "service.db")
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (msg_id TEXT, body BLOB)")
    return path


def test_sqlite_applies_a_message_once_however_often_it_is_delivered(sqlite_db):
    listener = Effects(lambda: sqlite3.connect(sqlite_db), group="credits")
    assert listener.consume(message("m1")) is ConsumeResult.SUCCESS
    assert listener.consume(message("m1")) is ConsumeResult.SUCCESS
    assert listener.consume(message("m2")) is ConsumeResult.SUCCESS
    assert sqlite_effects(sqlite_db) == {"m1": 1, "m2": 1}
    assert listener.applied("m1") and not listener.applied("m3")
    with sqlite3.connect(sqlite_db) as db:
        assert db.execute("SELECT consumer_group, msg_id, topic, topic_version, queue_offset FROM txcoord_consumed "
                          "ORDER BY msg_id").fetchall() == [("credits", "m1", "ORDERS", 3, 7), ("credits", "m2", "ORDERS", 3, 7)]
    # Another group's record is its own: it applies the message too.
    other = Effects(lambda: sqlite3.connect(sqlite_db), group="audit")
    other.consume(message("m1"))
    assert sqlite_effects(sqlite_db) == {"m1": 2, "m2": 1}
    listener.close(), other.close()


def test_a_failed_effect_rolls_back_its_record_too_and_applies_when_delivered_again(sqlite_db):
    listener = Effects(lambda: sqlite3.connect(sqlite_db), group="credits")
    with pytest.raises(RuntimeError, match="own check failed"):
        listener.consume(message("m1", b"fail"))
    assert not listener.applied("m1") and sqlite_effects(sqlite_db) == {}
    listener.consume(message("m1", b"ok"))
    assert sqlite_effects(sqlite_db) == {"m1": 1}


def test_named_paramstyle_and_a_table_of_ones_own(sqlite_db):
    listener = Effects(lambda: sqlite3.connect(sqlite_db), group="credits", table="done_here", paramstyle="named")
    listener.consume(message("m1"))
    listener.consume(message("m1"))
    assert sqlite_effects(sqlite_db) == {"m1": 1} and listener.applied("m1")
    with sqlite3.connect(sqlite_db) as db:
        assert db.execute("SELECT count(*) FROM done_here").fetchone() == (1,)


def test_bad_connections_tables_and_listeners_are_refused(sqlite_db):
    autocommit = Effects(lambda: sqlite3.connect(sqlite_db, isolation_level=None), group="credits")
    with pytest.raises(InvalidArgumentError, match="autocommit"):
        autocommit.consume(message("m1"))
    with pytest.raises(InvalidArgumentError, match="SQL identifier"):
        Effects(lambda: sqlite3.connect(sqlite_db), group="credits", table="x; DROP TABLE effects")

    class Lazy(TransactionalListener):
        pass

    class LazyDelta(DeltaTableListener):
        pass

    with pytest.raises(IncompleteListenerError, match="apply"):
        Lazy(lambda: None, group="g")
    with pytest.raises(IncompleteListenerError, match="rows"):
        LazyDelta("t", group="g")


@pytest.fixture
def pg_tables(postgres):
    """Effects and record tables of this test's own on the session's PostgreSQL server: (dsn, effects, records)."""
    import psycopg

    suffix = uuid.uuid4().hex[:12]
    effects, records = f"effects_{suffix}", f"consumed_{suffix}"
    with psycopg.connect(postgres.dsn) as db:
        db.execute(f"CREATE TABLE {effects} (msg_id TEXT, body BYTEA)")
    return postgres.dsn, effects, records


def pg_effects(dsn, effects) -> Counter:
    import psycopg

    with psycopg.connect(dsn) as db:
        return Counter(dict(db.execute(f"SELECT msg_id, count(*) FROM {effects} GROUP BY msg_id").fetchall()))


def test_postgres_two_deliveries_at_once_apply_one_effect(pg_tables):
    """A share handed over mid-call: the second delivery waits on the first's record, then sees it committed."""
    import psycopg

    dsn, effects, records = pg_tables
    first_applied, release = threading.Event(), threading.Event()

    class Slow(TransactionalListener):
        def apply(self, message, cursor):
            cursor.execute(f"INSERT INTO {effects} (msg_id, body) VALUES (%s, %s)", (message.msg_id, message.body))
            if message.body == b"first":
                first_applied.set()
                release.wait(30)

    listener = Slow(lambda: psycopg.connect(dsn), group="credits", table=records)
    first = threading.Thread(target=listener.consume, args=(message("m1", b"first"),))
    first.start()
    assert first_applied.wait(30)
    answers = []
    second = threading.Thread(target=lambda: answers.append(listener.consume(message("m1", b"second"))))
    second.start()
    wait_until(lambda: waiting_on_a_lock(dsn), 30, "the second delivery waiting on the first's record")
    release.set()
    first.join(30), second.join(30)
    assert answers == [ConsumeResult.SUCCESS]
    assert pg_effects(dsn, effects) == {"m1": 1}
    with psycopg.connect(dsn) as db:
        assert db.execute(f"SELECT body FROM {effects}").fetchall() == [(b"first",)]
    listener.close()


def waiting_on_a_lock(dsn) -> bool:
    import psycopg

    with psycopg.connect(dsn) as db:
        return db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0] > 0


def test_delta_appends_a_messages_rows_once(tmp_path):
    class Ledger(DeltaTableListener):
        def rows(self, message):
            return pa.table({"msg_id": [message.msg_id], "body": [message.body]})

    from deltalake import DeltaTable

    listener = Ledger(str(tmp_path / "ledger"), group="credits")
    assert not listener.applied("m1")
    for msg_id in ("m1", "m1", "m2", "m1"):
        assert listener.consume(message(msg_id)) is ConsumeResult.SUCCESS
    table = DeltaTable(str(tmp_path / "ledger"))
    assert Counter(table.to_pyarrow_table()["msg_id"].to_pylist()) == {"m1": 1, "m2": 1}
    assert table.version() == 1 and listener.applied("m2")
    assert table.transaction_version("txcoord-consumer.credits.m1") == 0


def test_delta_a_delivery_racing_another_of_the_same_message_appends_nothing(tmp_path):
    """The other delivery commits between this one's check and its write: this commit conflicts, nothing twice."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    path = str(tmp_path / "ledger")

    class Raced(DeltaTableListener):
        def rows(self, message):
            if message.body == b"raced":  # the other delivery of the same message, committing first
                write_deltalake(path, pa.table({"msg_id": [message.msg_id], "body": [b"other"]}), mode="append",
                                commit_properties=CommitProperties(app_transactions=[
                                    Transaction(f"txcoord-consumer.credits.{message.msg_id}", 0)]))
            return pa.table({"msg_id": [message.msg_id], "body": [message.body]})

    listener = Raced(path, group="credits")
    listener.consume(message("m0"))
    assert listener.consume(message("m1", b"raced")) is ConsumeResult.SUCCESS
    assert sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda row: row["msg_id"]) == [{"msg_id": "m0", "body": b"x"},
                                                               {"msg_id": "m1", "body": b"other"}]


# kill -9 at every point of a message's handling, in a consumer process restarted after each kill.

BODIES = [f"m{n}".encode() for n in range(6)]


class KillRun:
    """A topic of six messages of one key, and the consumer process of :mod:`support.exactly_once_worker`."""

    def __init__(self, tmp_path, backend, target, effects_table="effects", records="txcoord_consumed"):
        self.tmp_path, self.backend, self.target = tmp_path, backend, target
        self.settings = CoordinatorConfig(lakehouse=str(tmp_path / "lakehouse"))
        grant(self.settings, "credits", ["ORDERS"], shares=2)
        feed = TopicFeed(self.settings)
        self.ids = feed.deliver("ORDERS", [("K", body) for body in BODIES])
        feed.close()
        self.deliveries = tmp_path / "deliveries.txt"
        self.deliveries.touch()
        self.argv = [sys.executable, "-m", "support.exactly_once_worker", "--lakehouse", self.settings.lakehouse,
                     "--backend", backend, "--target", target, "--effects", effects_table, "--records", records,
                     "--deliveries", str(self.deliveries)]
        self.runs = 0

    def job(self, *extra) -> Job:
        self.runs += 1
        return Job(self.argv + list(extra), self.tmp_path / f"consumer-{self.runs}.log",
                   env=child_environment(os.environ)).start()

    def killed_itself_at(self, point: str, body: bytes) -> None:
        job = self.job("--kill-at", point, "--kill-body", body.decode())
        try:
            status = job.process.wait(60)
        except subprocess.TimeoutExpired:
            job.kill()
            raise AssertionError(f"the consumer did not reach {point} of {body!r}: "
                                 f"{(self.tmp_path / f'consumer-{self.runs}.log').read_text()[-3000:]}")
        assert status == -9, (self.tmp_path / f"consumer-{self.runs}.log").read_text()[-3000:]

    def killed_once_saved(self, body: bytes, effects) -> None:
        """Run until the message's effect is applied and its progress saved, then kill -9 from outside."""
        job = self.job()
        try:
            wait_until(lambda: self.saved(body), 60, f"{body!r} handled and saved")
        finally:
            assert job.kill() == -9

    def saved(self, body: bytes) -> bool:
        msg_id, offset = self.ids[BODIES.index(body)], BODIES.index(body)
        progress, _ = ConsumerGroup(Lakehouse.of(self.settings), "credits").progress("ORDERS", share_of("K", msg_id, 2))
        read = progress is not None and (progress.version > 0 or progress.offset > offset)
        return read and offset not in progress.unhandled.get(0, ())

    def delivered(self) -> Counter:
        return Counter(self.deliveries.read_text().split())


def kill_at_every_point(run: KillRun, effects, points) -> None:
    for point, body in zip(points, BODIES[1:]):
        run.killed_itself_at(point, body)
    run.killed_once_saved(BODIES[len(points) + 1], effects)
    job = run.job()
    try:
        wait_until(lambda: sum(effects().values()) >= len(BODIES) and run.saved(BODIES[-1]), 60, "every effect")
    finally:
        job.kill()
    assert effects() == {msg_id: 1 for msg_id in run.ids}
    delivered = run.delivered()
    # The kills did deliver messages again: what was committed and not saved above all.
    committed_not_saved = run.ids[points.index("after-commit") + 1]
    assert delivered[committed_not_saved] >= 2
    assert sum(delivered.values()) > len(BODIES)


def test_sqlite_effects_once_under_kill_9_at_every_point(tmp_path, sqlite_db):
    run = KillRun(tmp_path, "sqlite", sqlite_db)
    kill_at_every_point(run, lambda: sqlite_effects(sqlite_db), ["before-effect", "after-effect", "after-commit"])


def test_postgres_effects_once_under_kill_9_at_every_point(tmp_path, pg_tables):
    dsn, effects, records = pg_tables
    run = KillRun(tmp_path, "postgres", dsn, effects, records)
    kill_at_every_point(run, lambda: pg_effects(dsn, effects), ["before-effect", "after-effect", "after-commit"])


def test_delta_effects_once_under_kill_9_at_every_point(tmp_path):
    from deltalake import DeltaTable

    path = str(tmp_path / "ledger")

    def effects():
        if not DeltaTable.is_deltatable(path):
            return Counter()
        return Counter(DeltaTable(path).to_pyarrow_table()["msg_id"].to_pylist())

    run = KillRun(tmp_path, "delta", path)
    # A Delta write is its commit: nothing lies between the effect and its record.
    kill_at_every_point(run, effects, ["before-effect", "after-commit"])
