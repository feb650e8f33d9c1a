"""The benchmark suite's own machinery, and every benchmark's tiny run.

``--tiny`` (``harness.parse_args``) runs a benchmark at the smallest scale that still goes through
all of it; the tests here run each one and check that what it wrote adds up, so that a benchmark
cannot rot unnoticed. Where each runs is a matter of CI time (two cores):

- ``producer`` starts no JVM: a subprocess, among the fast tests;
- ``history``, ``unresolved``, ``batch_cost`` and ``groups`` drive the checker's logic in a Spark session of their
  own: in their own process, each would start and warm up a JVM of its own, so they run in
  process, in this worker's shared session (``support.spark_session`` leaves it running);
- ``cold_start``, ``e2e`` and ``soak`` start the checker job (``spark-submit``, a cold start to its
  first batch each): one slow test runs the three through ``bench/run.py --tiny``;
- ``failover`` (a chaos run per mode) and ``bench/peers`` on our side are slow tests of their own;
  ``bench/tests/test_chaos.py`` runs ``python -m bench.chaos --tiny`` (and a larger run on the S3 server); RocketMQ and
  Kafka need ``PEERS_TESTS=1`` (``bench/tests/test_bench_peers.py``).

The slow ones are marked ``benchmark`` too: ``make test`` runs them in the lane of the S3 tests,
while the S3 server is still being built.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO_ROOT
from support import without_txcoord_settings
import support
from support.servers import require_s3_server

pytestmark = pytest.mark.benchmark

from bench import commit_api, e2e, harness
from bench import run as bench_run
from bench.chaos import options as chaos_options
from bench.chaos.producer import KINDS

def run_tiny(module: str, results: Path, *options: str, timeout: float = 600) -> dict:
    """``python -m bench.<module> --tiny --results <results> <options>`` as its own process; the JSON it wrote."""
    argv = [sys.executable, "-m", f"bench.{module}", "--tiny", "--results", str(results), *options]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, env=without_txcoord_settings(),
                         timeout=timeout)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return json.loads(results.read_text())


def assert_envelope(report: dict, benchmark: str) -> None:
    """The report's envelope, as ``harness.start_report`` and ``finish_report`` make it, of a tiny run."""
    assert report["benchmark"] == benchmark and report["args"]["tiny"] is True
    assert len(report["loadavg_start"]) == 3 and len(report["loadavg_end"]) == 3


# ---------------------------------------------------------------------------------------------
# Machinery, no JVM


def test_percentile_and_median_by_nearest_rank():
    values = list(range(1, 101))
    assert harness.percentile(values, 0.99) == 100 and harness.percentile(values, 0.5) == 51
    assert harness.median([3, 1, 2, 4]) == 2.5 and harness.percentile([], 0.5) is None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--results", default="full.json")
    return parser


def test_tiny_makes_its_values_the_defaults_and_options_given_explicitly_still_win():
    tiny = {"runs": 1, "rate": 10.0}

    full = harness.parse_args(_parser(), [], "bench", tiny)
    small = harness.parse_args(_parser(), ["--tiny"], "bench", tiny)
    mixed = harness.parse_args(_parser(), ["--rate", "50", "--tiny", "--results", "mine.json"], "bench", tiny)

    assert (full.tiny, full.runs, full.rate, full.results) == (False, 3, 1000, "full.json")
    assert (small.tiny, small.runs, small.rate) == (True, 1, 10.0)
    assert small.results == str(harness.RESULTS / "bench-tiny.json")  # never over a real run's results
    assert (mixed.runs, mixed.rate, mixed.results) == (1, 50.0, "mine.json")


def test_chaos_tiny_options_are_a_valid_run_of_every_kind():
    options = chaos_options.parse_options(["--tiny", "--lakehouse", "somewhere"])

    assert options == chaos_options.Options(**{**chaos_options.TINY, "lakehouse": "somewhere",
                                       "results": str(harness.RESULTS / "chaos-tiny.json")})
    assert options.transactions >= len(KINDS) and options.checker_kills == options.producer_kills == 1


def test_the_checker_kept_up_when_its_lag_held_steady():
    assert e2e.kept_up(0, 46, 57)  # the 10-minute run that a 2-version tolerance called behind
    assert e2e.kept_up(0, 2, 6)  # a handful of versions: the slack absorbs a commit or two
    assert e2e.kept_up(0, None, 3)  # no sample in the second quarter: no lag then


def test_the_checker_fell_behind_when_its_lag_grew_or_messages_are_missing():
    assert not e2e.kept_up(0, 46, 92)  # doubled: what a lag growing from nothing does from mid-run to the end
    assert not e2e.kept_up(0, 8, 40)
    assert not e2e.kept_up(1, 46, 46)  # a message never delivered
    assert not e2e.kept_up(0, 46, None)  # the last quarter never sampled: nothing shows it kept up


