"""The Java client against the Python producer: committed txn/s and send latency, the same load in the same run.

    python -m bench.java_producer                     # 64 threads, 10 s a client a round, 3 rounds after one not
                                                      # counted, local disk
                                                      # and the S3 server behind 25 ms a request
    python -m bench.java_producer --threads 16 64 --storage-latency-ms 0   # the S3 server with no added latency
    python -m bench.java_producer --storages local --commit-interval-ms 2   # both clients' own capacity
    python -m bench.java_producer --tiny              # one short round of each, for the tests

The load is bench/producer.py's: ``--threads`` threads of one producer, each sending one-message transactions
back to back, the local transaction a no-op that commits, for ``--seconds`` after a warm-up round of
``--warmup-seconds`` (the JVM's class loading and JIT; not counted, and the Python producer is given the same).
The Java side is ``clients/java/examples/SendBench.java`` in a JVM of its own (compiled once per run against the
client's jar, built by :func:`support.java_client.build_java_client`; JVM options ``--java-opts``, by default
:data:`JAVA_OPTS`); the Python side is :class:`coordinator.TransactionProducer` in this process, as
bench/producer.py runs it. The two alternate within each round (which goes first alternates too), each on a
fresh lakehouse, on each storage: a local disk, and the S3 server (coordinator/conformance/versitygw.py) behind the latency proxy
(:class:`support.LatencyStore`) at ``--storage-latency-ms`` (0: the S3 server straight, no proxy). A first round
on each storage is not counted (``--warmup-round``: the server's and the page cache's warm-up; the report keeps
it as ``warmup_round``). Each run also reports its client's CPU per transaction sent (``cpu_ms_per_txn``: the
whole JVM's, start-up included, for Java; this process's for Python).

Neither client is taken at its word: after each run the group's commit log is read back and every transaction
the client said it sent (warm-up included) must have exactly one HALF and one END there, and nothing else may be
in it (``verified``); a run that fails this fails the benchmark. Behind a latency the proxy also counts each
client's requests per transaction.

Prints a table per storage (each run, then the medians and the ratios Java/Python: txn/s, send p50 and p99) and
writes ``bench/results/java_producer.json`` (``--results`` to change), with the load average at start and end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from bench import harness
from bench.producer import BODY, GROUP, Commits, Places, percentile
from coordinator import CoordinatorConfig, Message, TransactionProducer
from coordinator.lakehouse import Lakehouse
from support.checker import write_config
from support.java_client import JAVA_CLIENT, JVM_OPTIONS, build_java_client, java_classpath

RESULTS = harness.RESULTS
#: ``--tiny``: one short round of each client on each storage.
TINY = {"seconds": 0.5, "warmup_seconds": 0.0, "rounds": 1, "warmup_round": 0, "threads": [4]}
CLIENTS = ("java", "python")
SEND_BENCH = JAVA_CLIENT / "examples" / "SendBench.java"
JAVA_OPTS = " ".join(JVM_OPTIONS)


def compile_send_bench(directory: str) -> str:
    """``SendBench.java`` compiled into ``directory`` against the client's jar; the classpath that runs it."""
    classpath = java_classpath()
    subprocess.run(["javac", "-d", directory, "-cp", classpath, str(SEND_BENCH)], check=True,
                   capture_output=True, text=True, timeout=300)
    return os.pathsep.join([directory, classpath])


def run_java(lakehouse: Lakehouse, classpath: str, threads: int, seconds: float, warmup_s: float, workdir: str,
             java_opts: list[str], commit_interval_ms: int) -> tuple[dict, list[str]]:
    """One SendBench run on ``lakehouse`` (its storage as the client reaches it); its figures and the ids it sent."""
    config = write_config(lakehouse, workdir, commit_interval_ms=commit_interval_ms)
    ids = os.path.join(workdir, "java-ids.txt")
    argv = ["java", *java_opts, "-cp", classpath, "SendBench", "--config", config, "--group", GROUP,
            "--threads", str(threads), "--seconds", str(seconds), "--warmup-seconds", str(warmup_s), "--ids", ids]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300 + 2 * (seconds + warmup_s))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"SendBench failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return ({"transactions": figures["transactions"], "seconds": figures["seconds"], "txn_per_s": figures["txn_per_s"],
             "send_p50_ms": figures["p50_ms"], "send_p99_ms": figures["p99_ms"],
             # The whole JVM's, start-up and warm-up included: the ids it sent count them too.
             "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)},
            Path(ids).read_text().split())


