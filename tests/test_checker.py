"""The checker's rules (docs/design.md#the-protocol, #the-checker), one batch at a time, over records written straight
to the commit log with delta-rs (the way any writer, well-behaved or not, can)."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dataclasses import replace
from pathlib import Path

from coordinator.checker.ends import WAIT_FOR_CHECK
from coordinator.lakehouse import Lakehouse, open_table, read_table, table_dataset
from coordinator.protocol import CHECK_IMMUNITY_TIME_IN_SECONDS
from coordinator.validation import MAX_BODY_BYTES
from coordinator.tables import CHECK_REQUESTS, HALF, OP, REJECTED, TOPIC
from support import end_record, half_record
from support.batches import stored_time

SECOND = dt.timedelta(seconds=1)


def reasons(checker) -> dict[str, str]:
    """Rejections by record id."""
    return {r.record_id: r.reason for r in checker.rows("rejected")}


def test_commit_delivers_once_and_rollback_never(checker):
    checker.write(half_record("t-commit", keys="k1", tags="tag", properties={"p": "1"}), half_record("t-rollback"))
    checker.write(end_record("t-commit"), end_record("t-rollback", "ROLLBACK_MESSAGE"))
    summary = checker.run()

    assert (summary.halves, summary.commits, summary.rollbacks, summary.delivered) == (2, 1, 1, 1)
    topic = checker.rows("T")
    assert [(r.transaction_id, r.keys, r.tags, r.properties, bytes(r.body)) for r in topic] == [
        ("t-commit", "k1", "tag", {"p": "1"}, b"hello")
    ]
    ops = {r.transaction_id: r.outcome for r in checker.rows("op")}
    assert ops == {"t-commit": "COMMIT", "t-rollback": "ROLLBACK"}
    # Its first delivery made the topic, with the topic's properties (a checkpoint every 20 commits).
    assert open_table(checker.lakehouse.topic("T")).metadata().configuration == TOPIC.properties
    half = sorted(checker.rows("half"), key=lambda r: r.queue_offset)
    assert half[0].queue_offset < half[1].queue_offset and len({r.queue_offset for r in half}) == 2


def test_half_and_end_in_separate_batches_and_offsets_keep_increasing(checker):
    patient = {CHECK_IMMUNITY_TIME_IN_SECONDS: "600"}  # a slow batch must not make the END late
    checker.write(half_record("a", properties=patient))
    checker.run()
    checker.write(half_record("b", properties=patient))
    checker.write(end_record("a"), end_record("b"))
    summary = checker.run()

    assert summary.commits == 2
    offsets = [r.queue_offset for r in sorted(checker.rows("half"), key=lambda r: r.commit_version)]
    assert offsets == sorted(offsets) and len(set(offsets)) == 2
    assert sorted((r.transaction_id, r.queue_offset) for r in checker.rows("T")) == sorted(
        (r.transaction_id, r.queue_offset) for r in checker.rows("half"))


def test_two_topic_transaction_is_all_or_nothing(checker):
    checker.write(
        half_record("both", topic="ORDERS", message_index=0, message_count=2),
        half_record("both", topic="AUDIT", message_index=1, message_count=2),
        half_record("neither", topic="ORDERS", message_index=0, message_count=2),
        half_record("neither", topic="AUDIT", message_index=1, message_count=2),
    )
    checker.write(end_record("both"), end_record("neither", "ROLLBACK_MESSAGE"))
    checker.run()

    assert [r.transaction_id for r in checker.rows("ORDERS")] == ["both"]
    assert [r.transaction_id for r in checker.rows("AUDIT")] == ["both"]
    assert len(checker.rows("op", pc.field("transaction_id") == "neither")) == 2


def test_incomplete_multi_message_transaction_is_refused_whole(checker):
    checker.write(
        half_record("partial", topic="ORDERS", message_index=0, message_count=3),
        half_record("partial", topic="AUDIT", message_index=1, message_count=3),
    )
    checker.write(end_record("partial"))
    checker.run()

    assert len(checker.rows("half")) == 0
    assert Counter(r.reason for r in checker.rows("rejected")) == {
        "transaction's messages incomplete or inconsistent": 2,
        "unknown transaction": 1,
    }


def decisions(summary):
    """A batch's summary less what the wall clock measured (how long it took, how late messages became visible)."""
    return replace(summary, duration_ms=0, commit_to_visible_s={})