def test_poison_progress_tiny_run_keeps_the_record_small_and_the_next_instance_goes_on(tmp_path):
    report = run_tiny("poison_progress", tmp_path / "poison-progress.json", timeout=300)
    assert_envelope(report, "poison_progress")
    assert report["messages_handled_past"] == 20_000 and report["met"] is True
    assert report["unhandled_listed"] == 1 and report["poison_attempts_saved"] == 1
    assert report["record_bytes_after_all"] <= 2 * report["record_bytes_after_first_version"]


def test_producer_tiny_run_reports_every_configuration_with_consistent_counts(tmp_path):
    report = run_tiny("producer", tmp_path / "producer.json", "--processes", "1", "2", "--group-each", timeout=300)

    assert_envelope(report, "producer")
    args = report["args"]
    assert [(r["threads"], r["messages_per_txn"]) for r in report["runs"]] == (
        [(threads, 1) for threads in args["threads"]] + [(max(args["threads"]), args["batch"])])
    curve = report["processes"]
    assert [(r["processes"], r["groups"]) for r in curve] == [(1, 1), (2, 1), (2, 2)]  # and a group each
    for run in curve:
        assert run["vs_one_process"]["txn_per_s"] == round(run["txn_per_s"] / curve[0]["txn_per_s"], 2)
        assert 0 < run["fewest_vs_mean"] <= 1 and run["fewest_txns_of_a_process"] > 0
        assert run["cpu_busy"] is None or 0 <= run["cpu_busy"] <= 1
    assert report["append_floor"]["appends"] == args["floor_appends"]
    for run in report["runs"] + report["processes"]:
        assert run["transactions"] > 0 and run["commits"] > 0
        assert run["send_p50_ms"] <= run["send_p99_ms"]
        assert run["txn_per_commit"] == round(run["transactions"] / run["commits"], 1)
        assert run["messages_per_s"] == pytest.approx(run["txn_per_s"] * run["messages_per_txn"], rel=0.01)
        # Computed from the unrounded figures the report rounds: equal to a rounding step.
        assert run["send_p50_vs_floor"] == pytest.approx(run["send_p50_ms"] / report["append_floor_p50_ms"], abs=0.011)
    best = max((r for r in report["runs"] if r["messages_per_txn"] == 1), key=lambda r: r["txn_per_s"])
    assert bench_run.headline({"producer": report}) == {"producer_txn_per_s": best["txn_per_s"],
                                                        "send_p99_ms": best["send_p99_ms"]}


def test_java_producer_tiny_run_reports_both_clients_on_both_storages_verified_against_their_logs(tmp_path):
    """``bench.java_producer --tiny``: the Java SendBench and the Python producer, one short run each on a local
    disk and on the S3 server behind the latency proxy; each run's sends were read back from its commit log."""
    from support.java_client import build_java_client

    reason = build_java_client()
    if reason is not None:
        pytest.skip(reason)
    require_s3_server()
    report = run_tiny("java_producer", tmp_path / "java-producer.json", "--storage-latency-ms", "5", timeout=120)

    assert_envelope(report, "java_producer")
    for storage in ("local", "s3"):
        runs = report[storage]["runs"]
        assert sorted(r["client"] for r in runs) == ["java", "python"] and report[storage]["warmup_round"] == []
        for run in runs:
            assert run["verified"] is True and 0 < run["transactions"] <= run["sent_with_warmup"]
            assert 0 < run["send_p50_ms"] <= run["send_p99_ms"] and run["commit_log_versions"] > 0
        row = report[storage]["summary"]["4"]
        assert row["java_over_python"]["txn_per_s"] == round(row["java"]["txn_per_s"] / row["python"]["txn_per_s"], 2)
    assert report["s3"]["latency_ms"] == 5 and all(r["requests"]["PUT"] > 0 for r in report["s3"]["runs"])


def test_java_producer_refuses_a_commit_log_that_lacks_what_a_client_said_it_sent(tmp_path):
    """A fast but wrong client cannot win: a transaction without its END, or one reported that is not in the log."""
    from bench import java_producer
    from bench.producer import GROUP, Commits
    from coordinator import CoordinatorConfig, Message, TransactionProducer
    from coordinator.lakehouse import Lakehouse, create_table, init_lakehouse
    from coordinator.tables import COMMIT_LOG

    lakehouse = Lakehouse(str(tmp_path))
    init_lakehouse(lakehouse)
    create_table(COMMIT_LOG, lakehouse.commit_log(GROUP), lakehouse.storage)
    with TransactionProducer(GROUP, Commits(), CoordinatorConfig(lakehouse=lakehouse.root)) as producer:
        sent = [producer.send_message_in_transaction(Message("BENCH", b"x")).transaction_id for _ in range(3)]

    assert java_producer.verify(lakehouse, sent)["transactions_in_log"] == 3
    with pytest.raises(AssertionError, match="did not report"):
        java_producer.verify(lakehouse, sent[:2])
    with pytest.raises(AssertionError, match="lack exactly one HALF and one END"):
        java_producer.verify(lakehouse, sent + ["0" * 32])


