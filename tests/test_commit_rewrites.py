"""Commit logs are append-only in fact (docs/design.md#hostile-input, docs/known-limits.md): the bucket policy
refuses a tenant's overwrite of a commit where the server evaluates ``s3:if-none-match`` (AWS S3), and wherever
it does not, the checker's digest of every commit it read (``system/commits_read``) lets ``txcoord inspect``
flag a commit rewritten since. Batches run on the driver alone (no JVM), as the checker runs them."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import shutil
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import end_record, half_record
from support.batches import ManualChecker
from support.poisons import PoisonedLog
from support.servers import require_s3_server
from coordinator.lakehouse import Lakehouse, delta_log_file, read_table
from coordinator.ops.audit import outcome, transaction_timeline
from coordinator.tables import COMMIT_LOG, COMMITS_READ
from tests.test_cli import txcoord

TENANT = "mallory"
ROLLBACK = "ROLLBACK_MESSAGE"


def forged_commit(log: PoisonedLog, record: dict) -> bytes:
    """A well-formed commit adding a data file of ``record``, written into ``log``'s directory as its tenant can."""
    columns = {name: [record.get(name)] for name in COMMIT_LOG.column_names}
    columns["properties"] = [list((record.get("properties") or {}).items())]
    data = io.BytesIO()
    pq.write_table(pa.table(columns, schema=COMMIT_LOG.arrow_schema()), data)
    return json.dumps({"add": {"path": log.data_file(data.getvalue()), "size": len(data.getvalue()),
                               "partitionValues": {}, "modificationTime": 0, "dataChange": True}}).encode()


def steps(lakehouse, transaction_id: str) -> dict[str, list[str]]:
    by_step: dict[str, list[str]] = {}
    for event in transaction_timeline(lakehouse, transaction_id):
        by_step.setdefault(event.step, []).append(event.detail)
    return by_step


def test_the_checker_keeps_the_digest_of_every_commit_it_read_once_even_replayed(config):
    shutil.rmtree(Lakehouse(config.lakehouse).path(COMMITS_READ))  # a lakehouse made before: the first write makes it
    batches = ManualChecker(config)
    transaction_id = f"t-{uuid.uuid4().hex[:8]}"
    half = batches.write(half_record(transaction_id, group=TENANT, topic="ORDERS"))
    end = batches.write(end_record(transaction_id, group=TENANT))
    batches.run()
    batches.replay()  # a batch Spark replays after a crash writes nothing twice

    log_dir = f"{config.lakehouse}/groups/{TENANT}/commit_log"
    rows = read_table(Lakehouse(config.lakehouse).path(COMMITS_READ)).to_pylist()
    assert sorted((row["commit_version"], row["transaction_id"]) for row in rows) == [(half, transaction_id),
                                                                                      (end, transaction_id)]
    for row in rows:
        with open(f"{log_dir}/{delta_log_file(row['commit_version'])}", "rb") as commit:
            data = commit.read()
        assert (row["sha256"], row["bytes"]) == (hashlib.sha256(data).hexdigest(), len(data))
        assert row["commit_log"] == f"groups/{TENANT}/commit_log" and row["batch_id"] == 0


