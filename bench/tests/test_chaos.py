"""The chaos harness (``bench/chaos/``): real producer processes, the real checker, a consumer group's processes,
kill -9 of each, and every invariant checked afterwards (docs/design.md#invariants)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.poisons import INSTANCE_POISONS, POISONS
from support.servers import require_s3_server
from support import REPO_ROOT


#: ``python -m bench.chaos --tiny``, and a larger run with the lakehouse on a loopback S3 server reached through the
#: storage-fault proxy (503, 500, delays, resets, replies dropped after the write).
RUNS = {
    # bench.chaos's tiny run: every kind of transaction, one kill of each, a recovery; and a poisoning tenant. Its
    # reset goes to the earliest version: the failing kind's message is delivered again and dies again, so the
    # first dead-letter round, which redrives, finds it open whatever the timing.
    "local disk": ["--tiny", "--poison", "--reset-to", "earliest"],
    "object store": ["--object-store", "--storage-faults", "--transactions", "80", "--send-seconds", "15",
                     "--checker-kills", "1", "--producer-kills", "2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local disk", pytest.param("object store", marks=pytest.mark.object_store)])
def test_the_chaos_run_kills_checker_and_producers_and_breaks_no_invariant(tmp_path, mode):
    """Every invariant, after checker and producer kills, hostile records and an operator's commits; and the consumer
    group's, after kills, pauses, a reset and dead-letter rounds."""
    if mode == "object store":
        require_s3_server()
    results = tmp_path / "chaos.json"
    argv = [sys.executable, "-m", "bench.chaos",
            "--lakehouse", str(tmp_path / "lakehouse"), "--results", str(results), *RUNS[mode]]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)

    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    report = json.loads(results.read_text())
    assert report["violations"] == 0 and set(report["found"].values()) == {0}, report["found"]
    assert len(report["did"]["checker_kills"]) == report["run"]["options"]["checker_kills"] >= 1
    assert len(report["did"]["producer_kills"]) >= 1
    assert report["did"]["bad_inputs"] and all(bad["reason"] for bad in report["did"]["bad_inputs"])
    # The consumer group: killed -9, paused, reset and restarted, its dead letters redriven and discarded; every
    # message applied once in its key's order, a dead letter, discarded or reset past; no overlap of a key's calls
    # but across a pause; after the reset, every message from where it went delivered again (found: 0).
    consumers, options = report["did"]["consumers"], report["run"]["options"]
    assert len(consumers["consumer_kills"]) == options["consumer_kills"] >= 1
    assert consumers["consumer_processes"] == 2 and consumers["applied"] >= 1 and not consumers["consumer_failures"]
    # SIGSTOP for 2 and 5 liveness windows, each at least as long as planned; one asked inside a call stopped inside
    # one; and while one lasted, another process took its shares over (called messages the paused one had called).
    pauses = consumers["consumer_pauses"]
    assert len(pauses) == options["consumer_pauses"] >= 2 and {pause["windows"] for pause in pauses} == {2, 5}
    assert all(pause["stopped_s"] >= pause["planned_s"] - 0.1 for pause in pauses), pauses
    assert all(pause["calls_running"] for pause in pauses if not pause["aim"].startswith("from outside")), pauses
    assert any(pause["taken_over"] for pause in pauses), pauses
    assert len(consumers["consumer_resets"]) == options["consumer_resets"] >= 1
    assert all(reset["topics"] for reset in consumers["consumer_resets"])  # each topic with a table reset
    rounds = consumers["dead_letter_rounds"]
    assert len(rounds) == options["dead_letter_rounds"] >= 1
    assert all(round_["redriven"] or round_["discarded"] for round_ in rounds if round_["open"]), rounds
    if report["outcomes_by_kind"].get("unknown_then_commit", {}).get("COMMIT"):  # the kind the listener fails
        # Dead letters; or a reset to a time moved past them all before the group had read them.
        assert consumers["dead_letters"] >= 1 or consumers["fates"].get("reset past")
        if mode == "local disk":
            assert any(round_["redriven"] for round_ in rounds), rounds
    if mode == "local disk":  # every poison refused with its reason, at least one round of each kind
        assert report["did"]["poison_rounds"] >= 1 and all(p["reason"] for p in report["did"]["poisonings"])
        assert {p["what"] for p in report["did"]["poisonings"]} == set(POISONS) | set(INSTANCE_POISONS)
    assert report["did"]["operator_recoveries"] >= 1  # discarded, then committed by hand: delivered once
    # The first twice, racing: both accepted, or the second refused as the checker had applied the first.
    did = report["did"]
    assert did["operator_commits_sent"] + did["operator_commits_refused"] == did["operator_recoveries"] + 1
    assert did["operator_commits_sent"] >= did["operator_recoveries"]
    assert report["did"]["maintenance_runs"] >= 1 and not report["did"]["maintenance_errors"]
    assert len(report["did"]["failovers"]) == len(report["did"]["checker_kills"])
    assert report["run"]["options"]["object_store"] == (mode == "object store")
    faults = report["did"]["storage_faults"]
    if mode == "object store":  # through the storage-fault proxy: every kind of fault met, and survived
        assert report["run"]["options"]["storage_faults"] and min(faults["injected"].values()) >= 1, faults
        assert faults["requests"] > sum(faults["injected"].values()) and faults["seen_in_logs"]["retries"] >= 1
    else:
        assert faults is None