def test_commit_api_tiny_run_times_every_method_and_finds_only_the_checked_transactions_idempotent(tmp_path):
    report = run_tiny("commit_api", tmp_path / "commit-api.json", timeout=120)

    assert_envelope(report, "commit_api")
    args = report["args"]
    assert list(report["runs"]) == [str(rows) for rows in args["rows"]]
    for figures in report["runs"].values():
        assert list(figures) == list(commit_api.METHODS)
        for method, figure in figures.items():
            # Version 0 made the table; every append, warm-up included, one version more.
            assert figure["versions"] == args["warmup"] + args["appends"]
            assert 0 < figure["ms_min"] <= figure["ms_median"] <= figure["ms_p90"]
            assert figure["idempotent_on_replay"] is method.endswith("+txn")
            if method.endswith("+txn") and not method.startswith("appender"):
                assert figure["api_alone_skips_replay"] is False  # delta-rs records the transaction, skips nothing
        assert figures[commit_api.BASELINE]["median_vs_appender"] == 1.0


def test_request_cost_prices_each_kind_at_s3s_list_prices_per_million_transactions():
    requests = {"GET": 1000, "HEAD": 1000, "LIST": 1000, "PUT": 1000, "COPY": 0, "POST": 0, "DELETE": 1000,
                "OTHER": 0, "total": 5000, "conditional_put_refused": 0}

    cost = support.request_cost(requests, transactions=500_000)
    idle = support.idle_cost_per_day(requests, seconds=86_400 / 2)

    assert cost["per_million_transactions"]["total"] == 10_000
    # Per million transactions: twice the requests, so twice (GET + HEAD at $0.0004, LIST + PUT at $0.005, DELETE free).
    assert cost["usd_per_million_transactions"] == pytest.approx(2 * (2 * 0.0004 + 2 * 0.005))
    assert idle["per_day"]["total"] == 10_000 and idle["requests_per_s"] == round(5000 / 43_200, 2)
    assert idle["usd_per_day"] == pytest.approx(cost["usd_per_million_transactions"])
    assert support.request_cost(requests, transactions=0)["usd_per_million_transactions"] is None


def test_make_bench_runs_end_to_end_at_25_ms_a_request_and_its_headline_prices_both_parties():
    argv = bench_run.QUICK["e2e_s3_25ms"]
    assert bench_run.BENCHMARK_OF["e2e_s3_25ms"] == "e2e" and argv[argv.index("--storage-latency-ms") + 1] == "25"
    report = {"e2e_p50_ms": 900.0, "e2e_p99_ms": 2000.0,
              "producer_requests": {"usd_per_million_transactions": 1.1},
              "checker_requests": {"usd_per_million_transactions": 0.7}, "checker_idle": {"usd_per_day": 6.8}}

    assert bench_run.headline({"e2e_s3_25ms": report}) == {
        "e2e_s3_25ms_p50_ms": 900.0, "e2e_s3_25ms_p99_ms": 2000.0, "producer_usd_per_million_txn": 1.1,
        "checker_usd_per_million_txn": 0.7, "idle_checker_usd_per_day": 6.8}


def test_idle_logs_tiny_run_counts_the_sources_requests_on_both_lakehouses_and_times_each_wake(tmp_path):
    report = run_tiny("idle_logs", tmp_path / "idle-logs.json", timeout=300)

    assert_envelope(report, "idle_logs")
    for name in ("busy", "mixed"):
        figures = report[name]
        assert figures["requests_per_trigger"] == round(figures["checker_requests"]["total"] / figures["triggers"], 2)
    assert report["ratio"] == round(report["mixed"]["requests_per_s"] / report["busy"]["requests_per_s"], 2)
    assert len(report["found_after_s"]) == report["args"]["wakes"]
    assert all(0 < found < 30 for found in report["found_after_s"])  # each woken group's record was found


def test_checkpoint_requests_tiny_run_writes_spark_checkpoints_with_fewest_requests_by_conditional_puts(tmp_path):
    require_s3_server()
    report = run_tiny("checkpoint_requests", tmp_path / "checkpoint-requests.json", timeout=300)

    assert_envelope(report, "checkpoint_requests")
    requests = {name: figures["requests_per_micro_batch"] for name, figures in report["managers"].items()}
    assert all(figures["micro_batches"] >= 1 for figures in report["managers"].values())
    # A conditional PUT a file, after Spark's existence check (a HEAD and a LIST): no copy, no rename.
    assert requests["conditional"]["PUT"] == 2.0 and requests["conditional"]["total"] == 6.0
    assert requests["conditional"]["total"] < requests["abortable"]["total"] < requests["rename"]["total"]
    assert requests["rename"]["COPY"] > 0 and requests["abortable"]["COPY"] == requests["conditional"]["COPY"] == 0


def test_group_lag_tiny_run_serves_the_lag_it_wrote_in_fewer_requests_than_the_old_way(tmp_path):
    require_s3_server()
    report = run_tiny("group_lag", tmp_path / "group-lag.json", timeout=300)

    assert_envelope(report, "group_lag")
    scrapes, reference = report["scrapes"], report["reference"]
    assert all(scrape["lag_messages"] == scrape["written_lag"] for scrape in scrapes.values())
    assert reference["finished"] and reference["lag_messages"] == scrapes["cold"]["written_lag"]
    total = {name: scrape["requests"]["total"] for name, scrape in scrapes.items()}
    assert total["warm"] < total["cold"] < reference["requests"]["total"]
    assert total["warm, again"] == total["warm"]  # nothing committed since: no commit read again


