"""Commit-log writers on the real loopback S3 server: two writers racing for the versions of one log, and the
reads an append makes beside its data file's write (issue 45: one instance spends its round trips well)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

from coordinator.conformance.faults import FaultProxyProcess
from coordinator.appender import DeltaAppender
from coordinator.lakehouse import Lakehouse, create_table, init_lakehouse, read_table
from coordinator.producer.commit_log import CommitLogWriter, end_record, records_to_arrow
from coordinator.protocol import LocalTransactionState
from coordinator.retries import storage_request_counts
from coordinator.storage import ObjectFileStore
from coordinator.tables import COMMIT_LOG

SUBMITS_PER_WRITER = 40


def end(transaction_id: str) -> list[dict]:
    return [end_record("g", transaction_id, LocalTransactionState.COMMIT_MESSAGE)]


def test_two_writers_racing_on_one_log_both_commit_everything_once_and_count_each_lost_race(s3_server):
    root = f"s3://lakehouse/{uuid.uuid4().hex}"
    with FaultProxyProcess(s3_server.endpoint) as proxy:  # counts the conditional PUTs the storage refused
        lakehouse = Lakehouse(root, proxy.storage_options(s3_server.storage_options))
        init_lakehouse(lakehouse)
        with CommitLogWriter(lakehouse, "g") as first, CommitLogWriter(lakehouse, "g") as second:
            refused_before = proxy.counts()["by_status"].get("412", 0)
            lost_before = storage_request_counts().commit_races_lost
            # The second writer knows the log at version 0 only: its first commit loses the race for version 1.
            assert first.submit(end("forced-first")).result(timeout=60) == 1
            assert second.submit(end("forced-second")).result(timeout=60) == 2
            futures = []

            def send(writer: CommitLogWriter, name: str) -> None:
                for i in range(SUBMITS_PER_WRITER):
                    futures.append(writer.submit(end(f"{name}-{i}")))
                    if i % 4 == 3:
                        futures[-1].result(timeout=60)  # several batches each, racing the other writer's

            senders = [threading.Thread(target=send, args=(writer, name))
                       for writer, name in ((first, "first"), (second, "second"), (first, "first-b"),
                                            (second, "second-b"))]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
            versions = [future.result(timeout=60) for future in futures]
        refused = proxy.counts()["by_status"].get("412", 0) - refused_before
        lost = storage_request_counts().commit_races_lost - lost_before

    direct = Lakehouse(root, s3_server.storage_options)
    rows = read_table(direct.commit_log("g"), ["transaction_id", "record_id"], storage=direct.storage).to_pylist()
    sent = {"forced-first", "forced-second"} | {f"{name}-{i}" for name in ("first", "second", "first-b", "second-b")
                                                for i in range(SUBMITS_PER_WRITER)}
    assert Counter(row["transaction_id"] for row in rows) == Counter(sent)  # none lost, none twice
    assert len({row["record_id"] for row in rows}) == len(rows)
    assert direct.table("groups/g/commit_log").version() == len(set(versions) | {1, 2})  # no version empty
    assert lost >= 1  # the forced race at least
    assert lost == refused  # each conditional PUT the storage refused, counted once


def test_on_object_storage_last_checkpoint_is_read_beside_the_data_files_write(s3_lakehouse, monkeypatch):
    """Each waits for the other to have started: done one after the other, they would wait forever."""
    path = s3_lakehouse.commit_log("g")
    create_table(COMMIT_LOG, path, s3_lakehouse.storage)
    both_started = threading.Barrier(2, timeout=30)
    real_read, real_put = ObjectFileStore.read, ObjectFileStore.put

    def read(files, key, *args, **kwargs):
        if key.endswith("_last_checkpoint"):
            both_started.wait()
        return real_read(files, key, *args, **kwargs)

    def put(files, key, data):
        if key.endswith(".parquet"):
            both_started.wait()
        return real_put(files, key, data)

    with DeltaAppender(path, storage=s3_lakehouse.storage, checkpoints=False) as appender:
        monkeypatch.setattr(ObjectFileStore, "read", read)
        monkeypatch.setattr(ObjectFileStore, "put", put)
        assert appender.append(records_to_arrow([end_record("g", f"t{i}", LocalTransactionState.COMMIT_MESSAGE)
                                                 for i in range(3)])) == 1
    assert len(read_table(path, ["transaction_id"], storage=s3_lakehouse.storage)) == 3