def test_replayed_batch_writes_nothing_twice(checker):
    lakehouse = Lakehouse(checker.config.lakehouse)
    tables = [lakehouse.path(table) for table in (HALF, OP, REJECTED, CHECK_REQUESTS)] + [lakehouse.topic("T")]

    def contents():  # read with delta-rs: a fraction of a Spark read's cost, four times over
        return {path: sorted(map(str, read_table(path).to_pylist())) for path in tables}

    checker.write(half_record("c"), half_record("r"), half_record("u"), half_record("bad", topic="../x"))
    checker.write(end_record("c"), end_record("r", "ROLLBACK_MESSAGE"), end_record("ghost"))
    first = checker.run()
    before = contents()
    replayed = checker.replay()
    assert decisions(replayed) == decisions(first)
    assert replayed.commit_to_visible_s.keys() == first.commit_to_visible_s.keys() == {"T"}
    assert contents() == before

    checks = checker.run(now=checker.last_batch[2] + dt.timedelta(seconds=10))
    assert checks.checks == 1
    before = contents()
    assert decisions(checker.replay()) == decisions(checks)
    assert contents() == before


def test_crash_between_writes_is_repaired_by_replay(checker, monkeypatch):
    import coordinator.checker.writer as writer

    checker.write(half_record("x"))
    checker.write(end_record("x"))
    real_append = writer.TableWriter.append

    def crash_on_op(self, path, data, batch_id, **options):
        if path.endswith("/system/op"):
            raise RuntimeError("simulated crash after the topic was written")
        return real_append(self, path, data, batch_id, **options)

    monkeypatch.setattr(writer.TableWriter, "append", crash_on_op)
    with pytest.raises(RuntimeError):
        checker.run()
    assert [r.transaction_id for r in checker.rows("T")] == ["x"] and not checker.rows("op")
    monkeypatch.setattr(writer.TableWriter, "append", real_append)
    checker.replay()

    assert len(checker.rows("op")) == 1
    assert len(checker.rows("half")) == 1
    assert [r.transaction_id for r in checker.rows("T")] == ["x"]


def test_hostile_and_malformed_records_are_rejected_with_reasons(checker):
    records = {
        "traversal": half_record("h1", topic="../x"),
        "long_topic": half_record("h2", topic="T" * 200),
        "empty_body": half_record("h3", body=b""),
        "huge_body": half_record("h4", body=b"x" * (MAX_BODY_BYTES + 1)),
        "null_txn": half_record(None),
        "bad_immunity": half_record("h5", properties={CHECK_IMMUNITY_TIME_IN_SECONDS: "-3"}),
        "unknown_kind": half_record("h6", kind="DELETE_EVERYTHING"),
        "valid": half_record("ok", group="g"),
    }
    checker.write(*records.values())
    checker.write(half_record("owned", group="owner"))
    ends = {
        "unknown_state": end_record("ok", state="MAYBE"),
        "unknown_txn": end_record("nobody-sent-this"),
        "valid_end": end_record("ok"),
    }
    checker.write(*ends.values())
    # Another group, in its own log, ends the owner's transaction; then claims to be the owner.
    ends["forged_group"] = end_record("owned", group="intruder")
    ends["claims_owner"] = end_record("owned", group="owner")
    checker.write(ends["forged_group"], ends["claims_owner"], log="groups/intruder/commit_log")
    ends["second_end"] = end_record("ok", state="ROLLBACK_MESSAGE")  # a later commit: the first END has won
    checker.write(ends["second_end"])
    summary = checker.run()

    got = reasons(checker)
    expected = {
        "traversal": "topic does not match",
        "long_topic": "topic longer than 127 characters",
        "empty_body": "empty body",
        "huge_body": "body larger than",
        "null_txn": "missing transaction_id",
        "bad_immunity": f"bad {CHECK_IMMUNITY_TIME_IN_SECONDS}",
        "unknown_kind": "unknown record kind 'DELETE_EVERYTHING'",
    }
    for name, reason in expected.items():
        assert got.get(records[name]["record_id"], "").startswith(reason), (name, sorted(got.values()))
    assert got[ends["unknown_state"]["record_id"]] == "unknown state 'MAYBE'"
    assert got[ends["unknown_txn"]["record_id"]] == "unknown transaction"
    assert got[ends["forged_group"]["record_id"]] == "producer group does not own the transaction"
    assert got[ends["claims_owner"]["record_id"]] == ("stored in producer group 'intruder''s commit log but names "
                                                      "producer group 'owner'")
    assert got[ends["second_end"]["record_id"]] == "transaction already resolved"
    assert ends["valid_end"]["record_id"] not in got
    assert summary.rejected == len(expected) + 5
    # Valid traffic around the bad records is untouched.
    assert [r.transaction_id for r in checker.rows("T")] == ["ok"]
    assert {r.transaction_id for r in checker.rows("half")} == {"ok", "owned"}
    # Nothing left the lakehouse's topics/ directory.
    assert sorted(p.name for p in Path(checker.config.lakehouse).iterdir()) == ["groups", "operators", "system", "topics"]
    assert [p.name for p in (Path(checker.config.lakehouse) / "topics").iterdir()] == ["T"]


