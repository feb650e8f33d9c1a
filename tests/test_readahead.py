"""Reading ahead (``coordinator.checker.readahead``): after a full segment, a worker process reads the
commits after it; the next batch's records are exactly what it would have read itself."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from coordinator.checker.query import CheckerQuery
from coordinator.checker.readahead import ReadAhead
from coordinator.checker.segment import Segment, grown_to
from coordinator.control.lease import CheckerLease
from coordinator.control.progress import CheckerProgress, Epoch, Progress
from coordinator.lakehouse import Lakehouse
from support import REPO_ROOT
from support import end_record, half_record, wait_until
from support.batches import ManualChecker

LOG = "groups/g/commit_log"


def written(config, commits: int) -> Lakehouse:
    """``config``'s lakehouse, where group ``g`` made ``commits`` commits (a half and an END each, after the first)."""
    writer = ManualChecker(config)
    for i in range(commits):
        writer.write(half_record(f"t{i}", body=f"body {i}".encode()), *([end_record(f"t{i - 1}")] if i else []))
    return writer.lakehouse


def test_the_commits_after_a_full_segment_are_read_ahead_and_read_as_a_batch_reads_them(config):
    lakehouse = written(config, commits=7)
    ahead = ReadAhead(lakehouse, full=3)
    try:
        ahead.warm()  # the worker up before any batch
        first = Segment({}, {LOG: 3}, clock_us=1)
        ahead.start(first)
        read = ahead.take()
        assert len(read) == 3 and (LOG, 3) in read  # a full segment's worth, from where the last ended
        assert all(version >= 3 for key, version in read if key == LOG)
        following = Segment({LOG: 3}, grown_to(lakehouse, {LOG: 3}), clock_us=2)
        assert following.ends[LOG] == 8  # version 0 created the log; the 7 commits follow
        assert following.records(lakehouse, read).equals(following.records(lakehouse))  # the rest read by the batch
        assert ahead.take() == {}  # taken once

        ahead.start(Segment({LOG: 3}, {LOG: 5}, clock_us=3))  # not a full segment: no backlog, nothing read
        assert ahead.take() == {}
    finally:
        ahead.close()


def test_at_start_the_first_batchs_commits_are_read_from_the_versions_it_starts_at(config):
    lakehouse = written(config, commits=4)  # versions 0 to 4
    ahead = ReadAhead(lakehouse, full=3)
    try:
        ahead.read_from({LOG: 1})  # as a checker starting after a batch that ended at version 1 of this log
        read = ahead.take()
        first = Segment({LOG: 1}, grown_to(lakehouse, {LOG: 1}, budget=3), clock_us=1)
        assert len(read) == first.versions == 3 and (LOG, 1) in read and (LOG, 0) not in read
        assert first.records(lakehouse, read).equals(first.records(lakehouse))

        ahead.read_from(grown_to(lakehouse, {}, budget=100))  # every commit read already: nothing to read
        assert ahead.take() == {}
    finally:
        ahead.close()


def test_a_start_reads_its_first_batch_ahead_before_the_lease_but_a_standby_does_not(config):
    lakehouse = written(config, commits=4)
    CheckerProgress(lakehouse).save(Progress(Epoch(number=0, first_batch_id=0, starting_versions={LOG: 2},
                                                   checkpoint_id=None)))
    starting = CheckerQuery(None, config)  # this step runs before Spark is asked for anything
    try:
        starting._read_ahead_unless_held()
        assert starting.read_ahead.reading_from == {LOG: 2}  # where the progress record says the next batch starts
        read = starting.read_ahead.take()
        assert (LOG, 2) in read and (LOG, 1) not in read
        assert starting.read_ahead.reading_from is None  # taken
    finally:
        starting.read_ahead.close()

    holder = CheckerLease(lakehouse).acquire()
    standby = CheckerQuery(None, config)
    try:
        standby._read_ahead_unless_held()
        assert standby.read_ahead.reading_from is None  # another checker is at work: nothing read for it
    finally:
        standby.read_ahead.close()
        holder.release()


def test_a_failed_read_ahead_costs_nothing_but_its_time(caplog):
    from support import free_port

    # A storage the worker cannot reach: it fails (bytes it could read but not parse would be refused, not fail).
    lakehouse = Lakehouse("s3://lakehouse/lh", {"aws_endpoint": f"http://127.0.0.1:{free_port()}", "aws_region": "us-east-1",
                                               "aws_access_key_id": "k", "aws_secret_access_key": "s",
                                               "aws_allow_http": "true", "max_retries": "0"})
    ahead = ReadAhead(lakehouse, full=1)
    try:
        ahead.start(Segment({}, {LOG: 1}, clock_us=1))
        with caplog.at_level(logging.WARNING, logger="coordinator.checker"):
            assert ahead.take() == {}
        assert "reading ahead failed, the batch reads its segment itself" in caplog.text
        ahead.start(Segment({}, {LOG: 1}, clock_us=1))  # a new worker for the next backlog
        assert ahead.take() == {}
    finally:
        ahead.close()


def _arrow_allocator() -> str:
    import pyarrow

    return pyarrow.default_memory_pool().backend_name


def test_the_worker_allocates_with_the_c_librarys_allocator(config):
    ahead = ReadAhead(Lakehouse.of(config))
    try:
        assert ahead._worker().submit(_arrow_allocator).result() == "system"  # see coordinator/checker/allocator.py
    finally:
        ahead.close()


DRIVER = """
import sys, time
from coordinator.checker.query import CheckerQuery
from coordinator.checker.readahead import ReadAhead
from coordinator.lakehouse import Lakehouse

if __name__ == "__main__":
    ahead = ReadAhead(Lakehouse(sys.argv[1]))
    ahead.warm()
    ahead._worker().submit(int).result()  # the worker is up
    print(*ahead._pool._processes, flush=True)
    time.sleep(600)
"""


def test_the_worker_leaves_with_a_driver_killed_with_sigkill(tmp_path):
    (tmp_path / "driver.py").write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "lakehouse")],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    try:
        worker = int(driver.stdout.readline())
        assert worker_alive(worker)
    finally:
        driver.kill()
        driver.wait()
    wait_until(lambda: not worker_alive(worker))


def worker_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