def test_share_reads_tiny_run_has_each_instance_read_a_part_and_the_same_topic_as_before_read_whole(tmp_path):
    require_s3_server()
    report = run_tiny("share_reads", tmp_path / "share-reads.json", timeout=600)

    assert_envelope(report, "share_reads")
    write = report["write"]
    assert write["slots"] >= 2 and write["footer_bytes"] < write["by_slot_bytes"] / 10
    one, four = report["reads"]["1"], report["reads"]["4"]
    assert one["handled_all"] and four["handled_all"]
    assert one["most_bytes_over_share"] == one["most_rows_over_share"] == 1.0
    assert four["topic_rows"] == one["topic_rows"] == 4_000
    # 16 slots a version: each of four reads its four shares' slots, about a quarter of the rows (by chance; more
    # only if a share moved during the run)
    assert four["most_rows_over_share"] < 2
    assert sum(each["rows"] for each in four["each"]) < 1.5 * four["topic_rows"]
    runs = report["scaling"]["runs"]
    assert all(run["steady_messages_per_s"] for run in runs.values())
    assert set(runs) == {"by slot, 1", "by slot, 2", "as before, 2"}


def test_maintenance_tiny_run_maintains_a_log_in_each_tree_and_counts_its_commit_reads(tmp_path):
    require_s3_server()
    report = run_tiny("maintenance", tmp_path / "maintenance.json", timeout=300)

    assert_envelope(report, "maintenance")
    results = report["results"]
    for figures in results.values():
        assert figures["failed"] is None and figures["skipped"] == [] and figures["version"] >= 40
        # Whatever else it reads: the commits since the writer's checkpoint at 25, each at least once.
        assert 40 - 25 <= figures["commit_file_gets"] <= figures["requests"]["GET"] <= figures["requests"]["total"]
    assert report["ratios"]["commit_file_gets"] == round(
        results["this"]["commit_file_gets"] / results["reference"]["commit_file_gets"], 3)


def test_producer_tiny_run_behind_a_storage_latency_counts_and_prices_the_producers_requests(tmp_path):
    """The latency path once (a few seconds): the S3 server behind a proxy adding the latency to every request."""
    require_s3_server()
    latency_ms = 5
    report = run_tiny("producer", tmp_path / "producer.json", "--storage-latency-ms", str(latency_ms),
                      "--threads", "4", "--batch", "0", "--processes", "2", "--process-threads", "2", timeout=300)

    assert_envelope(report, "producer")
    assert report["storage"]["latency_ms"] == latency_ms and report["storage"]["proxies"] == ["producer"]
    # A bare append through the proxy waits out at least two round trips (the data file, then the commit).
    assert report["append_floor_p50_ms"] >= 2 * latency_ms
    for run in report["runs"] + report["processes"]:
        requests = run["requests"]
        assert requests["total"] == sum(requests[kind] for kind in ("GET", "HEAD", "LIST", "PUT", "COPY", "POST",
                                                                    "DELETE", "OTHER"))
        # Every version is a data file and a commit written at least, every transaction a version or part of one.
        assert requests["PUT"] >= 2 * run["commits"] and run["requests_per_version"] >= 2
        assert run["requests_per_million_txn"]["total"] == pytest.approx(
            requests["total"] * 1_000_000 / run["transactions"], rel=0.001)
        assert run["usd_per_million_txn"] > 0
        assert 0 < run["fewest_txns_of_a_process"] <= run["transactions"] / run["processes"]


def test_poisoning_tenant_behind_a_storage_latency_writes_through_a_proxy_of_its_own(tmp_path):
    """``bench/e2e.py --poison --storage-latency-ms N``'s tenant, without the checker job (whose two starts behind a
    latency take minutes): one round of every poison, each at the log's next version, through the tenant's own proxy
    at the run's latency, and none through the checker's."""
    require_s3_server()
    from support.poisons import POISONS, PoisoningTenant
    from coordinator.lakehouse import Lakehouse

    with support.LatencyStore(5, str(tmp_path), ("checker", e2e.POISONER)) as store:
        lakehouse = store.new_lakehouse()
        tenant = PoisoningTenant(Lakehouse(lakehouse.root, store.storage(e2e.POISONER)), e2e.POISON_GROUP, e2e.POISON_EVERY_S)
        before = {party: store.counts(party) for party in store.parties}
        tenant.start()
        tenant.stop()  # at the end of its first round
        spent = {party: store.requests_since(party, before[party]) for party in store.parties}

    versions = [version for _, version, _ in tenant.written]
    assert [what for what, _, _ in tenant.written] == list(POISONS)
    assert versions == list(range(versions[0], versions[0] + len(POISONS)))
    # A commit each, some with a data file; a look for the next version each, from the one before.
    assert spent[e2e.POISONER]["PUT"] >= len(POISONS) and spent[e2e.POISONER]["HEAD"] <= 2 * len(POISONS)
    assert spent["checker"]["total"] == 0


