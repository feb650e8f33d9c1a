"""The lakehouse on Azure (an ``abfss://`` location), against Azurite, the Azure Storage emulator, on
loopback (``scripts/azurite.py``): the conditional writes (``If-None-Match: *``, ``If-Match``), the
lease and progress record, producers through the API, the checker's batch logic and check-back, the
``txcoord`` tools, and the checker job itself, its streaming checkpoint written by Hadoop's ABFS
connector through Azurite's Blob endpoint (Azurite serves no DFS endpoint)."""

from __future__ import annotations

import base64
import datetime as dt
import json

import pytest

from coordinator import LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.cli import main
from coordinator.commit_logs import CommitLogRef
from coordinator.config import CoordinatorConfig
from coordinator.control.lease import CheckerLease
from coordinator.control.progress import CheckerProgress, StreamingCheckpoint
from coordinator.exceptions import AccessDeniedError, CheckerAlreadyRunningError, InvalidArgumentError, LeaseLostError
from coordinator.lakehouse import Lakehouse, delta_log_file, open_table, read_table
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.storage import FileStore
from coordinator.tables import CHECK_REQUESTS, OP
from support import Clock, half_record, wait_until
from support.batches import ManualChecker
from support.checker import CheckerJob, write_config
from support.lakehouse import SteadyProducer
from tests.test_object_storage import race
# The S3 tests' own bodies, run here on Azure (named so that pytest does not collect them twice).
from tests.test_object_storage import test_a_file_is_created_once_and_replaced_only_at_the_version_read as files_as_on_s3
from tests.test_object_storage import test_a_stale_checker_fails_its_next_batch_announcement as progress_as_on_s3

UTC = dt.timezone.utc


def test_a_file_is_created_once_and_replaced_only_at_the_version_read(azure_lakehouse):
    """Of 8 writers creating one file, one wins and seven are told it exists; of 8 replacing it at the version
    read, one wins: the same contract as on S3, asserted by the same code."""
    files_as_on_s3(azure_lakehouse)
    assert azure_lakehouse.files.location("x/one.json") == f"{azure_lakehouse.root}/x/one.json"


def test_two_writers_of_one_commit_log_version_one_wins_and_the_other_is_told(azure_lakehouse):
    """The appender's commit is a conditional create of the version's log file: of two writers aiming at
    the same version, one lands it; the other gets None and takes the next version."""
    with CommitLogWriter(azure_lakehouse, "g") as writer:
        assert writer.submit([half_record("t")]).result() == 1
    key = f"{CommitLogRef.of_group('g').key}/{delta_log_file(2)}"
    won = race(2, lambda i: azure_lakehouse.files.create(key, f'{{"commitInfo": {{"writer": {i}}}}}\n'.encode()))
    assert sorted(version is None for version in won) == [False, True]

    with CommitLogWriter(azure_lakehouse, "g") as first, CommitLogWriter(azure_lakehouse, "g") as second:
        futures = [(first if i % 2 else second).submit([half_record(f"t{i}")]) for i in range(12)]
        versions = [future.result() for future in futures]
    committed = sorted(set(versions))
    assert committed == list(range(3, 3 + len(committed)))  # after the raced version 2, each its own, none lost
    log = read_table(azure_lakehouse.commit_log("g"), ["transaction_id"], storage=azure_lakehouse.storage)
    assert sorted(log.column(0).to_pylist()) == sorted(["t", *(f"t{i}" for i in range(12))])


def test_the_lease_is_taken_once_and_over_only_after_expiry(azure_lakehouse):
    clock = Clock()
    first = CheckerLease(azure_lakehouse, ttl_s=1.0, clock=clock).acquire()
    with pytest.raises(CheckerAlreadyRunningError, match=r"abfss://lakehouse@.*_checker_lease.json"):
        CheckerLease(azure_lakehouse, ttl_s=1.0, clock=clock).acquire()
    clock.now += 1.1  # no renewal for longer than the lease lives: the holder stalled

    def take(_):
        try:
            return CheckerLease(azure_lakehouse, ttl_s=1.0, clock=clock).acquire()
        except CheckerAlreadyRunningError:
            return None

    [successor] = [lease for lease in race(6, take) if lease is not None]  # of six racing, exactly one
    with pytest.raises(LeaseLostError):
        first.renew()
    successor.release()
    CheckerLease(azure_lakehouse, ttl_s=1.0, clock=clock).acquire()  # released: taken at once


def test_a_stale_checker_fails_its_next_progress_record(azure_lakehouse):
    """The progress record is replaced only at the version read: a checker whose lease was taken over is refused."""
    progress_as_on_s3(azure_lakehouse)