def run_python(lakehouse: Lakehouse, threads: int, seconds: float, warmup_s: float,
               commit_interval_ms: int) -> tuple[dict, list[str]]:
    """The same load from the Python producer in this process; its figures and the ids it sent."""
    config = CoordinatorConfig(lakehouse=lakehouse.root, storage=lakehouse.storage, commit_interval_ms=commit_interval_ms)
    sent: list[str] = []
    cpu_before = time.process_time()
    with TransactionProducer(GROUP, Commits(), config) as producer:
        sent += [producer.send_message_in_transaction(Message("BENCH", BODY)).transaction_id for _ in range(20)]
        if warmup_s > 0:
            python_round(producer, threads, warmup_s, sent)
        started = time.perf_counter()
        latencies = python_round(producer, threads, seconds, sent)
        elapsed = time.perf_counter() - started
    return ({"transactions": len(latencies), "seconds": round(elapsed, 3),
             "txn_per_s": round(len(latencies) / elapsed, 1),
             "send_p50_ms": round(statistics.median(latencies) * 1000, 2),
             "send_p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
             "cpu_s": round(time.process_time() - cpu_before, 2)}, sent)


def python_round(producer: TransactionProducer, threads: int, seconds: float, sent: list[str]) -> list[float]:
    """``threads`` threads sending for ``seconds``: every send's latency (s); each transaction id added to ``sent``."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def sender() -> None:
        mine, ids = [], []
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            ids.append(producer.send_message_in_transaction(Message("BENCH", BODY)).transaction_id)
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)
            sent.extend(ids)

    workers = [threading.Thread(target=sender) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return latencies


def verify(lakehouse: Lakehouse, sent: list[str]) -> dict:
    """The group's commit log against the ids a client said it sent: each once, each with one HALF and one END,
    nothing else. Raises on any difference; returns the counts and the log's versions."""
    table = lakehouse.table(f"groups/{GROUP}/commit_log")
    rows = table.to_pyarrow_table(columns=["kind", "transaction_id"]).to_pydict()
    kinds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for kind, transaction_id in zip(rows["kind"], rows["transaction_id"]):
        kinds[transaction_id][kind] += 1
    problems = []
    if len(set(sent)) != len(sent):
        problems.append(f"{len(sent) - len(set(sent))} transaction ids sent twice")
    missing = [t for t in sent if kinds.get(t) != {"HALF": 1, "END": 1}]
    if missing:
        problems.append(f"{len(missing)} of {len(sent)} sent transactions lack exactly one HALF and one END "
                        f"(first: {missing[0]} {dict(kinds.get(missing[0], {}))})")
    extra = set(kinds) - set(sent)
    if extra:
        problems.append(f"{len(extra)} transactions in the log that the client did not report")
    if problems:
        raise AssertionError("the commit log does not hold what was sent: " + "; ".join(problems))
    return {"transactions_in_log": len(kinds), "halves": len(kinds), "ends": len(kinds), "versions": table.version()}


def one_run(places: Places, client: str, args: argparse.Namespace, threads: int, classpath: str) -> dict:
    """One client's run on a fresh lakehouse of ``places``: its figures, verified against its commit log, and
    behind a latency its requests per transaction."""
    with places.lakehouse() as where, tempfile.TemporaryDirectory() as workdir:
        before = places.producer_counts()
        if client == "java":
            figures, sent = run_java(where, classpath, threads, args.seconds, args.warmup_seconds, workdir,
                                     args.java_opts.split(), args.commit_interval_ms)
        else:
            figures, sent = run_python(where, threads, args.seconds, args.warmup_seconds, args.commit_interval_ms)
        spent = None if before is None else places.store.requests_since("producer", before)
        # Read back straight, not through the proxy (its latency would only slow the check).
        direct = Lakehouse(where.root, places.store.direct) if places.store is not None else where
        log = verify(direct, sent)
    run = {"client": client, "threads": threads, **figures, "sent_with_warmup": len(sent), "verified": True,
           "cpu_ms_per_txn": round(figures["cpu_s"] * 1000 / len(sent), 3) if sent else None,
           "commit_log_versions": log["versions"],
           "txn_per_commit": round(len(sent) / log["versions"], 1) if log["versions"] else None}
    if spent is not None:
        run["requests"] = spent
        run["requests_per_txn"] = round(spent["total"] / len(sent), 3) if sent else None
    return run


