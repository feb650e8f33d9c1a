"""``txcoord pending``: hanging transactions, their checks so far and the checker's next step (no JVM)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from coordinator.cli import main
from coordinator.ops.pending import CHECK, DISCARD, pending_transactions
from tests.conftest import end_record, half_record, stored_time

SECOND = dt.timedelta(seconds=1)


@pytest.fixture
def hanging(checker):
    """After two batches: "late" (group g) checked once, "patient" (group other, one-hour immunity)
    never checked, "done" committed. All were stored 30 s ago; the first batch ran 1 s after,
    the second 7 s after."""
    stored_at = dt.datetime.now(dt.timezone.utc) - 30 * SECOND
    checker.write(half_record("late"), half_record("done"), stored_at=stored_at)
    checker.write(half_record("patient", group="other", topic="U", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "3600"}),
                  stored_at=stored_at)  # in group other's own log
    checker.write(end_record("done"), stored_at=stored_at)
    checker.run(now=stored_at + SECOND)
    checker.stored = stored_time(checker, "late")
    checker.run(now=checker.stored + 7 * SECOND)
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
    assert (late.checks, late.last_check_at, late.addressed_to) == (1, hanging.stored + 7 * SECOND, None)
    assert (late.next_step, late.next_step_at) == (CHECK, hanging.stored + 67 * SECOND)  # the 60 s interval
    assert late.age_s == pytest.approx(10.0)
    assert (patient.transaction_id, patient.checks, patient.next_step) == ("patient", 0, CHECK)
    assert patient.next_step_at == patient.stored_at + 3600 * SECOND  # its own immunity

    assert [t.transaction_id for t in pending_transactions(hanging.config, group="other", now=now)] == ["patient"]
    assert pending_transactions(hanging.config, older_than_s=3600, now=now) == []


def test_the_last_check_is_followed_by_a_discard(hanging):
    from dataclasses import replace

    config = replace(hanging.config, transaction_check_max=1)
    [late] = pending_transactions(config, group="g", now=hanging.stored + 8 * SECOND)
    assert (late.next_step, late.next_step_at) == (DISCARD, hanging.stored + 67 * SECOND)


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
