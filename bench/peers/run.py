"""Side by side: this product, Apache RocketMQ's transactional messages and Apache Kafka's
transactions, on the same workload, on this machine, in one run. This product runs twice: through the Python
producer (``ours``) and through its Java client in a JVM like the peers' drivers (``ours-java``), so that the
three Java clients compare in the same language.

    python -m bench.peers.run                       # docs/side-by-side.md's table (its time: docs/performance.md)
    python -m bench.peers.run --transactions 2000 --paced-seconds 10 --systems rocketmq ours ours-java
    python -m bench.peers.run --tiny --systems ours # 100 transactions per phase, for the tests

Needs a JDK 17 and Maven (``install.py`` resolves RocketMQ 5.5.0 and Kafka 4.3.1 from Maven
Central into ``.cache/peers`` on first use, and builds clients/java) and ``make setup`` for our side. Each system
is started on loopback (ours: its checker on a fresh lakehouse), runs two phases, and is stopped before the next
one starts:

* **max**: ``--transactions`` transactions as fast as ``--threads`` sender threads go: committed
  transactions per second and send latency;
* **paced**: ``--paced-rate`` transactions per second for ``--paced-seconds``, well under every
  system's maximum: commit → consumable latency without a backlog.

Both use ``--commit-percent`` / ``--rollback-percent`` (the rest stay unknown: check-back
commits them for RocketMQ and ours; Kafka has no check-back and aborts them) and one message
of ``--body-bytes`` per transaction. Writes ``bench/results/peers.json``, prints each phase's
figures and, last, docs/side-by-side.md's Markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


from bench import harness
from bench.peers import install, ours, servers, workload

SYSTEMS = ("rocketmq", "kafka", "ours", "ours-java")
#: This product's rows: the system's name → the client whose producer sends (bench/peers/ours.py).
OURS = {"ours": "python", "ours-java": "java"}
PARTITIONS = 8  # RocketMQ queues / Kafka partitions of the topic
#: ``--tiny``: every system and both phases, with 100 transactions each (the fewest with every outcome, since a
#: transaction's index mod 100 plans it: 10 left unknown for check-back) sent from 4 threads.
TINY = {"transactions": 100, "threads": 4, "paced_rate": 50, "paced_seconds": 2, "drain": 60, "grace": 0.5}

#: What each system promises, and why; the run adds what it measured (duplicates, leaked rollbacks).
GUARANTEES = {
    "rocketmq": {
        "exactly_once_into_destination": "no: at least once. A committed half can be re-checked and written to the "
                                         "topic again after a lost op message, and consumers get redeliveries; they "
                                         "must be idempotent",
        "check_back": "yes: the broker asks the producer group about halves left unresolved past the immunity time",
        "multi_topic_atomicity": "no: one message per transaction",
        "sql_queryable": "no: messages are read by consumers, not queried",
    },
    "kafka": {
        "exactly_once_into_destination": "yes within Kafka: idempotent transactional producer and read_committed "
                                         "consumers; writing elsewhere needs the sink's own transaction",
        "check_back": "no: an unresolved transaction is aborted after transaction.timeout.ms; the producer is never asked",
        "multi_topic_atomicity": "yes: one transaction spans partitions and topics, visible together",
        "sql_queryable": "no: needs another engine (ksqlDB, Flink, Spark) reading the topic",
    },
    "ours": {
        "exactly_once_into_destination": "yes: promotion into the topic table is an idempotent Delta write "
                                         "(txnAppId/txnVersion), replay-safe after any crash",
        "check_back": "yes: system/check_requests, answered by the producer's listener (RocketMQ's protocol)",
        "multi_topic_atomicity": "yes, all or none: one END decides every message of a transaction; each topic "
                                 "table commits separately, so topics may show them a batch apart at most",
        "sql_queryable": "yes: topics and the whole audit trail are Delta tables (Spark SQL, delta-rs)",
    },
}
GUARANTEES["ours-java"] = GUARANTEES["ours"]  # the same protocol and checker, another client


def run_java_peer(system: install.System, plan: workload.Plan, topic: str, workdir: Path, connect: list[str],
                  drain_s: float, grace_s: float) -> tuple[Path, dict]:
    """One phase of a Java driver; returns its CSV's path and its summary line."""
    csv_path = workdir / f"{topic}.csv"
    argv = servers.java(system, system.driver, *connect, "--topic", topic, *plan.driver_args(),
                        "--drain-seconds", str(drain_s), "--grace-seconds", str(grace_s), "--ready-seconds", "60",
                        "--partitions", str(PARTITIONS), "--out", str(csv_path), heap="1g", cwd=workdir)
    with open(workdir / f"{topic}.driver.log", "w") as log:
        result = subprocess.run(argv, cwd=workdir, stdout=subprocess.PIPE, stderr=log, text=True)
    summary_lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not summary_lines:
        raise RuntimeError(f"{system.driver} failed (exit {result.returncode}); see {workdir / (topic + '.driver.log')}")
    return csv_path, json.loads(summary_lines[-1])


