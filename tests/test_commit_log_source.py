"""The checker's streaming source (``coordinator.checker.source``) as Spark's trigger drives it, without Spark:
what each trigger asks the storage for."""

from __future__ import annotations

import threading

from coordinator.checker.source import CommitLogReader
from coordinator.commit_logs import CommitLogs, Layout
from coordinator.lakehouse import SHARED_LOG_KEY
from support import half_record
from support.batches import ManualChecker

LOG = "groups/g/commit_log"


def reader_of(lakehouse) -> CommitLogReader:
    """A reader made off the main thread, as Spark's runner is not: it leaves this process's signals alone."""
    made = []
    thread = threading.Thread(target=lambda: made.append(CommitLogReader(lakehouse, {})))
    thread.start()
    thread.join()
    return made[0]


def test_the_layout_is_read_at_the_first_trigger_only_and_every_trigger_finds_the_logs(config, monkeypatch):
    writer = ManualChecker(config)
    writer.write(half_record("t1"))
    lakehouse = writer.lakehouse
    read_layouts = []
    layout = CommitLogs.layout
    monkeypatch.setattr(CommitLogs, "layout", lambda self: read_layouts.append(1) or layout(self))
    reader = reader_of(lakehouse)
    offset = reader.initialOffset()
    _, offset = reader.read(offset)
    first = offset["versions"][LOG]
    writer.write(half_record("t2"))
    for _ in range(3):
        _, offset = reader.read(offset)
    assert offset["versions"][LOG] == first + 1
    assert len(read_layouts) == 1


def test_an_upgraded_lakehouse_still_has_its_shared_log_read(config):
    writer = ManualChecker(config)
    writer.write(half_record("t1"))
    CommitLogs(writer.lakehouse).record_layout(Layout(shared_log_end=0))
    _, offset = reader_of(writer.lakehouse).read({"versions": {}, "clock_us": 0})
    assert SHARED_LOG_KEY in offset["versions"] and offset["versions"][LOG] > 0


def test_new_versions_are_probed_in_rounds_on_object_storage_and_one_by_one_on_a_disk(config):
    from coordinator.checker.segment import committed_run
    from coordinator.commit_logs import versions_written

    writer = ManualChecker(config)
    for i in range(9):
        writer.write(half_record(f"t{i}"))
    files = writer.lakehouse.files
    written = versions_written(files, LOG)
    for remote in (True, False):
        assert committed_run(files, LOG, 0, 100, remote) == written
        assert committed_run(files, LOG, 2, 5, remote) == 5  # no more than asked
        assert committed_run(files, LOG, written, 100, remote) == 0
        assert committed_run(files, LOG, written - 1, 100, remote) == 1


def test_on_s3_one_listing_finds_a_logs_new_versions_whatever_their_number(s3_server):
    import uuid

    from coordinator.conformance.faults import FaultProxyProcess
    from coordinator.checker.segment import committed_run
    from coordinator.lakehouse import Lakehouse, create_table
    from coordinator.producer.commit_log import records_to_arrow
    from coordinator.tables import COMMIT_LOG
    from deltalake import write_deltalake

    root = f"s3://lakehouse/{uuid.uuid4().hex}"
    direct = Lakehouse(root, s3_server.storage_options)
    create_table(COMMIT_LOG, direct.key_path(LOG), direct.storage)
    for i in range(12):  # versions 1 to 12, and a checkpoint file listed among them
        write_deltalake(direct.key_path(LOG), records_to_arrow([half_record(f"t{i}")]), mode="append",
                        storage_options=direct.storage)
    direct.files.put(f"{LOG}/_delta_log/00000000000000000010.checkpoint.parquet", b"listed beside the commits")
    with FaultProxyProcess(s3_server.endpoint) as proxy:
        files = Lakehouse(root, proxy.storage_options(s3_server.storage_options)).files
        before = proxy.counts()["by_kind"]
        found = [committed_run(files, LOG, start, limit, remote=True)
                 for start, limit in ((0, 100), (3, 5), (13, 100), (12, 100), (5, 8))]
        after = proxy.counts()["by_kind"]
    assert found == [13, 5, 0, 1, 8]
    requests = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in set(after) | set(before)}
    assert requests.get("LIST") == 5 and not requests.get("HEAD") and not requests.get("GET")  # one listing each
