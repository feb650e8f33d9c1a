"""What a group can write into its own commit log costs that log alone (docs/design.md#hostile-input): bytes that
cannot be read, parsed, typed or placed are refused into ``system/rejected`` with the reason, the log and the
version, the batch goes on, another group's transaction in the same batch is delivered, and a replay refuses
the same way. Batches are run on the driver alone (no JVM), as the checker runs them."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pyarrow.compute as pc
import pytest

from support import end_record, half_record
from support.batches import ManualChecker, stored_time
from support.poisons import INSTANCE_POISONS, POISONS, PoisonedLog
from coordinator.lakehouse import Lakehouse, read_table

HOSTILE = "mallory"


@pytest.fixture
def batches(config) -> ManualChecker:
    return ManualChecker(config)


def honest_commit(batches: ManualChecker) -> str:
    """A transaction of group ``alice``, half and commit in one batch."""
    transaction_id = f"alice-{uuid.uuid4().hex[:8]}"
    batches.write(half_record(transaction_id, group="alice", topic="ORDERS"))
    batches.write(end_record(transaction_id, group="alice"))
    return transaction_id


def rejected_from(batches: ManualChecker) -> list[dict]:
    return [row for row in read_table(batches.path("rejected")).to_pylist() if row["commit_log"] and HOSTILE in row["commit_log"]]


def delivered(batches: ManualChecker, transaction_id: str) -> int:
    return read_table(batches.path("ORDERS"), filter=pc.field("transaction_id") == transaction_id).num_rows


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_version_is_refused_for_its_log_alone_and_the_batch_goes_on(batches, config, poison):
    version = POISONS[poison].write(PoisonedLog(Lakehouse(config.lakehouse), HOSTILE))
    honest = honest_commit(batches)

    batches.run()

    assert delivered(batches, honest) == 1
    [refused] = rejected_from(batches)
    assert POISONS[poison].reason in refused["reason"] and refused["commit_version"] == version
    assert refused["commit_log"] == f"groups/{HOSTILE}/commit_log"
    batches.replay()  # a replay refuses the same, and writes nothing twice
    assert rejected_from(batches) == [refused] and delivered(batches, honest) == 1


def test_a_poisoned_version_between_good_ones_costs_only_itself(batches, config):
    log = PoisonedLog(Lakehouse(config.lakehouse), HOSTILE)
    log.records(half_record("m-1", group=HOSTILE, topic="ORDERS"))
    bad = log.commit(b"\x00\xff")
    log.records(end_record("m-1", group=HOSTILE))

    batches.run()

    assert delivered(batches, "m-1") == 1
    assert [row["commit_version"] for row in rejected_from(batches)] == [bad]


def test_a_commit_that_names_protocol_1_is_read_and_one_naming_another_is_refused_whole(batches, config):
    log = PoisonedLog(Lakehouse(config.lakehouse), HOSTILE)
    log.records(half_record("p-1", group=HOSTILE, topic="ORDERS"), commit_info={"txcoordProtocol": 1})
    refused = log.records(half_record("p-2", group=HOSTILE, topic="ORDERS"), end_record("p-2", group=HOSTILE),
                          commit_info={"txcoordProtocol": 2, "engineInfo": "a client from the future"})
    log.records(end_record("p-1", group=HOSTILE), commit_info={"engineInfo": "no protocol named: 1"})

    batches.run()

    assert delivered(batches, "p-1") == 1 and delivered(batches, "p-2") == 0
    assert [(row["commit_version"], row["transaction_id"], row["reason"]) for row in rejected_from(batches)] == [
        (refused, None, "unsupported client protocol 2: this checker reads protocol 1")]


def test_files_that_are_no_instance_records_cost_their_group_alone_and_are_removed(batches, config):
    lakehouse = Lakehouse(config.lakehouse)
    log = PoisonedLog(lakehouse, HOSTILE)
    written = {log.instance_record(f"{index}.json", make(HOSTILE)): reason
               for index, (make, reason) in enumerate(INSTANCE_POISONS.values())}
    another_groups = json.dumps({"group": "alice", "instance_id": "i-4", "host": "h", "pid": 1, "last_seen": 1.0,
                                 "heartbeat_s": 2.0}).encode()
    written[log.instance_record("i-4.json", another_groups)] = "names group 'alice'"
    for group in (HOSTILE, "alice"):
        batches.write(half_record(f"{group}-t", group=group, topic="ORDERS"))
    batches.run()

    batches.run(now=stored_time(batches, "alice-t") + dt.timedelta(seconds=7))  # both due for their first check

    checked = read_table(batches.path("check_requests")).column("transaction_id").to_pylist()
    assert sorted(checked) == ["alice-t", f"{HOSTILE}-t"]
    refused = {row["commit_log"]: row["reason"] for row in rejected_from(batches)}
    assert sorted(refused) == sorted(written)
    assert all(reason.startswith("not a producer instance's record") and written[key] in reason
               for key, reason in refused.items())
    assert lakehouse.files.list(f"{lakehouse.group_dir(HOSTILE)}/_producers") == []


@pytest.mark.parametrize("poison", ["a commit that is not JSON", "JSON nested beyond parsing"])
def test_maintain_reports_a_log_it_cannot_maintain_and_maintains_the_others(batches, config, tmp_path, capsys, poison):
    """delta-rs cannot load such a log; handed the nested one, it would die of SIGSEGV, and this test with it."""
    from coordinator.cli import main

    honest_commit(batches)
    POISONS[poison].write(PoisonedLog(Lakehouse(config.lakehouse), HOSTILE))
    conf = tmp_path / "coordinator.toml"
    conf.write_text(f"lakehouse = {json.dumps(config.lakehouse)}\n")

    code = main(["maintain", "--config", str(conf), "--json"])

    out, err = capsys.readouterr()
    results = {table["table"]: table for table in json.loads(out)["tables"]}
    assert code == 1 and f"groups/{HOSTILE}/commit_log could not be maintained" in err
    assert results[f"groups/{HOSTILE}/commit_log"]["failed"]
    assert results["groups/alice/commit_log"]["failed"] is None and results["groups/alice/commit_log"]["version"] >= 2


def test_the_operator_tools_read_past_a_poisoned_log(batches, config, tmp_path, capsys):
    from coordinator.cli import main
    from coordinator.ops.audit import transaction_timeline

    honest = honest_commit(batches)
    POISONS["JSON nested beyond parsing"].write(PoisonedLog(Lakehouse(config.lakehouse), HOSTILE))
    batches.run()
    conf = tmp_path / "coordinator.toml"
    conf.write_text(f"lakehouse = {json.dumps(config.lakehouse)}\n")

    [unreadable] = transaction_timeline(config.lakehouse, "never-sent")  # every log is searched for an unknown id
    assert (unreadable.step, unreadable.table) == ("log unreadable", f"groups/{HOSTILE}/commit_log")
    assert [e.step for e in transaction_timeline(config.lakehouse, honest)][-1] == "delivered"
    for command in (["inspect", "never-sent"], ["inspect", honest], ["pending"]):
        assert main([*command, "--config", str(conf)]) == 0, command
    assert main(["status", "--config", str(conf)]) == 1  # as it says: no checker runs
    out = capsys.readouterr().out
    assert "log unreadable" in out and "rejected       1 record(s)" in out


def test_the_poisoning_tenant_counts_what_the_checker_refused(batches, config):
    from support.poisons import PoisoningTenant

    tenant = PoisoningTenant(Lakehouse(config.lakehouse), "mallory", every_s=3.0)
    tenant.start()
    tenant.stop()  # after its first round
    assert len(tenant.written) >= len(POISONS) and tenant.refused(Lakehouse(config.lakehouse)) == 0

    batches.run()

    assert tenant.refused(Lakehouse(config.lakehouse)) == len(tenant.written)
