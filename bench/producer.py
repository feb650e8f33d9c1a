"""Producer benchmark: committed transactions per second and send latency, against the append floor.

The local transaction is a no-op that commits, so what is measured is the
coordinator's own cost: validating, group-committing halves to the commit log,
and queueing the one-way END. No JVM is involved.

    python -m bench.producer                      # 1, 16, 64, 128, 256 threads, batched sends, 1/2/4 processes
    python -m bench.producer --seconds 5 --threads 16 --processes 1 2
    python -m bench.producer --tiny               # every configuration for half a second, for the tests
    python -m bench.producer --storage-latency-ms 25 --threads 8 64 --batch 0 --processes 1 8 --process-threads 8 \
        --group-each                              # on the S3 server, 25 ms added to every request; one group's
                                                  # 8 processes against 8 groups of one and against one process

Every figure is quoted against the **append floor**, measured first in the same run: a bare
delta-rs ``write_deltalake`` of one commit-log row to a warm table, many times over, the table
reopened every 20 appends as delta-rs needs (``append_floor_p50_ms``; each configuration's
``send_p50_vs_floor`` and ``send_p99_vs_floor``).
The process curve runs 1, 2 and 4 producer processes of one group, each with 64 threads
(``--process-threads``), on one lakehouse, as several service instances would (each appends to a
commit log of the group it claimed); each configuration reports the fewest transactions one of its
processes committed (a starved instance shows there), how busy the machine's cores were while they sent,
and its txn/s and send p99 against the curve's one-process point (``vs_one_process``). With
``--group-each`` each point also runs with a group per process: instances that share nothing, the
reference one group's instances are held to.

With ``--object-store`` every lakehouse (the floor's too) is a prefix of a bucket on a real
S3-compatible server on loopback (``coordinator/conformance/versitygw.py``, started for the run): what object
storage costs a producer, beside the local-disk figures. With ``--storage-latency-ms N`` (N > 0) the
same server sits behind the storage-fault proxy (``support.LatencyStore``), N ms added to every
request, as an object store's round trip: each configuration then also reports the producers' requests
by kind (counted by the proxy, from the producers' opening to their closing), per commit-log version
and per million transactions, their cost at S3's list prices, and the conditional PUTs refused
(each a lost race for a commit-log version).

Prints a table and writes ``bench/results/producer.json`` (``bench/results/producer-s3.json``
with ``--object-store``, ``producer-s3-<N>ms.json`` with ``--storage-latency-ms N``; ``--results``
to change), with the load average at start and end.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Optional

import psutil
from bench import harness
import support

from deltalake import write_deltalake

from coordinator import CoordinatorConfig, LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.commit_logs import CommitLogs
from coordinator.lakehouse import Lakehouse, create_table, init_lakehouse
from coordinator.producer.commit_log import half_records, records_to_arrow
from coordinator.tables import COMMIT_LOG

RESULTS = harness.RESULTS
BODY = support.BODY
FLOOR_WARMUP = 20
#: A DeltaTable kept open gets slower with every commit it has seen (delta-rs 1.6.6:
#: docs/performance-log.md#figures-quoted-elsewhere-before), so the floor reopens it, untimed: its best case.
FLOOR_REOPEN_EVERY = 20
PROCESS_THREADS = 64
#: ``--tiny``: every configuration (a thread count above one, the batched sends, the process curve) for half a second.
TINY = {"seconds": 0.5, "threads": [1, 4], "batch": 3, "processes": [2], "floor_appends": 5}
#: The producer group of every run (of the process curve's reference: ``bench-<i>``, one per process).
GROUP = "bench"
#: How often :class:`CpuSamples` reads the machine's CPU times.
CPU_SAMPLE_S = 0.5


class CpuSamples:
    """The machine's CPU times, sampled every :data:`CPU_SAMPLE_S` while in its ``with`` block: how busy the
    machine's cores were over a window (a run on two cores that is CPU-bound says so)."""

    def __init__(self) -> None:
        self._samples: list[tuple[float, float, float]] = []  # (time.time(), busy seconds, total seconds)
        self._sampling = support.Periodically(self._sample, CPU_SAMPLE_S)

    def __enter__(self) -> "CpuSamples":
        self._sampling.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._sampling.__exit__(*exc_info)

    def _sample(self) -> None:
        times = psutil.cpu_times()
        total = sum(times)
        self._samples.append((time.time(), total - times.idle - getattr(times, "iowait", 0.0), total))

    def busy_between(self, start: float, end: float) -> Optional[float]:
        """The share of every core's time spent busy between the samples taken within ``start``..``end``."""
        inside = [sample for sample in self._samples if start <= sample[0] <= end]
        if len(inside) < 2 or inside[-1][2] == inside[0][2]:
            return None
        return round((inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2]), 3)