class Orders(TransactionListener):
    """Commits ``paid``, rolls back ``refused``, and leaves ``unsure`` to check-back, which commits it."""

    def execute_local_transaction(self, msg, arg):
        return {"paid": LocalTransactionState.COMMIT_MESSAGE, "refused": LocalTransactionState.ROLLBACK_MESSAGE,
                "unsure": LocalTransactionState.UNKNOW}[arg]

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def test_transactions_end_to_end_through_the_producer_api_the_batches_and_check_back(azurite, azure_lakehouse):
    """Producers send through the API; the checker's batches (run on the driver as the streaming query runs
    them) deliver the committed, drop the rolled back, ask the group about the unsure one, and deliver it
    once the producer's check-back answers; a replayed batch delivers nothing twice."""
    config = CoordinatorConfig(lakehouse=azure_lakehouse.root, storage=azurite.storage_options,
                               transaction_check_interval_ms=1000)
    checker = ManualChecker(config)
    producer = TransactionProducer("g", Orders(), config)
    producer.start()
    try:
        sent = {arg: producer.send_message_in_transaction(Message(topic="ORDERS", body=arg.encode()), arg)
                for arg in ("paid", "refused", "unsure")}
        first = checker.run()
        assert (first.halves, first.delivered) == (3, 1)
        assert checker.replay().delivered == 1  # Spark replaying the batch after a crash
        assert azure_lakehouse.read("topics/ORDERS", ["body"]).to_pylist() == [{"body": b"paid"}]  # once

        checked_at = dt.datetime.now(UTC) + dt.timedelta(seconds=7)
        checker.run(now=checked_at)  # past the immunity time: a check
        [request] = azure_lakehouse.read(CHECK_REQUESTS, ["transaction_id"]).to_pylist()
        assert request == {"transaction_id": sent["unsure"].transaction_id}
        wait_until(lambda: _answered(azure_lakehouse, sent["unsure"].transaction_id), what="check-back's answer")
        checker.run(now=max(checked_at, dt.datetime.now(UTC)))  # a batch clock never goes back
    finally:
        producer.shutdown()
    assert sorted(azure_lakehouse.read("topics/ORDERS", ["body"]).column(0).to_pylist()) == [b"paid", b"unsure"]
    outcomes = {row["transaction_id"]: row["outcome"] for row in azure_lakehouse.read(OP, ["transaction_id", "outcome"]).to_pylist()}
    assert outcomes == {sent["paid"].transaction_id: "COMMIT", sent["refused"].transaction_id: "ROLLBACK",
                        sent["unsure"].transaction_id: "COMMIT"}
    assert azure_lakehouse.files.list("groups/g/_producers") == []  # the instance withdrew


@pytest.mark.slow
def test_the_checker_job_keeps_its_checkpoint_in_the_container_and_delivers_each_commit_once(azure_lakehouse, tmp_path):
    """`spark-submit jobs/checker.py`, configured by its TOML alone, on the ``abfss://`` lakehouse: its streaming
    checkpoint goes into the container through ABFS, a producer's commit is delivered and its rollback not;
    stopped and started again, the checker resumes from that checkpoint and delivers the next commit, each once."""
    config_path = write_config(azure_lakehouse, str(tmp_path), trigger_interval_ms=200)
    config = CoordinatorConfig.load(config_path, environ={})
    checkpoint = azure_lakehouse.checker_checkpoint
    producer = TransactionProducer("g", Orders(), config)
    producer.start()
    try:
        for run, orders in enumerate((("paid", "refused"), ("paid again",)), start=1):
            with CheckerJob(config_path, azure_lakehouse, str(tmp_path / f"checker-{run}.log")) as checker:
                checker.wait_for(checker.holds_lease, "the lease", 300)
                for order in orders:
                    producer.send_message_in_transaction(Message(topic="ORDERS", body=order.encode()),
                                                         "refused" if order == "refused" else "paid")
                checker.wait_for(lambda: _delivered(azure_lakehouse) == run, f"run {run}'s delivery", 300)
                assert checker.stop() == 0, checker.tail()
            state = StreamingCheckpoint.read(checkpoint, azure_lakehouse.storage)
            assert state.exists and state.last_planned_batch is not None  # in the container, written by ABFS
            assert state.checkpoint_id == CheckerProgress(azure_lakehouse).load().epoch.checkpoint_id
    finally:
        producer.shutdown()
    assert sorted(azure_lakehouse.read("topics/ORDERS", ["body"]).column(0).to_pylist()) == [b"paid", b"paid again"]
    assert sorted(azure_lakehouse.read(OP, ["outcome"]).column(0).to_pylist()) == ["COMMIT", "COMMIT", "ROLLBACK"]