def run_system(name: str, phases: dict[str, workload.Plan], workdir: Path, drain_s: float, grace_s: float) -> dict:
    """Start ``name``, run every phase on its own topic, stop it; returns phase → figures."""
    results = {}

    def record(phase: str, csv_path: Path, summary: dict) -> None:
        figures = workload.figures(workload.read_rows(str(csv_path)), summary.pop("send_seconds"))
        results[phase] = {**figures, **summary}
        f = results[phase]
        print(f"  {phase}: {f['committed_txn_per_s']} committed txn/s, send p50 {f['send_p50_ms']} / p99 "
              f"{f['send_p99_ms']} ms, commit→consumable p50 {f['commit_to_consumable_p50_ms']} / p99 "
              f"{f['commit_to_consumable_p99_ms']} ms, missing {f['committed_missing']}, duplicates "
              f"{f['duplicate_deliveries']}", flush=True)

    print(f"\n=== {name}", flush=True)
    if name in OURS:
        topics = {phase: (plan, f"PEERS_{phase.upper()}") for phase, plan in phases.items()}
        for phase, (csv_path, summary) in ours.run(topics, workdir, drain_s, grace_s, client=OURS[name]).items():
            record(phase, csv_path, summary)
        return results

    system = install.install(install.SYSTEMS[name])
    server = servers.RocketMQServer(workdir) if name == "rocketmq" else servers.KafkaServer(workdir)
    with server:
        for phase, plan in phases.items():
            topic = f"Peers{phase.capitalize()}"
            connect = server.driver_args(topic, PARTITIONS)
            record(phase, *run_java_peer(system, plan, topic, workdir, connect, drain_s, grace_s))
    return results


def ratio(ours_value, peer_value):
    return None if not ours_value or not peer_value else round(ours_value / peer_value, 2)


#: The figures compared in the table, and the phase each comes from.
COMPARED = {"committed_txn_per_s": "max", "send_p50_ms": "max", "send_p99_ms": "max",
            "commit_to_consumable_p50_ms": "paced", "commit_to_consumable_p99_ms": "paced"}


def ratios(phases: dict[str, dict[str, dict]], ours_name: str = "ours") -> dict:
    """``ours_name`` ÷ peer, per peer (not our other row): above 1 means ours is higher (better for throughput,
    worse for latency)."""
    return {peer: {field: ratio(phases[phase][ours_name].get(field), phases[phase][peer].get(field))
                   for field, phase in COMPARED.items()}
            for peer in phases["max"] if peer not in OURS}