class Commits(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Places:
    """Where each run's fresh lakehouse lives: a temporary directory, or a new prefix of a bucket on
    a loopback S3 server (started once for the whole benchmark); with ``latency_ms``, that server
    behind a proxy per party of ``parties`` adding that latency to every request (:attr:`store`)."""

    BUCKET = "bench"

    def __init__(self, object_store: bool, latency_ms: float = 0, parties: tuple[str, ...] = ("producer",),
                 request_logs: Optional[str] = None):
        self._stack = contextlib.ExitStack()
        self.storage: dict[str, str] = {}
        self.store: Optional[support.LatencyStore] = None
        if latency_ms:
            self.store = self._stack.enter_context(support.LatencyStore(
                latency_ms, self._stack.enter_context(tempfile.TemporaryDirectory()), parties, request_logs))
        elif object_store:
            from coordinator.conformance.versitygw import S3Server

            server = self._stack.enter_context(S3Server(self._stack.enter_context(tempfile.TemporaryDirectory())))
            server.create_bucket(self.BUCKET)
            self.storage = server.storage_options

    @contextlib.contextmanager
    def lakehouse(self):
        """A fresh lakehouse, its tables created; behind a latency, as the producers reach it (made straight)."""
        if self.store is not None:
            made = self.store.new_lakehouse()
            create_table(COMMIT_LOG, made.commit_log(GROUP), made.storage)
            yield Lakehouse(made.root, self.store.storage("producer"))
            return
        if self.storage:
            lakehouse = Lakehouse(f"s3://{self.BUCKET}/{uuid.uuid4().hex}", self.storage)
            init_lakehouse(lakehouse)
            create_table(COMMIT_LOG, lakehouse.commit_log(GROUP), lakehouse.storage)
            yield lakehouse
            return
        with tempfile.TemporaryDirectory() as directory:
            lakehouse = Lakehouse(directory)
            init_lakehouse(lakehouse)
            create_table(COMMIT_LOG, lakehouse.commit_log(GROUP), lakehouse.storage)
            yield lakehouse

    def producer_counts(self) -> Optional[dict]:
        """The producers' proxy's counts now, ``None`` without a latency store."""
        return None if self.store is None else self.store.counts("producer")

    def close(self) -> None:
        self._stack.close()


def append_floor(places: Places, appends: int) -> dict:
    """A bare delta-rs append of one commit-log row to a warm table, ``appends`` times: the latencies' p50/p99.

    The table is reopened every :data:`FLOOR_REOPEN_EVERY` appends, outside the timing."""
    with places.lakehouse() as lakehouse:
        message = Message("BENCH", BODY)
        message.msg_id = uuid.uuid4().hex
        row = records_to_arrow(half_records(GROUP, uuid.uuid4().hex, [message]))
        latencies = []
        for attempt in range(FLOOR_WARMUP + appends):
            if attempt % FLOOR_REOPEN_EVERY == 0:
                table = lakehouse.table("groups/bench/commit_log")
            started = time.perf_counter()
            write_deltalake(table, row, mode="append")
            if attempt >= FLOOR_WARMUP:
                latencies.append(time.perf_counter() - started)
    return {"appends": appends, "p50_ms": round(statistics.median(latencies) * 1000, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 2)}


def producer_requests(requests: Optional[dict], transactions: int, versions: int) -> dict:
    """The producers' ``requests`` by kind (``None`` without a latency store: nothing) per commit-log
    version, per million transactions and their cost, and the conditional PUTs refused per version."""
    if requests is None:
        return {}
    cost = support.request_cost(requests, transactions)
    return {"requests": requests,
            "requests_per_version": round(requests["total"] / versions, 2) if versions else None,
            "lost_races_per_version": round(requests["conditional_put_refused"] / versions, 2) if versions else None,
            "requests_per_million_txn": cost["per_million_transactions"],
            "usd_per_million_txn": cost["usd_per_million_transactions"]}


def send_for(lakehouse: str, storage: dict[str, str], threads: int, seconds: float, messages_per_txn: int,
             group: str = GROUP, ready=None) -> tuple[list[float], float, float]:
    """Send from ``threads`` threads of one producer of ``group`` for ``seconds``, from when every process of
    the run is ready (``ready``: the barrier of :class:`support.StartedTogether`, passed once the producer is
    open; ``None`` for a single process); return the send latencies, when sending started and when the last
    send finished (``time.time()``)."""
    config = CoordinatorConfig(lakehouse=lakehouse, storage=storage)
    latencies: list[float] = []
    lock = threading.Lock()

    def sender(producer: TransactionProducer) -> None:
        mine = []
        while time.time() < stop_at:
            started = time.perf_counter()
            if messages_per_txn == 1:
                producer.send_message_in_transaction(Message("BENCH", BODY))
            else:
                producer.send_messages_in_transaction([Message("BENCH", BODY) for _ in range(messages_per_txn)])
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    with TransactionProducer(group, Commits(), config) as producer:
        if ready is not None:
            ready.wait()
        start_at = time.time()
        stop_at = start_at + seconds
        workers = [threading.Thread(target=sender, args=(producer,)) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        finished = time.time()
    return latencies, start_at, finished


def run(places: Places, threads: int, seconds: float, messages_per_txn: int, floor: Optional[dict] = None,
        processes: int = 1, group_each: bool = False) -> dict:
    """Send from ``processes`` processes of ``threads`` threads for ``seconds``, all of one group (or, with
    ``group_each``, each of a group of its own: nothing shared); return throughput and latency figures, the
    machine's CPU busy while sending, quoted against ``floor`` (:func:`append_floor`) if given, and, behind a
    latency, the producers' requests (:func:`producer_requests`)."""
    with places.lakehouse() as where, CpuSamples() as cpu:
        lakehouse, storage = where.root, where.storage
        before = places.producer_counts()
        if processes == 1:
            latencies, start_at, finished = send_for(lakehouse, storage, threads, seconds, messages_per_txn)
            fewest = len(latencies)
        else:
            # Every process starts (imports, opens the log) before any sends.
            groups = [f"{GROUP}-{index}" if group_each else GROUP for index in range(processes)]
            with support.StartedTogether(send_for, [(lakehouse, storage, threads, seconds, messages_per_txn, group)
                                                    for group in groups]) as together:
                shares = together.results()
            latencies = [latency for share, _, _ in shares for latency in share]
            fewest = min(len(share) for share, _, _ in shares)
            start_at = min(started for _, started, _ in shares)
            finished = max(last for _, _, last in shares)
        elapsed = finished - start_at
        # Taken before this benchmark's own read of the log below, which goes through the same proxy.
        spent = None if before is None else places.store.requests_since("producer", before)
        # Every log of the run's groups (one per process: each instance claims its own); version 0 created each.
        commits = sum(where.table(ref.key).version() for ref in CommitLogs(where).discover()
                      if ref.group is not None and ref.group.startswith(GROUP))
        requests = producer_requests(spent, len(latencies), commits)
        p50, p99 = statistics.median(latencies) * 1000, percentile(latencies, 0.99) * 1000
        against_floor = {} if floor is None else {
            "append_floor_p50_ms": floor["p50_ms"],
            "send_p50_vs_floor": round(p50 / floor["p50_ms"], 2),
            "send_p99_vs_floor": round(p99 / floor["p50_ms"], 2),
        }
        return {
            "processes": processes,
            "groups": processes if group_each else 1,
            "threads": threads,
            "messages_per_txn": messages_per_txn,
            "transactions": len(latencies),
            "seconds": round(elapsed, 3),
            "txn_per_s": round(len(latencies) / elapsed, 1),
            "messages_per_s": round(len(latencies) * messages_per_txn / elapsed, 1),
            "send_p50_ms": round(p50, 2),
            "send_p99_ms": round(p99, 2),
            **against_floor,
            # HALFs and ENDs share commits: how far group commit gathered the sends.
            "commits": commits,
            "commits_per_s": round(commits / elapsed, 1),
            "txn_per_commit": round(len(latencies) / commits, 1),
            "fewest_txns_of_a_process": fewest,
            "fewest_vs_mean": round(fewest * processes / len(latencies), 2),
            "cpu_busy": cpu.busy_between(start_at, finished),
            **requests,
        }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="sending time per configuration")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 16, 64, 128, 256])
    parser.add_argument("--batch", type=int, default=10,
                        help="messages per send_messages_in_transaction run (0: no such run)")
    parser.add_argument("--processes", type=int, nargs="*", default=[1, 2, 4],
                        help="the process curve: this many processes of one group, --process-threads threads each")
    parser.add_argument("--process-threads", type=int, default=PROCESS_THREADS,
                        help=f"sender threads of each process of the process curve (default {PROCESS_THREADS})")
    parser.add_argument("--group-each", action="store_true",
                        help="also run each point of the process curve with a group per process (nothing shared: "
                             "the reference one group's instances are held to)")
    parser.add_argument("--floor-appends", type=int, default=200, help="bare delta-rs appends for the floor")
    parser.add_argument("--object-store", action="store_true",
                        help="every lakehouse on a loopback S3 server (coordinator/conformance/versitygw.py) instead of a local disk")
    parser.add_argument("--storage-latency-ms", type=float, default=0, help=support.LATENCY_HELP)
    parser.add_argument("--results", default=None,
                        help="default: bench/results/producer.json (producer-s3.json, producer-s3-<N>ms.json)")
    args = harness.parse_args(parser, argv, "producer", TINY)
    args.results = args.results or str(RESULTS / (
        f"producer-s3-{args.storage_latency_ms:g}ms.json" if args.storage_latency_ms
        else "producer-s3.json" if args.object_store else "producer.json"))
    report = harness.start_report("producer", vars(args))
    places = Places(args.object_store, args.storage_latency_ms)
    if places.store is not None:
        report["storage"] = places.store.settings()
    try:
        floor = append_floor(places, args.floor_appends)
        print(f"append floor (bare delta-rs append of one row, warm table): p50 {floor['p50_ms']} ms, "
              f"p99 {floor['p99_ms']} ms", flush=True)
        runs = [run(places, threads, args.seconds, 1, floor) for threads in args.threads]
        if args.batch:
            runs.append(run(places, max(args.threads), args.seconds, args.batch, floor))
        curve = [run(places, args.process_threads, args.seconds, 1, floor, processes, group_each)
                 for processes in args.processes
                 for group_each in ((False, True) if args.group_each and processes > 1 else (False,))]
        scaling(curve)
    finally:
        places.close()
    print(f"{'procs':>5} {'groups':>6} {'threads':>7} {'msgs/txn':>8} {'txns':>7} {'txn/s':>8} {'msg/s':>8} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'p50/floor':>9} {'p99/floor':>9} {'commits/s':>9} {'txn/commit':>10} "
          f"{'cpu busy':>8}")
    for r in runs + curve:
        print(f"{r['processes']:>5} {r['groups']:>6} {r['threads']:>7} {r['messages_per_txn']:>8} {r['transactions']:>7} "
              f"{r['txn_per_s']:>8} {r['messages_per_s']:>8} {r['send_p50_ms']:>8} {r['send_p99_ms']:>8} "
              f"{r['send_p50_vs_floor']:>9} {r['send_p99_vs_floor']:>9} {r['commits_per_s']:>9} "
              f"{r['txn_per_commit']:>10} {r['cpu_busy']!s:>8}")
    print(f"\nthe process curve against one process of it: {'procs':>5} {'groups':>6} {'txn/s x':>7} "
          f"{'p99 x':>6} {'fewest/mean':>11}")
    for r in curve:
        if "vs_one_process" in r:
            ratios = r["vs_one_process"]
            print(f"{'':>44} {r['processes']:>5} {r['groups']:>6} {ratios['txn_per_s']!s:>7} "
                  f"{ratios['send_p99']!s:>6} {r['fewest_vs_mean']:>11}")
    if places.store is not None:
        print(f"\nbehind {args.storage_latency_ms:g} ms a request; the producers' requests ({support.S3_PRICES}):")
        print(f"{'procs':>5} {'threads':>7} {'fewest txns':>11} {'req/version':>11} {'lost races/v':>12} "
              f"{'req per 1M txn':>14} {'USD per 1M txn':>14}")
        for r in runs + curve:
            print(f"{r['processes']:>5} {r['threads']:>7} {r['fewest_txns_of_a_process']:>11} "
                  f"{r['requests_per_version']!s:>11} {r['lost_races_per_version']!s:>12} "
                  f"{r['requests_per_million_txn']['total']:>14.0f} {r['usd_per_million_txn']:>14}")
    report.update(append_floor_p50_ms=floor["p50_ms"], append_floor=floor, runs=runs, processes=curve)
    return harness.finish_report(report, Path(args.results))


def scaling(curve: list[dict]) -> None:
    """Give each point of the process curve its ratios to the curve's one-process point of the same run
    (``vs_one_process``: txn/s and send p99), the figures a group's scaling is judged by."""
    one = next((r for r in curve if r["processes"] == 1), None)
    if one is None:
        return
    for r in curve:
        r["vs_one_process"] = {"txn_per_s": round(r["txn_per_s"] / one["txn_per_s"], 2),
                               "send_p99": round(r["send_p99_ms"] / one["send_p99_ms"], 2)}


if __name__ == "__main__":
    main()
