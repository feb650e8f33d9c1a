"""Producer benchmark: committed transactions per second and send latency, one process.

The local transaction is a no-op that commits, so what is measured is the
coordinator's own cost: validating, group-committing halves to the commit log
through delta-rs, and queueing the one-way END. No JVM is involved.

    python bench/producer.py                      # 1, 16, 64, 128 and 256 threads, plus batched sends
    python bench/producer.py --seconds 5 --threads 16

Prints a table and writes ``bench/results/producer.json`` (``--results`` to change), with the
load average at start and end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

from deltalake import DeltaTable

from coordinator import CoordinatorConfig, LocalTransactionState, Message, TransactionListener, TransactionProducer
from coordinator.tables import COMMIT_LOG

RESULTS = benchlib.RESULTS
BODY = benchlib.BODY


class Commits(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(threads: int, seconds: float, messages_per_txn: int) -> dict:
    """Send from ``threads`` threads for ``seconds``; return throughput and latency figures."""
    with tempfile.TemporaryDirectory() as lakehouse:
        config = CoordinatorConfig(lakehouse=lakehouse)
        latencies: list[float] = []
        lock = threading.Lock()
        stop_at = time.monotonic() + seconds

        def sender(producer: TransactionProducer) -> None:
            mine = []
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                if messages_per_txn == 1:
                    producer.send_message_in_transaction(Message("BENCH", BODY))
                else:
                    producer.send_messages_in_transaction([Message("BENCH", BODY) for _ in range(messages_per_txn)])
                mine.append(time.perf_counter() - started)
            with lock:
                latencies.extend(mine)

        with TransactionProducer("bench", Commits(), config) as producer:
            began = time.perf_counter()
            workers = [threading.Thread(target=sender, args=(producer,)) for _ in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            elapsed = time.perf_counter() - began
        commits = DeltaTable(COMMIT_LOG.path(lakehouse)).version()  # version 0 created the table
        return {
            "threads": threads,
            "messages_per_txn": messages_per_txn,
            "transactions": len(latencies),
            "seconds": round(elapsed, 3),
            "txn_per_s": round(len(latencies) / elapsed, 1),
            "messages_per_s": round(len(latencies) * messages_per_txn / elapsed, 1),
            "send_p50_ms": round(statistics.median(latencies) * 1000, 2),
            "send_p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
            # HALFs and ENDs share commits: how far group commit gathered the sends.
            "commits": commits,
            "commits_per_s": round(commits / elapsed, 1),
            "txn_per_commit": round(len(latencies) / commits, 1),
        }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="sending time per configuration")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 16, 64, 128, 256])
    parser.add_argument("--batch", type=int, default=10, help="messages per send_messages_in_transaction run")
    parser.add_argument("--results", default=str(RESULTS / "producer.json"))
    args = parser.parse_args(argv)
    report = benchlib.start_report("producer", vars(args))
    runs = [run(threads, args.seconds, 1) for threads in args.threads]
    runs.append(run(max(args.threads), args.seconds, args.batch))
    print(f"{'threads':>7} {'msgs/txn':>8} {'txns':>7} {'txn/s':>8} {'msg/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'commits/s':>9} {'txn/commit':>10}")
    for r in runs:
        print(f"{r['threads']:>7} {r['messages_per_txn']:>8} {r['transactions']:>7} {r['txn_per_s']:>8} "
              f"{r['messages_per_s']:>8} {r['send_p50_ms']:>8} {r['send_p99_ms']:>8} {r['commits_per_s']:>9} "
              f"{r['txn_per_commit']:>10}")
    report["runs"] = runs
    return benchlib.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
