"""The workload all three systems run, and the figures made from what each recorded.

Transaction ``k`` carries one message whose body is ``k`` in ten digits padded with ``x`` to
``body_bytes``; ``k mod 100`` plans its outcome: below ``commit_percent`` it commits, below
``commit_percent + rollback_percent`` it rolls back, otherwise its local transaction answers
"unknown" (RocketMQ and ours: check-back later commits it; Kafka: aborted, as it has no
check-back). ``java/Workload.java`` is the same plan for the Java peers.

Every system writes one CSV row per transaction (``CSV_COLUMNS``), times in ms from its own
start on one clock: when the producer call started and returned, when check-back resolved it,
when a consumer could first read it, and how many times it was delivered. :func:`figures` turns
that into the same numbers for every system.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import Optional

from bench import harness

CSV_COLUMNS = ["index", "outcome", "started_ms", "returned_ms", "resolved_by_check_ms", "first_seen_ms",
               "deliveries", "checks"]
COMMIT, ROLLBACK, UNKNOWN = "commit", "rollback", "unknown"


@dataclass(frozen=True)
class Plan:
    """How many transactions, from how many threads, at what rate (0: as fast as they go), with what outcomes.

    Example::

        plan = Plan(transactions=20_000, threads=64, rate=0, commit_percent=80, rollback_percent=10)
        plan.outcome_of(85)  # "rollback"
    """

    transactions: int
    threads: int
    rate: float
    commit_percent: int
    rollback_percent: int
    body_bytes: int = 200

    def __post_init__(self) -> None:
        if not 0 <= self.commit_percent + self.rollback_percent <= 100 or min(self.commit_percent, self.rollback_percent) < 0:
            raise ValueError("commit and rollback percentages must be ≥ 0 and add up to at most 100")
        if self.transactions < 1 or self.threads < 1 or self.rate < 0 or self.body_bytes < 10:
            raise ValueError("need ≥ 1 transaction, ≥ 1 thread, a rate ≥ 0 and bodies of ≥ 10 bytes")

    @property
    def unknown_percent(self) -> int:
        return 100 - self.commit_percent - self.rollback_percent

    def outcome_of(self, index: int) -> str:
        slot = index % 100
        if slot < self.commit_percent:
            return COMMIT
        return ROLLBACK if slot < self.commit_percent + self.rollback_percent else UNKNOWN

    def body_of(self, index: int) -> bytes:
        return f"{index:010d}".encode().ljust(self.body_bytes, b"x")

    def index_of(self, body: bytes) -> Optional[int]:
        """The transaction index in a body this plan wrote, or ``None``."""
        head = body[:10]
        if len(body) != self.body_bytes or not head.isdigit():
            return None
        index = int(head)
        return index if index < self.transactions else None

    def driver_args(self) -> list[str]:
        """The plan as the Java drivers' options."""
        return ["--transactions", str(self.transactions), "--threads", str(self.threads), "--rate", str(self.rate),
                "--commit-percent", str(self.commit_percent), "--rollback-percent", str(self.rollback_percent),
                "--body-bytes", str(self.body_bytes)]


def read_rows(path: str) -> list[dict]:
    """The CSV a system wrote, with times as floats (``None`` where it never happened)."""
    def number(text: str) -> Optional[float]:
        return float(text) if text else None

    with open(path, newline="") as file:
        return [{"index": int(row["index"]), "outcome": row["outcome"], "started_ms": number(row["started_ms"]),
                 "returned_ms": number(row["returned_ms"]), "resolved_by_check_ms": number(row["resolved_by_check_ms"]),
                 "first_seen_ms": number(row["first_seen_ms"]), "deliveries": int(row["deliveries"]),
                 "checks": int(row["checks"])} for row in csv.DictReader(file)]


def write_rows(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows({column: ("" if row[column] is None else row[column]) for column in CSV_COLUMNS}
                         for row in rows)


def figures(rows: list[dict], send_seconds: float) -> dict:
    """Throughput, latencies and delivery counts from one system's rows.

    ``committed_txn_per_s`` counts transactions whose producer call committed them (not those
    check-back commits later) over the sending time. Commit → consumable is measured from the
    producer call's return for committed ones; check-back → consumable from the same return for
    unknown ones that were later committed.
    """
    returned = [row for row in rows if row["returned_ms"] is not None]
    by_outcome = {outcome: [row for row in returned if row["outcome"] == outcome] for outcome in (COMMIT, ROLLBACK, UNKNOWN)}
    sends = [row["returned_ms"] - row["started_ms"] for row in returned]
    commit_latency = [row["first_seen_ms"] - row["returned_ms"] for row in by_outcome[COMMIT] if row["first_seen_ms"] is not None]
    unknown_latency = [row["first_seen_ms"] - row["returned_ms"] for row in by_outcome[UNKNOWN]
                       if row["first_seen_ms"] is not None]

    def ms(value: Optional[float]) -> Optional[float]:
        return None if value is None else round(value, 1)

    return {
        "transactions": len(rows),
        "send_errors": len(rows) - len(returned),
        "send_seconds": round(send_seconds, 3),
        "txn_per_s": round(len(returned) / send_seconds, 1),
        "committed_txn_per_s": round(len(by_outcome[COMMIT]) / send_seconds, 1),
        "send_p50_ms": ms(harness.percentile(sends, 0.5)),
        "send_p99_ms": ms(harness.percentile(sends, 0.99)),
        "commit_to_consumable_p50_ms": ms(harness.percentile(commit_latency, 0.5)),
        "commit_to_consumable_p99_ms": ms(harness.percentile(commit_latency, 0.99)),
        "unknown_to_consumable_p50_ms": ms(harness.percentile(unknown_latency, 0.5)),
        "unknown_to_consumable_p99_ms": ms(harness.percentile(unknown_latency, 0.99)),
        "committed_delivered": len(commit_latency),
        "committed_missing": len(by_outcome[COMMIT]) - len(commit_latency),
        "unknown_delivered": len(unknown_latency),
        "unknown_checked": sum(1 for row in by_outcome[UNKNOWN] if row["checks"] > 0),
        "rolled_back_delivered": sum(1 for row in by_outcome[ROLLBACK] if row["deliveries"] > 0),
        "duplicate_deliveries": sum(row["deliveries"] - 1 for row in rows if row["deliveries"] > 1),
    }
