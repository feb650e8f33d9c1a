"""``txcoord resolve``: an operator ends a hanging transaction through the commit log (no JVM)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from coordinator.cli import main
from coordinator.exceptions import InvalidArgumentError
from coordinator.ops.audit import outcome, transaction_timeline
from coordinator.ops.resolve import resolve_transaction
from coordinator.protocol import LocalTransactionState
from tests.conftest import half_record, stored_time
from tests.producer_side import commit_log_version

SECOND = dt.timedelta(seconds=1)


@pytest.fixture
def config_file(checker, tmp_path):
    path = tmp_path / "coordinator.toml"
    path.write_text(f"lakehouse = '{checker.config.lakehouse}'\n")
    return str(path)


def test_an_operators_commit_is_delivered_once_and_shown_with_its_reason(checker, config_file, capsys):
    checker.write(half_record("stuck", body=b"the order"), half_record("other"))
    checker.run()

    assert main(["resolve", "stuck", "--commit", "--reason", "paid, confirmed by phone", "--config", config_file]) == 0
    assert "COMMIT_MESSAGE of transaction stuck (group g)" in capsys.readouterr().out
    checker.run()
    assert [(r.transaction_id, bytes(r.body)) for r in checker.table("T").collect()] == [("stuck", b"the order")]
    assert checker.table("rejected").count() == 0

    events = transaction_timeline(checker.config.lakehouse, "stuck")
    assert outcome(events) == "COMMIT"
    [end] = [e for e in events if e.step == "end request"]
    assert "from operator" in end.detail and end.detail.endswith(": paid, confirmed by phone")
    [resolved] = [e for e in events if e.step == "resolved"]
    assert resolved.detail.startswith("COMMIT by the operator (operator-")

    version = commit_log_version(checker.config.lakehouse)
    assert main(["resolve", "stuck", "--rollback", "--reason", "second thoughts", "--config", config_file]) == 2
    assert "already resolved: COMMIT" in capsys.readouterr().err
    assert commit_log_version(checker.config.lakehouse) == version  # nothing written

    assert main(["resolve", "other", "--rollback", "--reason", "cancelled", "--json", "--config", config_file]) == 0
    sent = json.loads(capsys.readouterr().out)
    assert (sent["state"], sent["properties"]["TXCOORD_OPERATOR_REASON"]) == ("ROLLBACK_MESSAGE", "cancelled")
    checker.run()
    assert outcome(transaction_timeline(checker.config.lakehouse, "other")) == "ROLLBACK"
    assert checker.table("T").count() == 1


def test_a_discarded_an_unknown_or_unreasoned_resolution_is_refused_and_writes_nothing(checker, config_file, capsys):
    from dataclasses import replace

    checker.config = replace(checker.config, transaction_check_max=1)
    checker.write(half_record("gone"), half_record("stuck"))
    checker.run()
    stored = stored_time(checker, "gone")
    checker.run(now=stored + 7 * SECOND)
    checker.run(now=stored + 68 * SECOND)  # one check was the maximum: both discarded
    version = commit_log_version(checker.config.lakehouse)

    for argv, message in [
        (["resolve", "gone", "--commit", "--reason", "found it"], "was discarded"),
        (["resolve", "nobody", "--commit", "--reason", "x"], "no pending transaction nobody"),
        (["resolve", "stuck", "--commit", "--reason", "   "], "give a reason"),
    ]:
        assert main([*argv, "--config", config_file]) == 2, argv
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # neither --commit nor --rollback
        main(["resolve", "stuck", "--reason", "x", "--config", config_file])
    assert exited.value.code == 2
    with pytest.raises(InvalidArgumentError, match="COMMIT_MESSAGE or ROLLBACK_MESSAGE"):
        resolve_transaction(checker.config, "stuck", LocalTransactionState.UNKNOW, "x")
    assert commit_log_version(checker.config.lakehouse) == version
