"""Reading ahead (``coordinator.checker.readahead``): after a full segment, a worker process reads the
commits after it; the next batch's records are exactly what it would have read itself."""

from __future__ import annotations

import logging
from pathlib import Path

from coordinator.checker.readahead import ReadAhead
from coordinator.checker.segment import Segment, grown_to
from coordinator.lakehouse import Lakehouse
from tests.conftest import ManualChecker, end_record, half_record

LOG = "groups/g/commit_log"


def written(config, commits: int) -> Lakehouse:
    """``config``'s lakehouse, where group ``g`` made ``commits`` commits (a half and an END each, after the first)."""
    writer = ManualChecker(None, config)
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


def test_a_failed_read_ahead_costs_nothing_but_its_time(config, caplog):
    lakehouse = written(config, commits=3)
    for data_file in (Path(lakehouse.key_path(LOG))).glob("*.parquet"):
        data_file.unlink()  # what the worker is to read is gone: it fails
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