# ---------------------------------------------------------------------------------------------
# In process, in this worker's shared Spark session


def run_in_process(module_name: str, results: Path, *options: str) -> dict:
    """``bench.<module_name>``'s ``main`` with ``--tiny``, in this process; the JSON it wrote."""
    module = importlib.import_module(f"bench.{module_name}")
    module.main(["--tiny", "--results", str(results), *options])
    return json.loads(results.read_text())


def test_history_tiny_run_builds_every_table_and_delivers_each_round(spark, tmp_path):
    report = run_in_process("history", tmp_path / "history.json", "--workdir", str(tmp_path / "work"))

    assert_envelope(report, "history")
    args, workload = report["args"], report["transactions_per_batch"]
    # Every table of the history, check_requests too, in its schema of tables/__init__.py, one file per append.
    assert report["build"]["files"] == {"system/half": args["appends"], "system/op": args["appends"],
                                        "topics/BENCH_HISTORY": args["appends"],
                                        "system/check_requests": args["appends"]}
    for name in ("empty", "history"):
        timings = report["timings_ms"][name]
        assert len(timings["records"]) == len(timings["heartbeat"]) == args["repeats"]
        assert [s["delivered"] for s in timings["summaries"]] == [workload] * args["repeats"]
        assert [s["records"] for s in timings["summaries"]] == [2 * workload] * args["repeats"]  # a HALF, an END
    medians = report["median_ms"]
    assert report["ratio"] == round(medians["history"]["records"] / medians["empty"]["records"], 3)
    assert bench_run.headline({"history": report}) == {"history_ratio": report["ratio"]}
    assert spark.range(1).count() == 1  # the shared session still runs


def test_unresolved_tiny_run_checks_every_half_once_when_due(spark, tmp_path):
    report = run_in_process("unresolved", tmp_path / "unresolved.json")

    assert_envelope(report, "unresolved")
    halves = report["args"]["halves"]
    assert report["check_requests"] == halves and report["all_checked"] is True
    assert report["pending_after"] == halves  # still pending, none checked again inside the interval
    assert report["jvm_heap_max_mib"] > 0 and report["python_maxrss_mib"] > 0
    assert spark.range(1).count() == 1


def test_batch_cost_tiny_run_times_batches_triggers_and_the_floor(spark, tmp_path):
    report = run_in_process("batch_cost", tmp_path / "batch_cost.json")

    assert_envelope(report, "batch_cost")
    args = report["args"]
    for kind in ("records", "heartbeat"):
        batches = report["batches"][kind]
        assert len(batches["runs"]) == args["batches"]
        assert batches["seconds_median"] == round(harness.median([s for s, _ in batches["runs"]]), 3)
    triggers = report["triggers"]
    assert triggers["triggers"] >= 2 + args["batches"] + 1  # two before the rounds, one per round at least
    assert 0 < triggers["records_per_trigger_median"] <= 2 * args["commits"] * args["transactions"]
    assert set(report["floor"]) == {"append", "idempotent append", "idempotent append, replayed",
                                    "read, filter, count"}
    assert all(0 < op["ms_min"] <= op["ms_median"] for op in report["floor"].values())
    headline = bench_run.headline({"batch_cost": report})
    assert headline["reference_spark_append_ms"] == report["floor"]["append"]["ms_median"]
    assert spark.range(1).count() == 1


def test_groups_tiny_run_times_triggers_of_one_group_and_of_many(spark, tmp_path):
    report = run_in_process("groups", tmp_path / "groups.json")

    assert_envelope(report, "groups")
    args = report["args"]
    for name in ("one", "many"):
        assert len(report["runs"][name]) == args["runs"]
        for run in report["runs"][name]:
            assert run["records_per_trigger_median"] > 0 and run["trigger_ms_median_heartbeat"] > 0
            assert run["triggers"] >= 2 + args["rounds"] + 1
    summary = report["trigger_ms_median"]
    assert report["ratio"]["with_records"] == round(summary["many"]["with_records"] / summary["one"]["with_records"], 2)
    assert report["within_target"] == (report["ratio"]["with_records"] <= report["target_ratio"])
    assert spark.range(1).count() == 1


# ---------------------------------------------------------------------------------------------
# The checker job, as deployed


@pytest.mark.slow
def test_run_tiny_drives_cold_start_end_to_end_and_soak_and_every_count_adds_up(tmp_path):
    """``bench/run.py --tiny`` over the three benchmarks that start the checker job, e2e observed and sending from
    two producer processes in two groups, soak with a checker kill and restart."""
    argv = [sys.executable, "-m", "bench.run", "--tiny", "--only", "cold_start", "e2e", "soak",
            "--results", str(tmp_path / "run.json")]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, env=without_txcoord_settings(),
                         timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-4000:]
    reports = {name: json.loads((tmp_path / f"{name}-tiny.json").read_text()) for name in ("cold_start", "e2e", "soak")}
    suite = json.loads((tmp_path / "run.json").read_text())
    for name, report in reports.items():
        assert_envelope(report, name)

    assert suite["summary"] == bench_run.headline(reports) == json.loads(run.stdout.strip().splitlines()[-1])
    assert set(suite["seconds_by_benchmark"]) == set(reports)
    assert_cold_start(reports["cold_start"])
    assert_end_to_end(reports["e2e"])
    assert_observed(reports["e2e"])
    assert_from_processes_in_groups(reports["e2e"])
    assert_soak(reports["soak"])


