"""Several producer processes of one group at once (docs/design.md#invariants): each instance appends to a
commit log it claimed, and instances sharing a log take its versions in turn; every record lands once. And a
producer process exits 0: nothing the producer started is left running once it is closed, and nothing pyarrow's
threads still do for the process's own reads once it exits."""

import json
import multiprocessing
import os
import sys
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from coordinator.lakehouse.pools import wait_for_arrow_pools_at_exit
from support import Job, checker_on_fresh_lakehouse, child_environment
from support.producer_side import append_from_process, commit_log_rows, send_from_process

#: What each producer process of the exit tests sends, from how many threads (every fourth is checked back).
TRANSACTIONS, SENDERS = 120, 8


@pytest.fixture
def lakehouse(tmp_path):
    return str(tmp_path / "lakehouse")


def test_several_processes_of_a_group_each_append_to_a_commit_log_of_its_own(lakehouse):
    processes, transactions = 3, 150
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(processes) as pool:
        all_started = manager.Barrier(processes)
        sent = pool.starmap(send_from_process, [(lakehouse, p, transactions, all_started) for p in range(processes)])

    sent_ids = [transaction_id for ids in sent for transaction_id in ids]
    assert len(sent_ids) == len(set(sent_ids)) == processes * transactions
    rows = commit_log_rows(lakehouse)
    assert len({r["record_id"] for r in rows}) == len(rows)
    assert Counter((r["transaction_id"], r["kind"]) for r in rows) == Counter(
        {(t, kind): 1 for t in sent_ids for kind in ("HALF", "END")}
    )
    bodies = sorted(r["body"] for r in rows if r["kind"] == "HALF")
    assert bodies == sorted(f"process {p} transaction {i}".encode() for p in range(processes) for i in range(transactions))
    process_of = {t: p for p, ids in enumerate(sent) for t in ids}
    writers = {}
    for row in rows:  # a log of one process only, its ENDs beside its halves
        writers.setdefault(row["commit_log"], set()).add(process_of[row["transaction_id"]])
    assert sorted(writers) == ["groups/order_group/commit_log", "groups/order_group/commit_log.1",
                               "groups/order_group/commit_log.2"]
    assert all(len(of) == 1 for of in writers.values())


def test_several_processes_appending_to_one_commit_log_each_land_every_record_once(lakehouse):
    # Enough contention that delta-rs alone runs out of commit retries now and then.
    processes, transactions = 3, 150
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        sent = pool.starmap(append_from_process, [(lakehouse, p, transactions) for p in range(processes)])

    rows = commit_log_rows(lakehouse)
    assert {r["commit_log"] for r in rows} == {"groups/order_group/commit_log"}
    assert sorted(r["transaction_id"] for r in rows) == sorted(t for ids in sent for t in ids)
    assert len({r["_commit_version"] for r in rows}) > processes  # many commits, taken in turn


def producer_process(lakehouse: str, storage: dict, log_path, asked_by: str, timeout_s: float = 120) -> Job:
    """A producer process (:func:`~support.producer_side.send_and_answer_checks`), started: its checks asked
    by itself (``asked_by="here"``) or by a checker running beside it (``"checker"``)."""
    argv = [sys.executable, "-m", "support.producer_side", lakehouse, json.dumps(storage), str(TRANSACTIONS),
            str(SENDERS), asked_by, str(timeout_s)]
    return Job(argv, log_path, env=child_environment(os.environ)).start()


def exit_statuses(lakehouses: list[str], storage: dict, tmp_path) -> list[tuple[int, str]]:
    """Each producer process's exit status and the last line of its output, one process per lakehouse, two at once."""
    def run(index: int) -> tuple[int, str]:
        process = producer_process(lakehouses[index], storage, tmp_path / f"producer-{index}.log", "here")
        return process.wait(180), process.tail(1)

    with ThreadPoolExecutor(2) as runs:
        return list(runs.map(run, range(len(lakehouses))))


#: The last line of a producer process that sent everything, had each UNKNOW transaction checked back and closed.
CLOSED = f"{TRANSACTIONS // 4} checked back"


def test_a_producer_process_that_sent_from_threads_and_answered_checks_exits_0(tmp_path):
    """Issue 53: a process of this shape, its producer closed, exited 134 (SIGABRT, ``terminate called without an
    active exception``) in 2 runs of 4. Issue 60: so did one whose last read, after the producer closed, was its
    own ``DeltaTable.to_pyarrow_table()``, until a producer had its process wait for pyarrow's pools at exit."""
    runs = 10
    statuses = exit_statuses([str(tmp_path / f"lakehouse-{run}") for run in range(runs)], {}, tmp_path)
    assert statuses == [(0, CLOSED)] * runs, statuses


def test_a_producer_process_on_object_storage_exits_0(s3_server, tmp_path):
    """On object storage the check-back's read of its requests went through delta-rs's Python filesystem
    handler, whose buffers pyarrow's threads release after the read: one released as the process exits aborts it."""
    runs = 6
    lakehouses = [f"s3://lakehouse/{uuid.uuid4().hex}" for _ in range(runs)]
    assert exit_statuses(lakehouses, s3_server.storage_options, tmp_path) == [(0, CLOSED)] * runs


def test_the_wait_for_pyarrows_pools_at_exit_is_in_place():
    """The pools are reached through symbols of pyarrow's library: an upgrade that no longer exports them turns
    the wait off, which the exit tests would notice only in the runs whose teardown happened to be late."""
    assert wait_for_arrow_pools_at_exit()


@pytest.mark.slow
def test_a_producer_process_answering_the_checkers_checks_exits_0_though_the_checker_is_killed_beside_it(tmp_path):
    """The checker asks; it is killed (-9) and started again at once while the second of three producer processes,
    its sends done, waits for its checks."""
    directory, checker = checker_on_fresh_lakehouse(str(tmp_path / "lakehouse"), "producer-exit", trigger_ms=200,
                                                    transaction_timeout_ms=1000)
    statuses = []
    with checker:
        checker.wait_ready(300)
        for run in range(3):
            process = producer_process(directory, {}, tmp_path / f"producer-{run}.log", "checker", timeout_s=300)
            if run == 1:
                process.wait_for(lambda: "UNKNOW" in process.tail(1), "its sends", 120, poll_s=0.05)
                assert checker.kill() == -9
                checker.start()
            statuses.append((process.wait(360), process.tail(1)))
    assert statuses == [(0, CLOSED)] * 3, statuses