def summary(runs: list[dict]) -> dict:
    """Per thread count: each client's medians over its runs and the ratios Java/Python."""
    result = {}
    for threads in sorted({r["threads"] for r in runs}):
        medians = {}
        for client in CLIENTS:
            mine = [r for r in runs if r["client"] == client and r["threads"] == threads]
            medians[client] = {key: round(statistics.median(r[key] for r in mine), 2)
                               for key in ("txn_per_s", "send_p50_ms", "send_p99_ms")}
        java, python = medians["java"], medians["python"]
        result[str(threads)] = {**medians, "java_over_python": {
            key: round(java[key] / python[key], 2) if python[key] else None for key in java}}
    return result


def storage_runs(places: Places, args: argparse.Namespace, classpath: str) -> dict:
    """Every round on one storage: the clients alternate, and which goes first alternates by round."""
    runs, discarded = [], []
    for round_index in range(-1 if args.warmup_round else 0, args.rounds):
        for threads in args.threads:
            order = CLIENTS if round_index % 2 == 0 else CLIENTS[::-1]
            for client in order:
                run = one_run(places, client, args, threads, classpath)
                run["round"] = round_index
                (discarded if round_index < 0 else runs).append(run)
                print(f"  round {round_index} {client:>6} {threads:>3} threads: {run['txn_per_s']:>8} txn/s, "
                      f"p50 {run['send_p50_ms']} ms, p99 {run['send_p99_ms']} ms, CPU {run['cpu_ms_per_txn']} ms/txn, verified "
                      f"{run['sent_with_warmup']} txns", flush=True)
    return {"warmup_round": discarded, "runs": runs, "summary": summary(runs)}


def print_table(name: str, result: dict) -> None:
    print(f"\n{name}")
    print(f"{'threads':>7} {'java txn/s':>10} {'py txn/s':>9} {'x txn/s':>7} {'java p50':>8} {'py p50':>7} "
          f"{'java p99':>8} {'py p99':>7} {'x p99':>6}")
    for threads, row in result["summary"].items():
        java, python, ratio = row["java"], row["python"], row["java_over_python"]
        print(f"{threads:>7} {java['txn_per_s']:>10} {python['txn_per_s']:>9} {ratio['txn_per_s']!s:>7} "
              f"{java['send_p50_ms']:>8} {python['send_p50_ms']:>7} {java['send_p99_ms']:>8} "
              f"{python['send_p99_ms']:>7} {ratio['send_p99_ms']!s:>6}")


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="*", default=[64])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured sending time of a client's run")
    parser.add_argument("--warmup-seconds", type=float, default=3.0,
                        help="sending before the measured time, same threads, not counted (both clients)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every client on every storage")
    parser.add_argument("--storage-latency-ms", type=float, default=25.0,
                        help="ms the proxy adds to every request to the S3 server (0: no proxy)")
    parser.add_argument("--storages", nargs="*", default=["local", "s3"], choices=["local", "s3"])
    parser.add_argument("--warmup-round", type=int, default=1,
                        help="1: a first round of each client on each storage, not counted (round -1 in the report)")
    parser.add_argument("--java-opts", default=JAVA_OPTS,
                        help=f"options for SendBench's JVM, one string (default {JAVA_OPTS!r}; '' for the JVM's own; "
                             "give it as --java-opts=...)")
    parser.add_argument("--commit-interval-ms", type=int, default=CoordinatorConfig().commit_interval_ms,
                        help="both clients' commit_interval_ms (default: the product's); at 64 threads on a local disk "
                             "the default bounds a client that is not CPU-bound (docs/performance-log.md#java-client)")
    parser.add_argument("--results", default=str(RESULTS / "java_producer.json"))
    args = harness.parse_args(parser, argv, "java_producer", TINY)
    reason = build_java_client()
    if reason is not None:
        raise SystemExit(f"bench.java_producer: {reason}")
    report = harness.start_report("java_producer", vars(args))
    with tempfile.TemporaryDirectory() as classes:
        classpath = compile_send_bench(classes)
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
        report["machine"]["java"] = java[0] if java else None
        for storage in args.storages:
            latency = args.storage_latency_ms if storage == "s3" else 0
            places = Places(storage == "s3", latency)
            name = "local disk" if storage == "local" else f"S3 server, {latency:g} ms a request"
            print(name, flush=True)
            try:
                report[storage] = {"storage": name, **(places.store.settings() if places.store else {}),
                                   **storage_runs(places, args, classpath)}
            finally:
                places.close()
    for storage in args.storages:
        print_table(report[storage]["storage"], report[storage])
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