def assert_observed(report: dict) -> None:
    """``bench/e2e.py --observed``'s figures: the checker's /metrics scraped every second and a signed-in browser
    reloading the console's overview and charts, through the sending and the drain."""
    assert report["observed"] is True and report["args"]["observed"] is True
    # The endpoint, scraped every second from the first batch to the end of the drain, and once more after it: some
    # scrape under way while the producer sent (how many depends on how long each takes on a loaded machine), and
    # none failed, tries again included.
    assert sum(report["metrics_scrapes_by_quarter"]) >= 1 and report["metrics_scrape_failures"] == 0
    assert report["metrics_scrape_errors"] == []
    assert 0 < report["metrics_scrape_p50_ms"] <= report["metrics_scrape_p99_ms"] <= report["metrics_scrape_max_ms"]
    # The overview, signed in once, loaded at once and every 5 s after, as its page says, with its three charts.
    assert report["console_page_loads"] >= 1 and report["console_page_load_failures"] == 0
    assert report["console_page_load_errors"] == []
    assert report["console_charts_per_page"] == 3 and report["console_refresh_s"] == 5
    assert 0 < report["console_page_load_p50_ms"] <= report["console_page_load_p99_ms"] <= report["console_page_load_max_ms"]
    # The counter scraped last is what the topic table holds: every message sent, delivered once.
    assert report["metrics_delivered_total"] == report["topic_rows"] == report["delivered"] == report["sent"]
    assert report["metrics_delivered_matches"] is True
    assert report["console_cpu_s"] > 0 and report["console_exit_code"] == 0


def assert_from_processes_in_groups(report: dict) -> None:
    """``bench/e2e.py --processes 2 --groups 2``: every transaction of each process delivered exactly once, and
    each group's commit logs appended to."""
    assert report["processes"] == report["args"]["processes"] == 2 and report["groups"] == report["args"]["groups"] == 2
    processes = report["by_process"]
    assert [process["group"] for process in processes] == ["bench-e2e", "bench-e2e-2"]
    assert all(process["sent"] > 0 and process["send_errors"] == 0 and process["delivered"] == process["sent"]
               for process in processes)
    assert sum(process["sent"] for process in processes) == report["sent"]
    assert sum(process["offered"] for process in processes) == report["offered"]
    # The topic's rows once the checker stopped, against the sends of both: each once, nothing else.
    assert report["exactly_once"] is True and report["deliveries"] == {"lost": 0, "duplicated": 0, "unexpected": 0}
    appended = report["commit_log_appends_by_group"]
    assert set(appended) == {"bench-e2e", "bench-e2e-2"} and all(versions > 0 for versions in appended.values())


def assert_cold_start(report: dict) -> None:
    assert len(report["runs"]) == report["args"]["runs"] == 1
    run = report["runs"][0]
    assert 0 < run["lease_taken_s"] <= run["first_batch_s"] and run["checker_exit_code"] == 0
    assert report["first_batch_s"] == {"min": run["first_batch_s"], "median": run["first_batch_s"],
                                       "max": run["first_batch_s"]}


def assert_end_to_end(report: dict) -> None:
    assert report["reference_producer"]["transactions"] > 0  # the producer alone ran first
    # Each process offers its even share of the rate for the seconds, whole transactions: 2 processes at 9.1 txn/s
    # for 5 s offer 22 each, 44 (int(9.1 x 5) is 45).
    processes = report["processes"]
    assert report["offered"] == processes * int(report["offered_txn_per_s"] / processes * report["args"]["seconds"])
    assert report["sent"] + report["unsent"] + report["send_errors"] == report["offered"]
    assert report["send_errors"] == 0 and report["sent"] > 0
    assert report["delivered"] == report["sent"] and report["missing_after_drain"] == 0
    assert report["e2e_p50_ms"] <= report["e2e_p99_ms"] <= report["e2e_max_ms"]
    assert report["lag_second_quarter_max"] is not None and report["lag_last_quarter_max"] is not None
    assert report["kept_up"] == e2e.kept_up(report["missing_after_drain"], report["lag_second_quarter_max"],
                                            report["lag_last_quarter_max"])
    assert report["checker_exit_code"] == 0


