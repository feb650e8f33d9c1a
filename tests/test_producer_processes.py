"""Several producer processes appending to one commit log at once (docs/design.md#invariants)."""

import multiprocessing
from collections import Counter

import pytest

from tests.producer_side import commit_log_rows, send_from_process


@pytest.fixture
def lakehouse(tmp_path):
    return str(tmp_path / "lakehouse")


def test_several_processes_append_to_one_commit_log(lakehouse):
    # Enough contention that delta-rs alone runs out of commit retries now and then.
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