def markdown_table(report: dict) -> str:
    """docs/side-by-side.md's table: one row per system, with ours ÷ it beside each figure."""
    phases = report["phases"]
    # Beside a peer's figure, each of our rows' ratio to it: "ours" the Python producer's, "ours in Java" the Java's.
    versus_label = {"ratios": "ours", "ratios_java": "ours in Java"}
    names = {"rocketmq": f"RocketMQ {install.ROCKETMQ.version}", "kafka": f"Kafka {install.KAFKA.version}",
             "ours": "this product (Python producer)", "ours-java": f"this product (Java client {install.OURS_JAVA.version})"}
    lines = ["| system | committed txn/s (max) | send p50 / p99 ms (max) | commit→consumable p50 / p99 ms (paced) "
             "| unknown→consumable p50 ms (paced) | exactly once | check-back | multi-topic atomic | SQL |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in (n for n in SYSTEMS if n in phases["max"]):
        top, paced, promises = phases["max"][name], phases["paced"][name], GUARANTEES[name]

        def cell(value, key):
            beside = []
            for ratios_key, label in versus_label.items():
                times = report.get(ratios_key, {}).get(name, {}).get(key)
                if times is not None:
                    beside.append(f"{label} ×{times:,.0f}" if times >= 100 else f"{label} ×{times:g}")
            return f"{value} ({', '.join(beside)})" if beside else f"{value}"

        def short(text):
            return text.split(":")[0]

        unknown = paced["unknown_to_consumable_p50_ms"]
        lines.append(
            f"| {names[name]} | {cell(top['committed_txn_per_s'], 'committed_txn_per_s')} "
            f"| {cell(top['send_p50_ms'], 'send_p50_ms')} / {cell(top['send_p99_ms'], 'send_p99_ms')} "
            f"| {cell(paced['commit_to_consumable_p50_ms'], 'commit_to_consumable_p50_ms')} / "
            f"{cell(paced['commit_to_consumable_p99_ms'], 'commit_to_consumable_p99_ms')} "
            f"| {'aborted (no check-back)' if unknown is None else unknown} "
            f"| {short(promises['exactly_once_into_destination'])} | {short(promises['check_back'])} "
            f"| {short(promises['multi_topic_atomicity'])} | {short(promises['sql_queryable'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--transactions", type=int, default=20_000, help="transactions in the max phase")
    parser.add_argument("--threads", type=int, default=64, help="producer threads, the same for every system")
    parser.add_argument("--paced-rate", type=float, default=200, help="offered transactions/s in the paced phase")
    parser.add_argument("--paced-seconds", type=float, default=60)
    parser.add_argument("--commit-percent", type=int, default=80)
    parser.add_argument("--rollback-percent", type=int, default=10)
    parser.add_argument("--body-bytes", type=int, default=200)
    parser.add_argument("--drain", type=float, default=300, help="seconds to wait for the last deliveries of a phase")
    parser.add_argument("--grace", type=float, default=3,
                        help="seconds to keep consuming after the last expected delivery, to catch duplicates")
    parser.add_argument("--workdir", default=None, help="default: a temporary directory, removed afterwards")
    parser.add_argument("--results", default=str(harness.RESULTS / "peers.json"))
    args = harness.parse_args(parser, argv, "peers", TINY)

    shared = dict(threads=args.threads, commit_percent=args.commit_percent, rollback_percent=args.rollback_percent,
                  body_bytes=args.body_bytes)
    plans = {"max": workload.Plan(transactions=args.transactions, rate=0, **shared),
             "paced": workload.Plan(transactions=int(args.paced_rate * args.paced_seconds), rate=args.paced_rate, **shared)}
    for name in args.systems:
        if name != "ours":
            install.install(install.SYSTEMS[name])  # resolve (ours-java: build) before any timing starts

    report = harness.start_report("peers", vars(args))
    report.update(
        versions={"rocketmq": install.ROCKETMQ.version, "kafka": install.KAFKA.version,
                  "ours-java": install.OURS_JAVA.version, "java": _java_version()},
        durability={name: servers.DURABILITY[name] for name in args.systems},
        check_back_settings={"transaction_timeout_ms": servers.TRANSACTION_TIMEOUT_MS,
                             "transaction_check_interval_ms": servers.TRANSACTION_CHECK_INTERVAL_MS,
                             "our_trigger_interval_ms": ours.TRIGGER_INTERVAL_MS},
        plans={phase: vars(plan) for phase, plan in plans.items()},
        guarantees={name: GUARANTEES[name] for name in args.systems},
    )
    started = time.monotonic()
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-peers-"))
    by_system = {name: run_system(name, plans, servers.fresh_workdir(root, name), args.drain, args.grace)
                 for name in args.systems}
    report["phases"] = {phase: {name: by_system[name][phase] for name in args.systems} for phase in plans}
    if "ours" in args.systems:
        report["ratios"] = ratios(report["phases"])
    if "ours-java" in args.systems:
        report["ratios_java"] = ratios(report["phases"], "ours-java")
    report["seconds"] = round(time.monotonic() - started, 1)
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    harness.finish_report(report, Path(args.results))
    print("\n" + markdown_table(report), flush=True)
    return report


def _java_version() -> str:
    result = subprocess.run(["java", "-version"], capture_output=True, text=True)
    return result.stderr.splitlines()[0] if result.stderr else "unknown"


if __name__ == "__main__":
    main()
