"""Trigger cost against the number of producer groups: one busy group among many idle ones, against one group alone.

Each group has a commit log of its own, and the checker's source looks at every log each trigger (a
listing of ``groups/``, then one probe of each log's next version). This benchmark measures what
that costs: two lakehouses, one Spark session; lakehouse *one* has a single group, lakehouse *many*
``--groups`` groups (default 50) of which one is busy and the others each hold ``--idle-versions``
commits made before the run (rolled-back transactions) and stay idle. The same rounds
(:func:`support.streaming_triggers`: commits of ``--transactions`` transactions, waited for until
delivered, then heartbeat-only triggers) run through the real streaming checker on *one*, then on
*many*, ``--runs`` times alternately, so machine load hits both alike. Reported: the median trigger
time with records and heartbeat-only on each, and their ratios *many* / *one* (the target: at most
1.5 with records).

    python -m bench.groups
    python -m bench.groups --object-store      # both lakehouses on a loopback S3 server (coordinator/conformance/versitygw.py)
    python -m bench.groups --tiny              # the smallest run, for the tests (bench/tests/test_bench.py)
    python -m bench.groups --storage-latency-ms 25 --runs 1 --rounds 2
                                               # on the S3 server, 25 ms added to every request

With ``--storage-latency-ms N`` (N > 0) both lakehouses are on the loopback S3 server behind the
storage-fault proxy, N ms added to every request (``support.LatencyStore``): the checker (its
delta-rs and obstore reads and writes, and the Spark session's S3A checkpoint) through one proxy, the
rounds' commit-log commits through another; the idle groups are made straight. Each run then also
reports the checker's requests by kind, per trigger and per million transactions, priced at S3's list
prices.

Prints a table and writes ``bench/results/groups.json`` (``groups-object-store.json`` with
``--object-store``, ``groups-s3-<N>ms.json`` with ``--storage-latency-ms N``; ``--results`` to change).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import tempfile
import uuid
from pathlib import Path

from bench import harness

import support

from coordinator.conformance.versitygw import S3Server

BUSY_GROUP = "bench-busy"
TOPIC = "BENCH_GROUPS"
BUCKET = "bench-groups"
#: ``--tiny``: three groups, one round per run, one run each.
TINY = {"groups": 3, "idle_versions": 1, "runs": 1, "rounds": 1, "transactions": 20}
TARGET_RATIO = 1.5


def idle_group(config, group: str, versions: int) -> None:
    """``group``'s tables, and ``versions`` commits of a rolled-back transaction each (delivering nothing)."""
    from coordinator.lakehouse import Lakehouse, create_group_tables
    from coordinator.producer.commit_log import CommitLogWriter, end_record
    from coordinator.producer.transaction_producer import time_ordered_id
    from coordinator.protocol import LocalTransactionState

    lakehouse = Lakehouse.of(config)
    create_group_tables(lakehouse, group)
    with CommitLogWriter(lakehouse, group) as writer:
        for _ in range(versions):
            transaction = time_ordered_id()
            writer.submit(support.half_rows([transaction], group, TOPIC)
                          + [end_record(group, transaction, LocalTransactionState.ROLLBACK_MESSAGE)]).result()


def checker_requests(requests: dict, figures: dict, args: argparse.Namespace) -> dict:
    """The checker's ``requests`` over one run of :func:`support.streaming_triggers` (its warm-up round too),
    per trigger and per million transactions delivered, with their cost."""
    return {"checker_requests": support.request_cost(requests, (args.rounds + 1) * args.transactions),
            "checker_requests_per_trigger": round(requests["total"] / figures["triggers"], 1)}