def assert_soak(report: dict) -> None:
    args = report["args"]
    assert report["aborted"] is None, report["aborted"]  # e.g. the machine's disk nearly full: no kill would fall due
    assert report["sent"] + report["unsent"] + report["send_errors"] == int(args["rate"] * args["minutes"] * 60)
    assert report["send_errors"] == 0 and report["sent"] > 0
    # The checker killed (its whole process group, kill -9) and restarted at least once, each restart timed.
    restarts = report["restarts"]
    assert report["kills"] == len(restarts) >= 1
    assert all(r["killed_exit_code"] == -9 and r["error"] is None and 0 < r["lease_taken_s"] <= r["restart_s"]
               for r in restarts)
    assert report["restart_s"] == [r["restart_s"] for r in restarts]
    assert all(r["caught_up_s"] is None or r["caught_up_s"] >= r["restart_s"] for r in restarts)
    # Two windows at least, which share out every send, every latency and every kill between them.
    windows = report["windows"]
    assert len(windows) >= 2 and [w["window"] for w in windows] == list(range(1, len(windows) + 1))
    assert sum(w["sent"] for w in windows) == sum(w["delivered"] for w in windows) == report["sent"]
    assert sum(w["kills"] for w in windows) == report["kills"]
    for w in windows:
        if w["delivered"]:
            assert 0 < w["e2e_p50_ms"] <= w["e2e_p99_ms"] <= w["e2e_max_ms"]
        rss = w["rss_max_mib"]
        assert w["memory_samples"] >= 1 and rss["checker_tree"] >= rss["checker_jvm"] > 0 and rss["producer"] > 0
        commit_log = w["tables"]["groups/bench-soak/commit_log"]
        assert commit_log["log_files"] == commit_log["log_json_files"] + commit_log["checkpoints"]
        assert 0 < commit_log["log_bytes"] <= w["commit_log_delta_log_bytes_max"]  # the window's end is one sample
        assert w["commit_log_size_samples"] >= 1
    # Every count 0: each sent transaction in the topic once, nothing else there.
    assert report["counts"] == {"lost": 0, "duplicated": 0, "not_committed": 0, "topic_rows": report["sent"]}
    assert report["undelivered_after_drain"] == 0 and report["topic_versions_missed"] == 0
    ratios = report["flat_ratios"]
    assert set(ratios) == {"e2e_p50_ms", "e2e_p99_ms", "checker_tree_rss_mib", "producer_rss_mib",
                           "commit_log_delta_log_bytes"}
    assert ratios["e2e_p99_ms"]["second"] == windows[1]["e2e_p99_ms"] and ratios["e2e_p99_ms"]["last"] == windows[-1]["e2e_p99_ms"]
    assert all(r["ratio"] == round(r["last"] / r["second"], 3) for r in ratios.values())
    assert report["flat"] == all(r["ratio"] <= report["flat_tolerance"] for r in ratios.values())
    runs = report["maintenance_runs"]
    assert runs and all(run["error"] is None and run["peak_rss_mib"] > 0 for run in runs)
    assert report["maintenance_after_stop"]["error"] is None
    for shape in ("shape_end", "shape_end_after_maintenance"):
        commit_log = report[shape]["groups/bench-soak/commit_log"]
        assert commit_log["exists"] and commit_log["version"] >= report["sent"]  # a HALF commit per send at least
    assert report["checker_exit_code"] == 0


# ---------------------------------------------------------------------------------------------
# Chaos runs: failover's, and ours beside RocketMQ's and Kafka's


@pytest.mark.slow
def test_failover_tiny_run_measures_one_takeover_per_mode(tmp_path):
    """A tiny chaos run per mode, a standby taking over in one, a restart in the other."""
    report = run_tiny("failover", tmp_path / "failover.json")

    assert_envelope(report, "failover")
    assert set(report["modes"]) == {"standby", "restart"}
    for mode, figures in report["modes"].items():
        assert figures["kills"] == len(figures["failover_s"]) == 1, mode
        assert figures["violations"] == 0 and set(figures["found"].values()) == {0}, (mode, figures["found"])
        assert figures["min_s"] == figures["median_s"] == figures["max_s"] == figures["failover_s"][0] > 0
    # Whoever takes the lapsed lease first: the standby, or the killed checker the harness restarts at once (a
    # race the standby usually wins; a tiny run on a loaded machine lost it once). Both are correct takeovers.
    assert report["modes"]["standby"]["taken_over_by"][0] in ("standby", "checker")
    assert report["modes"]["restart"]["taken_over_by"] == ["checker"]  # no standby in that mode
    assert report["standby_met"] == (report["modes"]["standby"]["max_s"] <= report["target_s"])