def test_inspect_flags_a_commit_rewritten_after_the_checker_read_it_and_not_an_untouched_one(config, tmp_path):
    """The issue's forgery: a tenant turns its rolled-back transaction's END into a COMMIT after the checker read it."""
    batches = ManualChecker(config)
    forged, untouched = f"forged-{uuid.uuid4().hex[:8]}", f"untouched-{uuid.uuid4().hex[:8]}"
    for transaction_id in (forged, untouched):
        batches.write(half_record(transaction_id, group=TENANT, topic="ORDERS"))
    end = batches.write(end_record(forged, ROLLBACK, group=TENANT))
    batches.write(end_record(untouched, ROLLBACK, group=TENANT))
    batches.run()
    assert [e.detail for e in transaction_timeline(config.lakehouse, forged) if e.step == "end request"] == [
        f"{ROLLBACK} from the producer"]

    log = PoisonedLog(Lakehouse(config.lakehouse), TENANT)
    log.files.put(f"{log.key}/{delta_log_file(end)}", forged_commit(log, end_record(forged, group=TENANT)))

    flagged = steps(config.lakehouse, forged)
    assert flagged["end request"] == ["COMMIT_MESSAGE from the producer"]  # what the log holds now
    assert outcome(transaction_timeline(config.lakehouse, forged)) == "ROLLBACK"  # what the checker decided
    [rewritten] = flagged["commit rewritten"]
    assert rewritten.startswith(f"commit {end} of groups/{TENANT}/commit_log REWRITTEN since the checker read it")
    [half_commit] = flagged["commit read"]
    assert "as the checker read it, unchanged" in half_commit
    untouched_steps = steps(config.lakehouse, untouched)
    assert "commit rewritten" not in untouched_steps and len(untouched_steps["commit read"]) == 2

    conf = tmp_path / "coordinator.toml"
    conf.write_text(f"lakehouse = {json.dumps(config.lakehouse)}\n")
    shown = txcoord("inspect", forged, "--config", str(conf))
    assert shown.returncode == 0, shown.stderr
    assert "REWRITTEN since the checker read it" in shown.stdout and "1 commit(s) holding" in shown.stdout
    listed = json.loads(txcoord("inspect", untouched, "--config", str(conf), "--json").stdout)
    assert [e["step"] for e in listed["events"]].count("commit read") == 2
    assert all(e["step"] != "commit rewritten" for e in listed["events"])


def test_a_commit_gone_since_is_shown_as_read_never_as_rewritten(config):
    """Maintenance removes the commits the checker is done with: their digests stay, with nothing to compare."""
    batches = ManualChecker(config)
    transaction_id = f"t-{uuid.uuid4().hex[:8]}"
    half = batches.write(half_record(transaction_id, group=TENANT, topic="ORDERS"))
    batches.run()
    Lakehouse(config.lakehouse).files.delete(f"groups/{TENANT}/commit_log/{delta_log_file(half)}")

    [gone] = steps(config.lakehouse, transaction_id)["commit read"]
    assert f"commit {half} of groups/{TENANT}/commit_log" in gone and "gone since" in gone


def test_the_policy_refuses_every_commit_logs_writer_an_overwrite_and_nothing_else():
    from coordinator.ops.tenancy import access_plan, s3_bucket_policy

    accounts = {"checker": ["svc-checker"], "operators": ["ops"], "analysts": ["bi"], "group order_group": ["svc-o"]}
    policy = s3_bucket_policy("s3://bucket/lh", accounts)
    denies = {statement["Principal"]["AWS"][0]: statement for statement in policy["Statement"]
              if statement["Effect"] == "Deny"}
    assert sorted(denies) == ["ops", "svc-o"]
    for account, log in (("ops", "operators/commit_log"), ("svc-o", "groups/order_group/commit_log")):
        assert denies[account]["Action"] == ["s3:PutObject"]
        assert denies[account]["Condition"] == {"Null": {"s3:if-none-match": "true"}}
        [pattern] = [resource.removeprefix("arn:aws:s3:::bucket/") for resource in denies[account]["Resource"]]
        # A commit is covered; what is replaced on purpose (the checkpoint and its pointer) and data files are not.
        assert fnmatch.fnmatchcase(f"lh/{log}/_delta_log/{0:020d}.json", pattern)
        for replaced in (f"_delta_log/{1000:020d}.checkpoint.parquet", "_delta_log/_last_checkpoint",
                         "part-00000-1.snappy.parquet"):
            assert not fnmatch.fnmatchcase(f"lh/{log}/{replaced}", pattern)
    assert not any(s["Effect"] == "Deny" for s in s3_bucket_policy("s3://bucket/lh", accounts,
                                                                   refuse_overwrites=False)["Statement"])
    # The checker's tables, digests included, are the checker's alone to write.
    assert [g.principal for g in access_plan(["order_group"]) if "write" in g.access
            and f"{COMMITS_READ.name}/".startswith(g.prefix)] == ["checker"]