def lakehouse_config(root: str, storage: dict):
    from coordinator.config import CoordinatorConfig
    from coordinator.lakehouse import Lakehouse, init_lakehouse

    config = CoordinatorConfig(lakehouse=root, storage=storage)
    init_lakehouse(Lakehouse.of(config))
    return config


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=50, help="groups of lakehouse *many*, one of them busy")
    parser.add_argument("--idle-versions", type=int, default=3, help="commits each idle group holds")
    parser.add_argument("--runs", type=int, default=2, help="checker runs on each lakehouse, alternately")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per run (after one warm-up round)")
    parser.add_argument("--transactions", type=int, default=200, help="transactions per round (two commits)")
    parser.add_argument("--object-store", action="store_true", help="both lakehouses on a loopback S3 server")
    parser.add_argument("--storage-latency-ms", type=float, default=0, help=support.LATENCY_HELP)
    parser.add_argument("--results", default=None)
    args = harness.parse_args(parser, argv, "groups", TINY)
    suffix = (f"-s3-{args.storage_latency_ms:g}ms" if args.storage_latency_ms
              else "-object-store" if args.object_store else "")
    results = Path(args.results or harness.RESULTS / f"groups{suffix}.json")
    report = harness.start_report("groups", vars(args))
    store = None

    workdir = tempfile.mkdtemp(prefix="bench-groups-")
    with contextlib.ExitStack() as stack, support.spark_session("bench-groups") as spark:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        if args.storage_latency_ms:
            store = stack.enter_context(support.LatencyStore(args.storage_latency_ms, workdir))
            report["storage"] = store.settings()
            support.reach_object_store(spark, store.storage("checker"))
            roots, storage = {name: store.new_root() for name in ("one", "many")}, store.direct
        elif args.object_store:
            server = stack.enter_context(S3Server(f"{workdir}/s3"))
            server.create_bucket(BUCKET)
            support.reach_object_store(spark, server.storage_options)
            roots, storage = {name: f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}" for name in ("one", "many")}, \
                server.storage_options
        else:
            roots, storage = {name: f"{workdir}/{name}" for name in ("one", "many")}, {}
        configs = {name: lakehouse_config(root, storage) for name, root in roots.items()}
        for index in range(args.groups - 1):
            idle_group(configs["many"], f"bench-idle-{index:03d}", args.idle_versions)
        routes = {}
        if store is not None:  # made straight; the checker through its proxy, the rounds' commits through another
            routes = {"producer_storage": store.storage("producer"), "reader_storage": store.direct}
            configs = {name: dataclasses.replace(config, storage=store.storage("checker"))
                       for name, config in configs.items()}
        print(f"lakehouse one: 1 group; lakehouse many: {args.groups} groups, 1 busy, the others holding "
              f"{args.idle_versions} commits each; {args.transactions} transactions a round", flush=True)
        runs = {"one": [], "many": []}
        for run in range(args.runs):
            for name, config in configs.items():
                before = None if store is None else store.counts("checker")
                figures = support.streaming_triggers(spark, config, BUSY_GROUP, TOPIC, args.rounds, args.transactions,
                                                     **routes)
                if store is not None:
                    figures.update(checker_requests(store.requests_since("checker", before), figures, args))
                runs[name].append(figures)
                print(f"  run {run + 1} {name:>4}: trigger with records {figures['trigger_ms_median_with_records']} ms, "
                      f"heartbeat-only {figures['trigger_ms_median_heartbeat']} ms ({figures['triggers']} triggers)",
                      flush=True)

    summary = {name: {kind: harness.median([run[f"trigger_ms_median_{kind}"] for run in figures])
                      for kind in ("with_records", "heartbeat")} for name, figures in runs.items()}
    ratios = {kind: round(summary["many"][kind] / summary["one"][kind], 2) for kind in ("with_records", "heartbeat")}
    report.update(runs=runs, trigger_ms_median=summary, ratio=ratios, target_ratio=TARGET_RATIO,
                  within_target=ratios["with_records"] <= TARGET_RATIO)
    print(f"\n{'trigger, median ms':>20} {'1 group':>8} {f'{args.groups} groups':>10} {'ratio':>6}")
    for kind in ("with_records", "heartbeat"):
        print(f"{kind.replace('_', ' '):>20} {summary['one'][kind]:>8} {summary['many'][kind]:>10} {ratios[kind]:>6}")
    print(f"target: with records at most {TARGET_RATIO}x: {'met' if report['within_target'] else 'MISSED'}")
    if store is not None:
        print(f"the checker's requests behind {args.storage_latency_ms:g} ms ({support.S3_PRICES}):")
        for name, figures in runs.items():
            for run in figures:
                print(f"  {name:>4}: {run['checker_requests_per_trigger']} a trigger, "
                      f"{run['checker_requests']['per_million_transactions']['total']:.0f} per million transactions, "
                      f"${run['checker_requests']['usd_per_million_transactions']} per million transactions")
    return harness.finish_report(report, results)


if __name__ == "__main__":
    main()
