"""``txcoord pending``: hanging transactions, their checks so far and the checker's next step (no JVM)."""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict

import pytest

from coordinator.cli import main
from coordinator.control.instances import ProducerInstances
from coordinator.ops.pending import pending_transactions
from coordinator.schedule import CHECK, DISCARD, EXPIRED, clock_time, clock_us, next_step
from support import end_record, half_record
from support.batches import stored_time

SECOND = dt.timedelta(seconds=1)


@pytest.fixture
def hanging(checker):
    """After two batches: "late" (group g) checked once, "patient" (group other, one-hour immunity)
    never checked, "done" committed. All were stored 30 s ago; the first batch ran 1 s after,
    the second 7 s after (by their clocks), its check request written within ``checked_between``."""
    stored_at = dt.datetime.now(dt.timezone.utc) - 30 * SECOND
    checker.write(half_record("late"), half_record("done"), stored_at=stored_at)
    checker.write(half_record("patient", group="other", topic="U", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "3600"}),
                  stored_at=stored_at)  # in group other's own log
    checker.write(end_record("done"), stored_at=stored_at)
    checker.run(now=stored_at + SECOND)
    checker.stored = stored_time(checker, "late")
    started = dt.datetime.now(dt.timezone.utc)
    checker.run(now=checker.stored + 7 * SECOND)
    # The check request's file is stamped in milliseconds while this batch wrote it.
    checker.checked_between = (started.replace(microsecond=started.microsecond // 1000 * 1000),
                               dt.datetime.now(dt.timezone.utc))
    return checker


@pytest.fixture
def config_file(hanging, tmp_path):
    path = tmp_path / "coordinator.toml"
    path.write_text(f"lakehouse = '{hanging.config.lakehouse}'\ntransaction_check_max = 5\n")
    return str(path)


def test_each_pending_transaction_with_its_checks_and_next_step(hanging):
    now = hanging.stored + 10 * SECOND
    late, patient = pending_transactions(hanging.config, now=now)

    assert (late.transaction_id, late.producer_group, late.topics, late.messages) == ("late", "g", ("T",), 1)
    assert (late.checks, late.addressed_to) == (1, None)
    assert hanging.checked_between[0] <= late.last_check_at <= hanging.checked_between[1]  # visible since
    assert (late.next_step, late.next_step_at) == (CHECK, late.last_check_at + 60 * SECOND)  # the 60 s interval
    assert late.age_s == pytest.approx(10.0)
    assert (patient.transaction_id, patient.checks, patient.next_step) == ("patient", 0, CHECK)
    assert patient.next_step_at == patient.stored_at + 3600 * SECOND  # its own immunity

    assert [t.transaction_id for t in pending_transactions(hanging.config, group="other", now=now)] == ["patient"]
    assert pending_transactions(hanging.config, older_than_s=3600, now=now) == []


def test_pending_names_the_instance_the_latest_check_went_to(checker):
    """With instances of its group alive, each check goes to one of them; ``pending`` names the one the
    latest check went to."""
    ProducerInstances(checker.config.lakehouse).announce("g", "first", heartbeat_s=3600)
    stored_at = dt.datetime.now(dt.timezone.utc) - 30 * SECOND
    checker.write(half_record("routed"), stored_at=stored_at)
    checker.run(now=stored_at + 7 * SECOND)
    [routed] = pending_transactions(checker.config)
    assert (routed.checks, routed.addressed_to) == (1, "first")

    ProducerInstances(checker.config.lakehouse).announce("g", "second", heartbeat_s=3600)
    ProducerInstances(checker.config.lakehouse).withdraw("g", "first")
    checker.run(now=stored_at + 100 * SECOND)  # the 60 s interval after the first check, by the wall clock
    [routed] = pending_transactions(checker.config)
    assert (routed.checks, routed.addressed_to) == (2, "second")


def test_the_last_check_is_followed_by_a_discard(hanging):
    from dataclasses import replace

    config = replace(hanging.config, transaction_check_max=1)
    [late] = pending_transactions(config, group="g", now=hanging.stored + 8 * SECOND)
    assert (late.next_step, late.next_step_at) == (DISCARD, late.last_check_at + 60 * SECOND)


def test_pending_prints_a_table_or_json(hanging, config_file, capsys):
    assert main(["pending", "--config", config_file]) == 0
    text = capsys.readouterr().out
    assert "late" in text and "patient" in text and "done" not in text.split()
    assert "2 pending transaction(s)" in text

    assert main(["pending", "--config", config_file, "--json", "--group", "g", "--older-than", "20s"]) == 0
    [late] = json.loads(capsys.readouterr().out)["pending"]
    assert (late["transaction_id"], late["checks"], late["next_step"]) == ("late", 1, "check")
    assert main(["pending", "--config", config_file, "--json", "--older-than", "1m"]) == 0
    assert json.loads(capsys.readouterr().out)["pending"] == []  # stored 30 s ago: none is a minute old


@pytest.mark.parametrize("duration", ["10", "5x", "-1m", "m", "infh"])
def test_a_bad_duration_exits_2_saying_why(config_file, capsys, duration):
    with pytest.raises(SystemExit) as exited:
        main(["pending", "--config", config_file, f"--older-than={duration}"])
    assert exited.value.code == 2
    assert "not a duration" in capsys.readouterr().err


def test_pending_says_what_the_checker_does_next_and_when(checker):
    """Transactions at every point of the schedule (first check after the default or their own immunity,
    further checks, the last one followed by a discard, expiry before the next check) driven through it
    batch by batch: after each, ``pending`` (read from the tables) gives every transaction the next step
    the checker's memory gives it, and the next batch does exactly the steps due by its clock."""
    config = checker.config = checker.config.replace(transaction_check_max=2, file_reserved_time_hours=1)
    wall = dt.datetime.now(dt.timezone.utc)
    checker.write(half_record("late"), half_record("patient", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "20"}),
                  stored_at=wall - 30 * SECOND)
    checker.write(half_record("aging", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "3595"}),
                  stored_at=wall - 3590 * SECOND)  # a first check in 5 s, expired in 10 s: before a second
    clock = wall - 30 * SECOND
    checker.run(now=clock)
    steps_taken = defaultdict(list)
    for _ in range(12):  # eight steps, and a few batches of overdue ones
        if not checker.memory.pending:
            break
        now_us = clock_us(clock)
        remembered = {p.transaction_id: (p.checks, next_step(config, p.stored_us, p.immunity_ms, p.checks,
                                                             p.last_check_us, now_us))
                      for p in checker.memory.pending.values()}
        listed = {t.transaction_id: (t.checks, t.next_step, clock_us(t.next_step_at))
                  for t in pending_transactions(config, now=clock)}
        assert listed == {i: (checks, step.action, step.at_us) for i, (checks, step) in remembered.items()}

        clock = max(clock, clock_time(min(step.at_us for _, step in remembered.values())))  # the first step due
        discarded_before = {row.transaction_id for row in checker.rows("discarded")}
        checker.run(now=clock)
        discarded = {row.transaction_id for row in checker.rows("discarded")} - discarded_before
        for transaction_id, (checks, step) in remembered.items():
            after = checker.memory.pending.get(transaction_id)
            taken = (CHECK if after is not None and after.checks == checks + 1 else
                     DISCARD if after is None and transaction_id in discarded else None)
            assert taken == (step.action if step.at_us <= clock_us(clock) else None), transaction_id
            if taken:
                steps_taken[transaction_id].append(taken)

    assert steps_taken == {"late": [CHECK, CHECK, DISCARD], "patient": [CHECK, CHECK, DISCARD], "aging": [CHECK, DISCARD]}
    reasons = {row.transaction_id: row.reason for row in checker.rows("discarded")}
    assert reasons == {"aging": EXPIRED, "late": "checked 2 times without an answer",
                       "patient": "checked 2 times without an answer"}
