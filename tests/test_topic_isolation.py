"""A topic that cannot be written stops only its own transactions (docs/design.md#a-topic-that-cannot-be-written).

The broken topic is a table in a state the checker cannot append to (someone made ``topics/BROKEN``
with other columns); it is repaired by removing it, as an operator would.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from support import end_record, half_record
from support.batches import stored_time
from coordinator.ops.pending import pending_transactions

SECOND = dt.timedelta(seconds=1)


def break_topic(checker, topic: str = "BROKEN") -> None:
    write_deltalake(checker.path(topic), pa.table({"something_else": [1]}))


def repair_topic(checker, topic: str = "BROKEN") -> None:
    shutil.rmtree(checker.path(topic))


def delivered(checker, topic: str) -> Counter:
    return Counter(r.transaction_id for r in checker.rows(topic))


def committed_op_rows(checker) -> Counter:
    return Counter(r.transaction_id for r in checker.rows("op") if r.outcome == "COMMIT")


@pytest.fixture
def withheld(checker):
    """Three committed transactions: ``fine`` (topic T), ``stuck`` (BROKEN), ``split`` (a message on each)."""
    break_topic(checker)
    checker.write(half_record("fine"), half_record("stuck", topic="BROKEN"),
                  half_record("split", message_index=0, message_count=2),
                  half_record("split", topic="BROKEN", message_index=1, message_count=2))
    checker.write(end_record("fine"), end_record("stuck"), end_record("split"))
    checker.summary = checker.run()
    return checker


def test_other_topics_are_delivered_and_the_stuck_transactions_stay_pending_with_the_reason(withheld):
    checker, summary = withheld, withheld.summary

    assert delivered(checker, "T") == {"fine": 1, "split": 1}
    assert (summary.commits, summary.delivered, summary.withheld) == (3, 2, 2)
    assert summary.withheld_by_topic == {"BROKEN": 2}
    # A message has its op row once its topic row is in place, and only then.
    assert committed_op_rows(checker) == {"fine": 1, "split": 1}
    undelivered = checker.rows("undelivered")
    assert sorted((r.transaction_id, r.topic) for r in undelivered) == [("split", "BROKEN"), ("stuck", "BROKEN")]
    assert all("topic 'BROKEN' cannot be written" in r.reason for r in undelivered)

    pending = {t.transaction_id: t for t in pending_transactions(checker.config)}
    assert set(pending) == {"stuck", "split"}
    assert pending["split"].topics == ("BROKEN",)
    assert all(t.next_step == "deliver" and "topic 'BROKEN' cannot be written" in t.withheld for t in pending.values())


def test_withheld_transactions_are_never_checked_or_discarded_and_take_no_other_end(withheld):
    checker = withheld
    born = stored_time(checker, "stuck")
    late_answer = end_record("stuck", "ROLLBACK_MESSAGE", check_id="stuck-1")
    checker.write(late_answer)
    for minutes in (1, 10, 60):  # past the immunity, every check interval and the last check's
        checker.run(now=born + dt.timedelta(minutes=minutes))

    assert not checker.rows("check_requests") and not checker.rows("discarded")
    rejected = {r.record_id: r.reason for r in checker.rows("rejected")}
    assert rejected[late_answer["record_id"]] == "transaction already resolved"
    assert "ROLLBACK" not in {r.outcome for r in checker.rows("op")}


def test_a_repaired_topic_takes_its_messages_once_in_queue_order(withheld):
    checker = withheld
    checker.write(half_record("after", topic="BROKEN"))
    checker.write(end_record("after"))
    checker.run()  # still broken: the new one is withheld behind the others
    repair_topic(checker)
    summary = checker.run()

    assert summary.withheld == 0 and summary.delivered == 3
    rows = checker.rows("BROKEN")  # one append: in the file's order
    assert [r.queue_offset for r in rows] == sorted(r.queue_offset for r in rows)
    assert Counter(r.transaction_id for r in rows[:2]) == {"stuck": 1, "split": 1} and rows[2].transaction_id == "after"
    assert committed_op_rows(checker) == {"fine": 1, "stuck": 1, "split": 2, "after": 1}
    assert pending_transactions(checker.config) == []
    checker.run()
    assert delivered(checker, "BROKEN") == {"stuck": 1, "split": 1, "after": 1}


def test_a_restarted_checker_still_withholds_and_then_delivers_once(withheld):
    checker = withheld
    checker.restart()  # a restart: memory rebuilt from the tables
    born = stored_time(checker, "stuck")
    summary = checker.run(now=born + dt.timedelta(minutes=10))
    assert (summary.withheld, summary.checks) == (2, 0)

    repair_topic(checker)
    checker.restart()
    checker.run()
    assert delivered(checker, "BROKEN") == {"stuck": 1, "split": 1}
    assert delivered(checker, "T") == {"fine": 1, "split": 1}
    assert committed_op_rows(checker) == {"fine": 1, "stuck": 1, "split": 2}


def test_an_attempt_that_landed_though_it_failed_is_not_delivered_again(withheld, monkeypatch):
    import coordinator.checker.writer as writer

    checker = withheld
    repair_topic(checker)
    real_append = writer.TableWriter.append

    def landed_then_failed(self, path, data, batch_id, **options):
        version = real_append(self, path, data, batch_id, **options)
        if path.endswith("/topics/BROKEN"):
            raise TimeoutError("the reply was lost")
        return version

    monkeypatch.setattr(writer.TableWriter, "append", landed_then_failed)
    assert checker.run().withheld == 2
    monkeypatch.setattr(writer.TableWriter, "append", real_append)
    checker.restart()
    summary = checker.run()

    assert (summary.withheld, summary.delivered) == (0, 0)
    assert delivered(checker, "BROKEN") == {"stuck": 1, "split": 1}
    assert committed_op_rows(checker) == {"fine": 1, "stuck": 1, "split": 2}


def test_a_replay_after_the_repair_delivers_once(withheld):
    checker = withheld
    repair_topic(checker)
    checker.replay()  # Spark runs the first batch again: its op and undelivered rows are in place
    checker.run()

    assert delivered(checker, "BROKEN") == {"stuck": 1, "split": 1}
    assert delivered(checker, "T") == {"fine": 1, "split": 1}
    assert committed_op_rows(checker) == {"fine": 1, "stuck": 1, "split": 2}
    assert pending_transactions(checker.config) == []