def test_duplicate_transaction_id_and_end_before_half(checker):
    checker.write(half_record("dup"))
    checker.run()
    again = half_record("dup")
    checker.write(again)
    early_end = end_record("later")
    checker.write(early_end)
    late_half = half_record("later")
    checker.write(late_half)
    checker.run()

    got = reasons(checker)
    assert got[again["record_id"]] == "duplicate transaction_id"
    assert got[early_end["record_id"]] == "end precedes its half"
    assert len(checker.rows("half")) == 2


def test_first_resolution_is_final(checker):
    checker.write(half_record("once"))
    checker.write(end_record("once"))
    checker.run()
    rollback = end_record("once", "ROLLBACK_MESSAGE")
    checker.write(rollback)
    checker.run()

    assert reasons(checker) == {rollback["record_id"]: "transaction already resolved"}
    assert checker.rows("op")[0].outcome == "COMMIT"
    assert len(checker.rows("T")) == 1


def test_late_producer_end_waits_for_check_but_a_check_answer_is_accepted(checker):
    # Stored 1.5 s before its producer's END: past its 1 s immunity.
    checker.write(half_record("late", properties={CHECK_IMMUNITY_TIME_IN_SECONDS: "1"}),
                  stored_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1.5))
    late = end_record("late")
    checker.write(late)
    checker.run()
    assert reasons(checker) == {late["record_id"]: WAIT_FOR_CHECK}
    assert not (Path(checker.config.lakehouse) / "topics" / "T").exists()

    requests = checker.rows("check_requests")
    assert [r.check_times for r in requests] == [1]
    checker.write(end_record("late", check_id=requests[0].check_id))
    checker.run()
    assert len(checker.rows("T")) == 1


def test_checker_downtime_rejects_nothing(checker):
    """An END that entered the commit log in time is valid however late the checker reads it."""
    checker.write(half_record("slow"))
    checker.write(end_record("slow"))
    summary = checker.run(now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=5))

    assert (summary.commits, summary.rejected, summary.checks) == (1, 0, 0)


