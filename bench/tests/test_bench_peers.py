"""The side-by-side benchmark's own logic (bench/peers): the shared plan, the figures made from
each system's rows, and docs/side-by-side.md's table; and, only with
``PEERS_TESTS=1``, a tiny run against real RocketMQ and Kafka servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from support import REPO_ROOT
from bench.peers import run as peers
from bench.peers import workload
from bench.peers.workload import COMMIT, ROLLBACK, UNKNOWN, Plan


def test_plan_splits_outcomes_by_percentages_and_bodies_carry_their_index():
    plan = Plan(transactions=1000, threads=4, rate=0, commit_percent=80, rollback_percent=10)
    assert Counter(plan.outcome_of(k) for k in range(1000)) == {COMMIT: 800, ROLLBACK: 100, UNKNOWN: 100}
    body = plan.body_of(437)
    assert len(body) == 200 and plan.index_of(body) == 437
    assert plan.index_of(b"not ours") is None
    assert plan.index_of(Plan(transactions=5000, threads=1, rate=0, commit_percent=100,
                              rollback_percent=0).body_of(4000)) is None  # beyond this plan's transactions


def test_plan_refuses_percentages_over_one_hundred():
    with pytest.raises(ValueError, match="add up to at most 100"):
        Plan(transactions=10, threads=1, rate=0, commit_percent=95, rollback_percent=10)


def _row(index, outcome, started, returned, seen=None, deliveries=0, checks=0, resolved=None):
    return {"index": index, "outcome": outcome, "started_ms": started, "returned_ms": returned,
            "resolved_by_check_ms": resolved, "first_seen_ms": seen, "deliveries": deliveries, "checks": checks}


def test_figures_count_throughput_latency_losses_duplicates_and_leaked_rollbacks(tmp_path):
    rows = [
        _row(0, COMMIT, 0.0, 10.0, seen=15.0, deliveries=1),
        _row(1, COMMIT, 0.0, 20.0, seen=60.0, deliveries=2),  # delivered twice
        _row(2, COMMIT, 5.0, 25.0),  # never delivered
        _row(3, ROLLBACK, 5.0, 6.0, seen=9.0, deliveries=1),  # a rollback that leaked
        _row(4, UNKNOWN, 5.0, 8.0, seen=9008.0, deliveries=1, checks=2, resolved=7000.0),
        _row(5, COMMIT, 7.0, None),  # the producer call failed
    ]
    path = str(tmp_path / "rows.csv")
    workload.write_rows(path, rows)
    figures = workload.figures(workload.read_rows(path), send_seconds=2.0)

    assert figures["transactions"] == 6 and figures["send_errors"] == 1
    assert figures["txn_per_s"] == 2.5 and figures["committed_txn_per_s"] == 1.5
    assert figures["send_p50_ms"] == 10.0 and figures["send_p99_ms"] == 20.0  # sends: 1, 3, 10, 20, 20
    assert figures["commit_to_consumable_p50_ms"] == 40.0  # latencies 5 and 40: nearest rank
    assert figures["committed_delivered"] == 2 and figures["committed_missing"] == 1
    assert figures["unknown_delivered"] == 1 and figures["unknown_checked"] == 1
    assert figures["unknown_to_consumable_p50_ms"] == 9000.0
    assert figures["rolled_back_delivered"] == 1 and figures["duplicate_deliveries"] == 1



def _phase(committed, send_p50, consumable_p50, unknown_p50):
    return {"committed_txn_per_s": committed, "send_p50_ms": send_p50, "send_p99_ms": send_p50 * 2,
            "commit_to_consumable_p50_ms": consumable_p50, "commit_to_consumable_p99_ms": consumable_p50 * 2,
            "unknown_to_consumable_p50_ms": unknown_p50}


def test_ratios_are_ours_over_each_peer_and_the_table_says_kafka_aborts_unknowns():
    phases = {
        "max": {"rocketmq": _phase(1000.0, 10.0, 1.0, 8000.0), "kafka": _phase(500.0, 40.0, 1.0, None),
                "ours": _phase(2000.0, 20.0, 5000.0, 20000.0), "ours-java": _phase(3000.0, 10.0, 5000.0, 20000.0)},
        "paced": {"rocketmq": _phase(80.0, 1.0, 2.0, 8000.0), "kafka": _phase(80.0, 1.0, 4.0, None),
                  "ours": _phase(80.0, 30.0, 10000.0, 20000.0), "ours-java": _phase(80.0, 30.0, 8000.0, 20000.0)},
    }
    report = {"phases": phases, "ratios": peers.ratios(phases), "ratios_java": peers.ratios(phases, "ours-java")}
    assert set(report["ratios"]) == set(report["ratios_java"]) == {"rocketmq", "kafka"}  # our rows are not peers
    assert report["ratios"]["rocketmq"]["committed_txn_per_s"] == 2.0
    assert report["ratios_java"]["rocketmq"]["committed_txn_per_s"] == 3.0
    assert report["ratios"]["kafka"]["send_p50_ms"] == 0.5
    assert report["ratios"]["kafka"]["commit_to_consumable_p50_ms"] == 2500.0  # paced phase
    table = peers.markdown_table(report).splitlines()
    assert len(table) == 6 and table[0].startswith("| system |")
    kafka_row = next(line for line in table if line.startswith("| Kafka"))
    assert "aborted (no check-back)" in kafka_row and "(ours ×2)" not in kafka_row
    assert "500.0 (ours ×4, ours in Java ×6)" in kafka_row and "(ours ×2,500, ours in Java ×2,000)" in kafka_row
    java_row = next(line for line in table if line.startswith("| this product (Java client"))
    assert java_row.startswith("| this product (Java client 0.1.0) | 3000.0 | 10.0 / 20.0 |") and "×" not in java_row


@pytest.mark.skipif(os.environ.get("PEERS_TESTS") != "1",
                    reason="starts RocketMQ and Kafka from Maven Central jars (about 4 min, and a download the "
                           "first time): set PEERS_TESTS=1 to run it")
def test_peers_tiny_run_rocketmq_and_kafka_deliver_every_commit_once_and_treat_unknowns_as_they_promise(tmp_path):
    """``python -m bench.peers.run --tiny``: every system (ours through both clients), both phases, 100
    transactions each."""
    results = tmp_path / "peers.json"
    subprocess.run([sys.executable, "-m", "bench.peers.run", "--tiny", "--results", str(results)],
                   check=True, timeout=1200, cwd=REPO_ROOT)
    report = json.loads(results.read_text())
    phases = report["phases"]
    for phase, plan in report["plans"].items():
        unknowns = plan["transactions"] * (100 - plan["commit_percent"] - plan["rollback_percent"]) // 100
        for system in ("rocketmq", "kafka", "ours", "ours-java"):
            figures = phases[phase][system]
            assert figures["transactions"] == plan["transactions"], (phase, system)
            assert figures["send_errors"] == 0 and figures["committed_missing"] == 0
            assert figures["duplicate_deliveries"] == 0 and figures["rolled_back_delivered"] == 0
        for system in ("rocketmq", "ours", "ours-java"):  # check-back commits every unknown
            assert phases[phase][system]["unknown_checked"] == phases[phase][system]["unknown_delivered"] == unknowns > 0
        assert phases[phase]["kafka"]["unknown_delivered"] == 0  # no check-back: aborted
    assert set(report["ratios"]) == set(report["ratios_java"]) == {"rocketmq", "kafka"}