@pytest.mark.object_store
def test_versitygw_refuses_the_printed_policy_and_inspect_flags_what_it_lets_a_tenant_overwrite(tmp_path):
    """Measured on the loopback server (versitygw 1.8.0): it evaluates a policy's conditions but refuses a policy
    naming ``s3:if-none-match`` whole (MalformedPolicy), so a tenant's overwrite is not refused there and the
    digests alone tell it. Should a later server take the policy, this test fails: test the refusal instead."""
    import boto3
    from botocore.exceptions import ClientError

    from coordinator.checker.batch import run_batch
    from coordinator.checker.segment import Segment, grown_to
    from coordinator.checker.batch import BatchRunner
    from coordinator.config import CoordinatorConfig
    from coordinator.producer.commit_log import CommitLogWriter
    from coordinator.conformance.versitygw import S3Server

    require_s3_server()
    root = "s3://rewrites/lh"
    with S3Server(tmp_path / "data", with_accounts=True) as server:
        server.create_bucket("rewrites")
        storage = {principal: server.create_account(name, f"{name}-secret") for principal, name in
                   (("checker", "svc-checker"), ("operators", "ops-alice"), (TENANT, "svc-mallory"))}
        owner = tmp_path / "owner.toml"
        owner.write_text(f'lakehouse = "{root}"\n[storage]\n'
                         + "".join(f'{key} = "{value}"\n' for key, value in server.storage_options.items()))
        for command in (["init"], ["add-group", TENANT]):
            assert txcoord(*command, "--config", str(owner)).returncode == 0
        accounts = ["--account=checker=svc-checker", "--account=operators=ops-alice", f"--account={TENANT}=svc-mallory"]
        bucket = boto3.client("s3", endpoint_url=server.endpoint, region_name=server.storage_options["aws_region"],
                              aws_access_key_id=server.storage_options["aws_access_key_id"],
                              aws_secret_access_key=server.storage_options["aws_secret_access_key"])

        printed = json.loads(txcoord("grants", "--config", str(owner), "--json", *accounts).stdout)["s3_bucket_policy"]
        with pytest.raises(ClientError, match="invalid condition key"):
            bucket.put_bucket_policy(Bucket="rewrites", Policy=json.dumps(printed))
        allowing = txcoord("grants", "--config", str(owner), "--json", "--allow-overwrites", *accounts)
        bucket.put_bucket_policy(Bucket="rewrites", Policy=json.dumps(json.loads(allowing.stdout)["s3_bucket_policy"]))

        tenant = Lakehouse(root, storage[TENANT])
        transaction_id = f"t-{uuid.uuid4().hex[:8]}"
        with CommitLogWriter(tenant, TENANT) as producer:  # a producer still commits under the policy
            producer.submit([half_record(transaction_id, group=TENANT, topic="ORDERS")]).result()
            producer.submit([end_record(transaction_id, ROLLBACK, group=TENANT)]).result()
        checker = Lakehouse(root, storage["checker"])
        segment = Segment({}, grown_to(checker, {}), 0)
        records = segment.records(checker)
        run_batch(CoordinatorConfig(lakehouse=root, storage=storage["checker"]), records, 0, runner=BatchRunner())
        end = segment.ends[f"groups/{TENANT}/commit_log"] - 1

        log = PoisonedLog(tenant, TENANT)
        log.files.put(f"{log.key}/{delta_log_file(end)}", forged_commit(log, end_record(transaction_id, group=TENANT)))

        by_step = steps(Lakehouse(root, storage["operators"]), transaction_id)
        assert by_step["end request"] == ["COMMIT_MESSAGE from the producer"]
        [rewritten] = by_step["commit rewritten"]
        assert rewritten.startswith(f"commit {end} of groups/{TENANT}/commit_log REWRITTEN since the checker read it")