@pytest.mark.slow
def test_peers_tiny_run_on_our_side_delivers_every_commit_once_and_checks_every_unknown(tmp_path):
    """bench/peers/run.py with our checker only (RocketMQ and Kafka: PEERS_TESTS=1), through the Python producer,
    and through the Java client too when its jar is built (``make test`` builds it)."""
    from support.java_client import JAR

    systems = ["ours", "ours-java"] if JAR.exists() else ["ours"]
    report = run_tiny("peers.run", tmp_path / "peers.json", "--systems", *systems, timeout=600 * len(systems))

    assert_envelope(report, "peers")
    plans = report["plans"]
    for phase, by_system in report["phases"].items():
        assert sorted(by_system) == sorted(systems)
        for system in systems:
            figures, transactions = by_system[system], plans[phase]["transactions"]
            unknowns = transactions * (100 - plans[phase]["commit_percent"] - plans[phase]["rollback_percent"]) // 100
            assert figures["transactions"] == transactions and figures["send_errors"] == 0, (phase, system)
            assert figures["committed_missing"] == 0 and figures["committed_delivered"] == (
                transactions * plans[phase]["commit_percent"] // 100), (phase, system)
            assert figures["unknown_checked"] == figures["unknown_delivered"] == unknowns > 0, (phase, system)
            assert figures["rolled_back_delivered"] == figures["duplicate_deliveries"] == 0, (phase, system)
        if "ours-java" in systems:  # what the Java driver reports itself, as the peers' drivers do
            assert by_system["ours-java"]["errors"] == by_system["ours-java"]["foreign_messages"] == 0
    assert report["ratios"] == {}  # no peer ran: nothing to compare with
    if "ours-java" in systems:
        assert report["ratios_java"] == {} and report["versions"]["ours-java"] == "0.1.0"


# ---------------------------------------------------------------------------------------------
# The consumer (bench/consume.py)


def assert_consume_throughput(report: dict) -> None:
    figures = report["throughput"]
    for run in (figures["one_process"], figures["two_processes"]):
        # Every message handled at least once, however many instances shared them.
        assert run["distinct"] == figures["messages"] and run["handled"] >= run["distinct"]
        assert run["messages_per_s"] > 0 and sum(run["by_process"]) == run["handled"]
        assert len(run["cpu_seconds"]) == run["processes"] and all(cpu > 0 for cpu in run["cpu_seconds"])
        assert run["cores_used"] == round(sum(run["cpu_seconds"]) / run["seconds"], 2)
        assert run["settled_after_s"] is None or 0 <= run["settled_after_s"]
    assert len(figures["two_processes"]["by_process"]) == 2
    assert figures["two_processes_speedup"] == round(
        figures["two_processes"]["messages_per_s"] / figures["one_process"]["messages_per_s"], 2)


@pytest.mark.slow
def test_consume_tiny_run_handles_every_message_and_says_each_figure_against_its_target(tmp_path):
    """``bench/consume.py --tiny`` on a local disk: throughput from one process and two, commit→handled beside the
    real checker job and a real producer, failover after a kill -9."""
    report = run_tiny("consume", tmp_path / "consume.json", timeout=900)

    assert_envelope(report, "consume")
    assert report["storage"] == "local disk" and "idle" not in report
    assert_consume_throughput(report)
    latency = report["latency"]
    assert latency["sent"] > 0 and latency["handled"] == latency["visible"] == latency["sent"]
    assert latency["all_handled"] and latency["checker_exit_code"] is not None
    for q in ("p50", "p99"):
        assert latency[f"handled_over_visible_{q}_ms"] == round(
            latency[f"commit_to_handled_{q}_ms"] - latency[f"commit_to_visible_{q}_ms"], 1)
    failover = report["failover"]
    assert failover["victim_shares"] > 0 and failover["failover_s"] is not None
    assert failover["holds_all_after_s"] <= failover["failover_s"]
    assert {v["figure"] for v in report["verdicts"]} >= {"one process, messages/s", "failover after kill -9, s"}
    assert all(v["met"] in (True, False) for v in report["verdicts"])


def test_group_membership_tiny_run_counts_an_idle_groups_requests_per_instance_and_moves_a_stopped_ones_shares(tmp_path):
    require_s3_server()
    report = run_tiny("group_membership", tmp_path / "members.json", timeout=600)

    assert_envelope(report, "group_membership")
    assert report["two"]["instances"] == 2 and report["group"]["instances"] == 4
    for figures in (report["two"], report["group"]):
        assert figures["requests_per_s"] > 0 and figures["requests"]["PUT"] > 0  # renewals, counted per instance
    stopped = report["group"]["stopped"]
    assert stopped["shares"] >= 1 and stopped["moved_after_heartbeats"] is not None
    assert [v["figure"] for v in report["verdicts"]] == ["requests/s per instance", "$ a day per instance",
                                                        "shares moved, heartbeats after the last renewal"]


def test_consume_tiny_run_behind_a_storage_latency_counts_the_idle_consumers_requests(tmp_path):
    """The latency path (a few seconds, no checker): the idle consumer's requests, through its own proxy."""
    require_s3_server()
    report = run_tiny("consume", tmp_path / "consume-s3.json", "--storage-latency-ms", "5", "--only", "idle",
                      timeout=600)

    assert_envelope(report, "consume")
    assert report["storage"]["latency_ms"] == 5
    idle = report["idle"]
    assert idle["requests"]["total"] == sum(idle["requests"][kind] for kind in ("GET", "HEAD", "LIST", "PUT", "COPY",
                                                                                "POST", "DELETE", "OTHER"))
    assert idle["requests_per_s"] > 0 and idle["usd_per_day"] >= 0
    assert [v["figure"] for v in report["verdicts"]] == ["idle consumer, requests/s", "idle consumer, $ a day"]