def _delivered(lakehouse: Lakehouse) -> int:
    return lakehouse.read("topics/ORDERS", ["body"]).num_rows if lakehouse.exists("topics/ORDERS") else 0


def _answered(lakehouse: Lakehouse, transaction_id: str) -> list:
    """The END records check-back wrote for ``transaction_id`` (the send's own END said UNKNOW)."""
    records = read_table(lakehouse.commit_log("g"), ["kind", "transaction_id", "state"], storage=lakehouse.storage).to_pylist()
    return [r for r in records if (r["kind"], r["transaction_id"], r["state"]) == ("END", transaction_id, "COMMIT_MESSAGE")]


@pytest.mark.usefixtures("commit_logs_compacted_eagerly")
def test_the_txcoord_tools_run_on_an_azure_lakehouse(azurite, tmp_path, capsys):
    """`txcoord init`, `add-group`, `status`, `pending`, `inspect`, `resolve`, `grants` and `maintain`, configured by
    a TOML's [storage]."""
    root = azurite.location("lakehouse", f"tools-{tmp_path.name}")
    settings = "\n".join(f'{key} = "{value}"' for key, value in azurite.storage_options.items())
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(f'lakehouse = "{root}"\n\n[storage]\n{settings}\n')
    arguments = ["--config", str(config_file)]
    assert main(["init", *arguments]) == 0
    assert main(["add-group", "g", *arguments]) == 0
    lakehouse = Lakehouse(root, azurite.storage_options)
    assert open_table(lakehouse.commit_log("g"), storage=lakehouse.storage).version() == 0
    capsys.readouterr()

    config = CoordinatorConfig.load(config_file, environ={})
    with CommitLogWriter(lakehouse, "g") as writer:
        writer.submit([half_record("stuck", body=b"held")]).result()
    checker = ManualChecker(config)
    checker.run()
    assert main(["pending", "--json", *arguments]) == 0
    [pending] = json.loads(capsys.readouterr().out)["pending"]
    assert (pending["transaction_id"], pending["next_step"]) == ("stuck", "check")
    assert main(["status", "--json", *arguments]) == 1  # no checker holds the lease
    status = json.loads(capsys.readouterr().out)
    assert (status["lakehouse"], status["pending_transactions"], status["checker_alive"]) == (root, 1, False)
    assert main(["inspect", "stuck", "--json", *arguments]) == 0
    assert [event["step"] for event in json.loads(capsys.readouterr().out)["events"]][:2] == ["half sent", "half stored"]
    assert main(["resolve", "stuck", "--commit", "--reason", "paid", *arguments]) == 0  # the operators' log
    capsys.readouterr()
    assert checker.run().delivered == 1
    assert lakehouse.read("topics/T", ["transaction_id"]).to_pylist() == [{"transaction_id": "stuck"}]
    assert main(["grants", "--json", *arguments]) == 0
    assert "groups/g/commit_log" in {grant["prefix"] for grant in json.loads(capsys.readouterr().out)["grants"]}

    with SteadyProducer(lakehouse) as producer:  # maintenance beside a writer: nothing lost or doubled
        producer.wait_for(10)
        # A commit log (compacted through txcoord's appender) and a checker's table (through delta-rs): every
        # table would take seconds more on a loaded machine and prove no more.
        assert main(["maintain", "--json", "--table", CommitLogRef.of_group("g").key, "--table", OP.name, *arguments]) == 0
    maintained = {table["table"]: table for table in json.loads(capsys.readouterr().out)["tables"]}
    assert sorted(maintained) == sorted([CommitLogRef.of_group("g").key, OP.name])
    assert [name for name, table in maintained.items() if table["failed"]] == []
    assert maintained[CommitLogRef.of_group("g").key]["files_compacted"] > 0
    log = read_table(lakehouse.commit_log("g"), ["transaction_id"], storage=lakehouse.storage)
    assert sorted(log.column(0).to_pylist()) == sorted(["stuck", *producer.sent])


def test_storage_settings_of_another_cloud_are_refused_and_a_wrong_key_is_denied_by_name(azurite):
    """obstore's Azure store aborts the process on a key that is not azure_*: refused with the keys named.
    A key the account does not hold is refused by the storage, and said so with the file's location."""
    root = azurite.location("lakehouse", "refusals")
    with pytest.raises(InvalidArgumentError, match="not aws_region"):
        FileStore.at(root, dict(azurite.storage_options, aws_region="us-east-1"))
    wrong = dict(azurite.storage_options, azure_storage_account_key=base64.b64encode(b"not the key" * 6).decode())
    with pytest.raises(AccessDeniedError, match=f"{root}/system/_checker_lease.json: access denied"):
        FileStore.at(root, wrong).create("system/_checker_lease.json", b"{}")