def test_checks_respect_immunity_interval_and_maximum_then_discard(checker):
    cfg = checker.config  # immunity 6 s, interval 60 s, maximum 5
    checker.write(half_record("silent"), half_record("patient", properties={CHECK_IMMUNITY_TIME_IN_SECONDS: "30"}))
    checker.run()
    born = stored_time(checker, "silent")

    def checks(txn):
        return len(checker.rows("check_requests", pc.field("transaction_id") == txn))

    checker.run(now=born + 5 * SECOND)
    assert checks("silent") == 0  # still immune
    checker.run(now=born + 7 * SECOND)
    assert (checks("silent"), checks("patient")) == (1, 0)  # default immunity passed, per-message one not
    checker.run(now=born + 40 * SECOND)
    assert (checks("silent"), checks("patient")) == (1, 1)  # interval not yet elapsed for "silent"
    checker.write(end_record("patient", check_id="patient-1"))  # answered: only "silent" goes on
    def last_check_visible():  # when the newest file holding a check of "silent" was written
        table, dataset = table_dataset(checker.path("check_requests"))
        written_ms = {a["path"]: a["modification_time"] for a in pa.table(table.get_add_actions(flatten=True)).to_pylist()}
        silent = pc.field("transaction_id") == "silent"
        newest_ms = max(written_ms[f.path] for f in dataset.get_fragments() if f.to_table(filter=silent).num_rows)
        return dt.datetime.fromtimestamp(newest_ms / 1000, dt.timezone.utc)

    checker.run(now=last_check_visible() + 59 * SECOND)
    assert checks("silent") == 1  # the interval runs from when the last check became visible
    for expected in range(2, cfg.transaction_check_max + 1):
        now = last_check_visible() + 61 * SECOND
        checker.run(now=now)
        assert checks("silent") == expected
    now = last_check_visible() + 61 * SECOND
    summary = checker.run(now=now)

    assert checks("silent") == cfg.transaction_check_max
    discarded = checker.rows("discarded", pc.field("transaction_id") == "silent")
    assert [(r.check_times, r.reason) for r in discarded] == [(5, "checked 5 times without an answer")]
    assert summary.discarded == 1
    times = [r.check_times for r in checker.rows("check_requests", pc.field("transaction_id") == "silent")]
    assert sorted(times) == [1, 2, 3, 4, 5]
    assert min(r.requested_at for r in checker.rows("check_requests")) >= born + 6 * SECOND
    op = checker.rows("op", pc.field("transaction_id") == "silent")
    assert [r.outcome for r in op] == ["DISCARD"]
    # A discarded transaction is resolved: an answer arriving now is refused.
    answer = end_record("silent", check_id="silent-5")
    checker.write(answer)
    checker.run(now=now + SECOND)
    assert reasons(checker)[answer["record_id"]] == "transaction already resolved"


def test_halves_past_retention_are_discarded_unchecked(checker):
    checker.config = checker.config.replace(file_reserved_time_hours=1)
    checker.write(half_record("old"))
    checker.run()
    born = stored_time(checker, "old")
    checker.run(now=born + dt.timedelta(hours=2))

    assert len(checker.rows("check_requests")) == 0
    assert [r.reason for r in checker.rows("discarded")] == ["expired: older than file_reserved_time_hours"]


def test_a_transaction_with_a_message_for_an_ungranted_topic_is_refused_whole_and_never_delivered(checker):
    checker.config = checker.config.replace(topic_grants={"orders": ["ORDER_*"], "audit": ["AUDIT"]})
    checker.write(
        half_record("granted", group="orders", topic="ORDER_EU"),
        half_record("sneaky", group="orders", topic="ORDER_EU", message_index=0, message_count=2, record_id="r-ok"),
        half_record("sneaky", group="orders", topic="PAYMENTS", message_index=1, message_count=2, record_id="r-bad"),
    )
    checker.write(half_record("stranger", group="unlisted", topic="ORDER_EU", record_id="r-stranger"))  # its own log
    checker.write(end_record("granted", group="orders"), end_record("sneaky", group="orders"))
    checker.write(end_record("stranger", group="unlisted"))
    summary = checker.run()

    assert summary.delivered == 1 and [r.transaction_id for r in checker.rows("ORDER_EU")] == ["granted"]
    assert [r.transaction_id for r in checker.rows("half")] == ["granted"]
    refused = reasons(checker)
    assert refused["r-bad"] == ("producer group 'orders' may not publish to topic 'PAYMENTS' "
                                "(topic_grants: ORDER_*)")
    assert refused["r-ok"] == "another message of the transaction was refused"
    assert refused["r-stranger"] == ("producer group 'unlisted' may not publish to topic 'ORDER_EU' "
                                     "(topic_grants: no topic)")
    assert not Path(checker.path("PAYMENTS")).exists()


def test_without_topic_grants_every_group_publishes_to_every_topic(checker):
    assert checker.config.topic_grants is None
    checker.write(half_record("a", group="orders", topic="ANYTHING"))  # each group writes its own commit log
    checker.write(half_record("b", group="other", topic="ELSE"))
    checker.write(end_record("a", group="orders"))
    checker.write(end_record("b", group="other"))

    assert checker.run().delivered == 2 and reasons(checker) == {}
