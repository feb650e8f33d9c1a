"""The group-committing commit-log writer, against real delta-rs tables."""

import json
import threading
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest

from coordinator.appender import DeltaAppender
from coordinator.exceptions import ProducerStateError
from coordinator.producer import commit_log
from coordinator.producer.commit_log import CommitLogWriter, end_record
from coordinator.protocol import LocalTransactionState
from support.producer_side import commit_log_rows, commit_log_version


@pytest.fixture
def lakehouse(tmp_path):
    return str(tmp_path / "lakehouse")


def ends(transaction_id, count):
    return [end_record("order_group", transaction_id, LocalTransactionState.COMMIT_MESSAGE) for _ in range(count)]


class ScriptedWrites:
    """Wraps the appender's first step, the data file's write: records each batch's row count, holds
    the first write until released (so later submits queue up behind it), and fails chosen calls."""

    def __init__(self, real_write):
        self.real_write = real_write
        self.rows = []
        self.failures = {}
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, appender, data, **options):
        self.rows.append(data.num_rows)
        call = len(self.rows)
        if call == 1:
            self.entered.set()
            self.release.wait(60)
        if call in self.failures:
            raise self.failures[call]
        return self.real_write(appender, data, **options)


@pytest.fixture
def writes(monkeypatch):
    scripted = ScriptedWrites(DeltaAppender.prepare)
    monkeypatch.setattr(DeltaAppender, "prepare", lambda appender, data, **options: scripted(appender, data, **options))
    return scripted


def versions_by_transaction(lakehouse):
    versions = defaultdict(set)
    for row in commit_log_rows(lakehouse):
        versions[row["transaction_id"]].add(row["_commit_version"])
    return versions


def test_submit_resolves_once_durable_with_the_commit_version(lakehouse):
    with CommitLogWriter(lakehouse, "order_group") as writer:
        version = writer.submit(ends("t1", 3)).result(timeout=60)
        assert version == commit_log_version(lakehouse) == 1
        assert [r["transaction_id"] for r in commit_log_rows(lakehouse)] == ["t1"] * 3
    # Each commit names the client protocol it was written under (docs/protocol.md#versioning).
    commit = Path(lakehouse, "groups/order_group/commit_log/_delta_log/00000000000000000001.json").read_text()
    assert json.loads(commit.splitlines()[0])["commitInfo"]["txcoordProtocol"] == 1


def test_waiting_submits_share_a_commit_up_to_max_batch_rows_and_are_never_split(lakehouse, writes):
    with CommitLogWriter(lakehouse, "order_group", max_batch_rows=4) as writer:
        first = writer.submit(ends("first", 1))
        assert writes.entered.wait(60)
        futures = [writer.submit(ends(f"t{i}", 2)) for i in range(4)] + [writer.submit(ends("big", 6))]
        writes.release.set()
        versions = [f.result(timeout=60) for f in [first, *futures]]

    assert writes.rows == [1, 4, 4, 6]
    assert versions == [1, 2, 2, 3, 3, 4]
    by_transaction = versions_by_transaction(lakehouse)
    assert all(len(v) == 1 for v in by_transaction.values())
    assert by_transaction["big"] == {4}


def test_a_failed_commit_fails_every_submit_in_it_and_the_writer_carries_on(lakehouse, writes):
    writes.failures[2] = OSError("disk full")
    with CommitLogWriter(lakehouse, "order_group") as writer:
        first = writer.submit(ends("first", 1))
        assert writes.entered.wait(60)
        doomed = [writer.submit(ends("a", 1)), writer.submit(ends("b", 2))]
        writes.release.set()
        assert first.result(timeout=60) == 1
        errors = [f.exception(timeout=60) for f in doomed]
        assert errors == [writes.failures[2]] * 2
        assert writer.submit(ends("after", 1)).result(timeout=60) == 2
    assert writes.rows == [1, 3, 1]
    assert set(versions_by_transaction(lakehouse)) == {"first", "after"}


def test_writers_of_several_processes_share_the_log_without_losing_a_version(lakehouse):
    # Two writers stand for two processes: each commits behind the other's back.
    with CommitLogWriter(lakehouse, "order_group") as first, CommitLogWriter(lakehouse, "order_group") as second:
        versions = [writer.submit(ends(f"t{i}", 1)).result(timeout=60)
                    for i, writer in enumerate([first, second, second, first, first, second])]
    assert versions == [1, 2, 3, 4, 5, 6]
    assert sorted(versions_by_transaction(lakehouse)) == [f"t{i}" for i in range(6)]


def test_a_cancelled_submit_is_not_written(lakehouse, writes):
    with CommitLogWriter(lakehouse, "order_group") as writer:
        writer.submit(ends("first", 1))
        assert writes.entered.wait(60)
        cancelled = writer.submit(ends("cancelled", 1))
        kept = writer.submit(ends("kept", 1))
        assert cancelled.cancel()
        writes.release.set()
        kept.result(timeout=60)
    assert writes.rows == [1, 1]
    assert set(versions_by_transaction(lakehouse)) == {"first", "kept"}


def test_close_flushes_pending_submits_and_is_idempotent(lakehouse):
    writer = CommitLogWriter(lakehouse, "order_group")
    futures = [writer.submit(ends(f"t{i}", 1)) for i in range(50)]
    writer.close()
    writer.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert len(commit_log_rows(lakehouse)) == 50
    with pytest.raises(ProducerStateError):
        writer.submit(ends("late", 1))


