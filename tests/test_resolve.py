"""``txcoord resolve``: an operator ends a hanging transaction through the commit log (no JVM)."""

from __future__ import annotations

import json

import pytest

from coordinator.cli import main
from coordinator.exceptions import InvalidArgumentError
from coordinator.lakehouse import topic_names
from coordinator.ops.audit import outcome, transaction_timeline
from coordinator.ops.resolve import resolve_transaction
from coordinator.protocol import LocalTransactionState
from support import end_record, half_record
from support.producer_side import commit_log_version

OPERATORS_LOG = "operators/commit_log"  # where `txcoord resolve` writes its decisions


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
    assert [(r.transaction_id, bytes(r.body)) for r in checker.rows("T")] == [("stuck", b"the order")]
    assert len(checker.rows("rejected")) == 0

    events = transaction_timeline(checker.config.lakehouse, "stuck")
    assert outcome(events) == "COMMIT"
    [end] = [e for e in events if e.step == "end request"]
    assert "from operator" in end.detail and end.detail.endswith(": paid, confirmed by phone")
    [resolved] = [e for e in events if e.step == "resolved"]
    assert resolved.detail.startswith("COMMIT by the operator (operator-")

    version = commit_log_version(checker.config.lakehouse, OPERATORS_LOG)
    assert main(["resolve", "stuck", "--rollback", "--reason", "second thoughts", "--config", config_file]) == 2
    assert "already resolved: COMMIT" in capsys.readouterr().err
    assert commit_log_version(checker.config.lakehouse, OPERATORS_LOG) == version  # nothing written

    assert main(["resolve", "other", "--rollback", "--reason", "cancelled", "--json", "--config", config_file]) == 0
    sent = json.loads(capsys.readouterr().out)
    assert (sent["state"], sent["properties"]["TXCOORD_OPERATOR_REASON"]) == ("ROLLBACK_MESSAGE", "cancelled")
    checker.run()
    assert outcome(transaction_timeline(checker.config.lakehouse, "other")) == "ROLLBACK"
    assert len(checker.rows("T")) == 1


def test_a_discarded_transaction_can_be_committed_once_and_is_then_delivered_once(checker, config_file, capsys):
    from coordinator.ops.status import read_status

    checker.discard("gone", messages=2)
    version = commit_log_version(checker.config.lakehouse, OPERATORS_LOG)
    assert main(["resolve", "gone", "--rollback", "--reason", "drop it", "--config", config_file]) == 2
    assert "was discarded: it was never delivered" in capsys.readouterr().err
    assert commit_log_version(checker.config.lakehouse, OPERATORS_LOG) == version

    assert main(["resolve", "gone", "--commit", "--reason", "paid after all", "--config", config_file]) == 0
    checker.write(end_record("gone", check_id="operator-forged"))  # a second operator COMMIT, sent by hand
    checker.run()
    checker.replay()  # a crash after the writes: the replay delivers nothing twice

    assert sorted(bytes(r.body) for r in checker.rows("T")) == [b"gone 0", b"gone 1"]
    assert sorted((r.outcome, r.half_offset) for r in checker.rows("op")) == sorted(
        (outcome, r.queue_offset) for r in checker.rows("half") for outcome in ("DISCARD", "COMMIT"))
    assert [r.reason for r in checker.rows("rejected")] == ["discarded transaction already committed by an operator"]
    assert outcome(transaction_timeline(checker.config.lakehouse, "gone")) == "COMMIT"
    status = read_status(checker.config)
    assert (status.discarded, status.recovered) == (1, 1)

    assert main(["resolve", "gone", "--commit", "--reason", "again", "--config", config_file]) == 2
    assert "committed by an operator: it is resolved for good" in capsys.readouterr().err
    checker.restart()  # a restarted checker knows it from the tables
    checker.write(end_record("gone", check_id="operator-forged-2"), end_record("gone", state="ROLLBACK_MESSAGE",
                                                                               check_id="operator-forged-3"))
    checker.run()
    assert len(checker.rows("T")) == 2
    assert sorted(r.reason for r in checker.rows("rejected")) == [
        "discarded transaction already committed by an operator", "discarded transaction already committed by an operator",
        "transaction already resolved"]


def test_only_an_operators_commit_recovers_a_discarded_transaction(checker):
    checker.discard("gone", "left")
    checker.write(end_record("gone"), end_record("gone", check_id="gone-1"))  # the producer's, late: not a recovery
    checker.write(end_record("left", check_id="operator-x", group="intruder"))  # in the operators' log
    checker.run()
    assert topic_names(checker.config.lakehouse) == []  # nothing delivered
    assert sorted(r.reason for r in checker.rows("rejected")) == [
        "producer group does not own the transaction", "transaction already resolved", "transaction already resolved"]


def test_an_unknown_resolved_or_unreasoned_resolution_is_refused_and_writes_nothing(checker, config_file, capsys):
    checker.write(half_record("done"), half_record("stuck"))
    checker.write(end_record("done"))
    checker.run()
    version = commit_log_version(checker.config.lakehouse, OPERATORS_LOG)

    for argv, message in [
        (["resolve", "done", "--commit", "--reason", "found it"], "already resolved: COMMIT"),
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
    assert commit_log_version(checker.config.lakehouse, OPERATORS_LOG) == version
