"""Several producer processes of one group at once (docs/design.md#invariants): each instance appends to a
commit log it claimed, and instances sharing a log take its versions in turn; every record lands once."""

import multiprocessing
from collections import Counter

import pytest

from support.producer_side import append_from_process, commit_log_rows, send_from_process


@pytest.fixture
def lakehouse(tmp_path):
    return str(tmp_path / "lakehouse")


def test_several_processes_of_a_group_each_append_to_a_commit_log_of_its_own(lakehouse):
    processes, transactions = 3, 150
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        sent = pool.starmap(send_from_process, [(lakehouse, p, transactions) for p in range(processes)])

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