def test_records_that_do_not_fit_the_schema_are_refused_and_lose_nothing_else(lakehouse, writes):
    with CommitLogWriter(lakehouse, "order_group") as writer:
        with pytest.raises(ValueError, match="stat"):
            writer.submit([{"record_id": "r", "kind": "END", "stat": "COMMIT_MESSAGE"}])
        with pytest.raises(ValueError):
            writer.submit([])
        assert commit_log_version(lakehouse) == 0
        first = writer.submit(ends("first", 1))
        assert writes.entered.wait(60)  # the next three queue up behind it, for one commit
        before = writer.submit(ends("before", 1))
        wrong_type = writer.submit([{"record_id": "r", "message_index": "not a number"}])
        after = writer.submit(ends("after", 2))
        writes.release.set()
        with pytest.raises((TypeError, ValueError, pa.ArrowException)):
            wrong_type.result(timeout=60)
        assert (first.result(timeout=60), before.result(timeout=60), after.result(timeout=60)) == (1, 2, 2)
    assert writes.rows == [1, 3]
    assert sorted(row["transaction_id"] for row in commit_log_rows(lakehouse)) == ["after", "after", "before", "first"]


class HeldClock:
    """Stands in for the writer's ``time``: its clock moves only when the writer sleeps, and a
    sleep (the rest of a commit interval) lasts until the test releases it."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps = []
        self.sleeping, self.wake = threading.Event(), threading.Event()

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        if seconds > 0:
            self.sleeps.append(seconds)
            self.sleeping.set()
            self.wake.wait(60)
        self.now += seconds


def test_sends_arriving_within_the_commit_interval_share_the_next_commit(lakehouse, monkeypatch):
    clock = HeldClock()
    monkeypatch.setattr(commit_log, "time", clock)
    with CommitLogWriter(lakehouse, "order_group", commit_interval_ms=300) as writer:
        assert writer.submit(ends("first", 1)).result(timeout=60) == 1
        early = writer.submit(ends("early", 1))
        assert clock.sleeping.wait(60), "the writer did not wait out the commit interval before the next commit"
        late = [writer.submit(ends(f"late{i}", 1)) for i in range(3)]  # within the interval: the clock is held
        clock.wake.set()
        assert [early.result(timeout=60)] + [f.result(timeout=60) for f in late] == [2, 2, 2, 2]
    assert clock.sleeps == [pytest.approx(0.3)]  # the second commit waited out the whole interval


def test_on_a_local_disk_the_next_batch_is_taken_once_the_commit_in_flight_landed(lakehouse, monkeypatch):
    """One batch in flight on a local disk: the sends that arrive while a commit is in flight wait for it, and
    then share the next commit."""
    committing, release, prepared = threading.Event(), threading.Event(), threading.Event()
    real_prepare, real_commit = DeltaAppender.prepare, DeltaAppender.commit

    def prepare(appender, data, **options):
        if committing.is_set():
            prepared.set()
        return real_prepare(appender, data, **options)

    def commit(appender, ready):
        if not committing.is_set():
            committing.set()
            release.wait(60)
        return real_commit(appender, ready)

    monkeypatch.setattr(DeltaAppender, "prepare", prepare)
    monkeypatch.setattr(DeltaAppender, "commit", commit)
    with CommitLogWriter(lakehouse, "order_group") as writer:
        first = writer.submit(ends("first", 1))
        assert committing.wait(60)
        waiting = [writer.submit(ends(f"waiting{i}", 1)) for i in range(3)]
        assert not prepared.wait(0.5), "a second batch was taken while a commit was in flight"
        release.set()
        assert first.result(timeout=60) == 1
        assert [future.result(timeout=60) for future in waiting] == [2, 2, 2]


def test_the_next_batchs_data_file_is_written_while_a_commit_is_in_flight_and_no_further(lakehouse, monkeypatch):
    """Two batches in flight: the one committing and the next, whose data file is written meanwhile; a third
    waits until the first is committed. Commits keep the order the batches were taken in."""
    events, prepared = [], {name: threading.Event() for name in "abc"}
    committing, release = threading.Event(), threading.Event()
    real_prepare, real_commit = DeltaAppender.prepare, DeltaAppender.commit

    def prepare(appender, data, **options):
        result = real_prepare(appender, data, **options)
        name = data.column("transaction_id")[0].as_py()
        events.append(f"prepared {name}")
        prepared[name].set()
        return result

    def commit(appender, ready):
        if not committing.is_set():
            committing.set()
            release.wait(60)
        version = real_commit(appender, ready)
        events.append(f"committed {version}")
        return version

    monkeypatch.setattr(DeltaAppender, "prepare", prepare)
    monkeypatch.setattr(DeltaAppender, "commit", commit)
    with CommitLogWriter(lakehouse, "order_group", batches_in_flight=2) as writer:  # as on object storage
        a = writer.submit(ends("a", 1))
        assert committing.wait(60)
        b = writer.submit(ends("b", 1))
        assert prepared["b"].wait(60), "the next batch's data file waited for the commit in flight"
        c = writer.submit(ends("c", 1))
        assert not prepared["c"].wait(0.5), "a third batch was taken while two were in flight"
        release.set()
        assert [a.result(timeout=60), b.result(timeout=60), c.result(timeout=60)] == [1, 2, 3]
    assert events == ["prepared a", "prepared b", "committed 1", "prepared c", "committed 2", "committed 3"] or \
        events == ["prepared a", "prepared b", "committed 1", "committed 2", "prepared c", "committed 3"]
    assert sorted(versions_by_transaction(lakehouse).items()) == [("a", {1}), ("b", {2}), ("c", {3})]
