"""A consumer group's lag at a million messages (issue 59 point 6): what a Prometheus scrape of the checker's
consumer metrics costs, in requests and seconds, now that the lag is counted from the group's progress records and
the topic log's statistics; beside the way it was counted before, measured in the same run: every row of every
version the group had not finished, read for each share (``describe_consumer_group`` as it was at
:data:`REFERENCE_COMMIT`, loaded from git).

On the loopback S3 server (``support.LatencyStore``): the scrapes go through a proxy of their own that adds
``--storage-latency-ms`` to every request and counts them, the old way through another; the benchmark's own writes
and the consumer go straight.

1. Group ``lagging`` (``--shares`` shares) consumes a first version of ``--per-version`` messages with a real
   ``TopicConsumer``, and stops: each share's progress record (and its redrive table's) is as an instance wrote it.
2. ``--lag`` messages more, ``--per-version`` a version with random keys, appended as the checker appends
   (``support.TopicFeed``, whose appender checkpoints the topic every ``delta.checkpointInterval`` versions, 20): the group's lag.
3. Scrapes (``ConsumerGroupsCollector.collect``, what the checker's endpoint runs at each scrape): a new
   collector's (``cold``), then the same collector's again (``warm``, nothing committed since). Then the topic
   grows by one-message versions to the last version before its next checkpoint (the most commits a scrape reads
   past one) and is scraped again, by a new collector and by the one kept.
4. The old way, once, at the lag of step 2, given at most ``--reference-timeout-s`` in a process of its own
   (stopped there: what it did by then is reported).

Target (issue 59 point 6): a scrape at a lag of 1,000,000 in ≤ 2 s and ≤ 50 requests at 25 ms a request.

    python -m bench.group_lag                       # 25 ms a request, a lag of 1,000,000
    python -m bench.group_lag --tiny                # the smallest run, for bench/tests/test_bench.py

Prints each figure (against the target) and writes ``bench/results/group-lag-s3-<N>ms.json`` (``--results`` to
change).
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import queue
import random
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Optional

from bench import harness

import support

TOPIC = "BENCH_LAG"
GROUP = "lagging"
#: Where the lag was counted by reading every row: the reference, loaded from git in the run.
REFERENCE_COMMIT = "67f1c9b"
TARGETS = {"scrape_s": 2.0, "scrape_requests": 50}
TINY = {"lag": 2_000, "per_version": 100, "shares": 4, "storage_latency_ms": 5.0, "reference_timeout_s": 120.0}
KEYS = 10_000
BODY = b"x" * 16


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lag", type=int, default=1_000_000, help="messages the group has not handled")
    parser.add_argument("--per-version", type=int, default=1_000, help="messages a topic version")
    parser.add_argument("--shares", type=int, default=16, help="the group's shares a topic (the product's default)")
    parser.add_argument("--storage-latency-ms", type=float, default=25.0, help=support.LATENCY_HELP)
    parser.add_argument("--reference-timeout-s", type=float, default=3600.0,
                        help="how long the old way may run before it is stopped")
    parser.add_argument("--results", default=None)
    args = harness.parse_args(parser, argv, "group_lag", TINY)
    results = Path(args.results or harness.RESULTS / f"group-lag-s3-{args.storage_latency_ms:g}ms.json")
    report = harness.start_report("group_lag", vars(args))
    with tempfile.TemporaryDirectory() as workdir, \
            support.LatencyStore(args.storage_latency_ms, workdir, parties=("scrape", "reference")) as store:
        report["storage"] = store.settings()
        report |= run(store, args)
    for name, scrape in report["scrapes"].items():
        met = scrape["seconds"] <= TARGETS["scrape_s"] and scrape["requests"]["total"] <= TARGETS["scrape_requests"]
        print(f"{name:>32}: lag {scrape['lag_messages']:>9,} (written {scrape['written_lag']:>9,}), "
              f"{scrape['commits_past_checkpoint']:>3} commits past the checkpoint: {scrape['seconds']:6.2f} s, "
              f"{scrape['requests']['total']:>4} requests ({scrape['requests']['GET']} GET, "
              f"{scrape['requests']['LIST']} LIST): {'met' if met else 'missed'}", flush=True)
    reference = report["reference"]
    print(f"{'the old way (' + REFERENCE_COMMIT + ')':>32}: lag {reference['lag_messages'] or '?':>9}, "
          f"{reference['seconds']:8.1f} s, {reference['requests']['total']:>6} requests"
          f"{'' if reference['finished'] else ' (stopped: not finished)'}", flush=True)
    return harness.finish_report(report, results)


def run(store: support.LatencyStore, args: argparse.Namespace) -> dict:
    from coordinator import CoordinatorConfig
    from coordinator.lakehouse import Lakehouse, init_lakehouse
    from support.consumers import TopicFeed, grant

    direct = CoordinatorConfig(lakehouse=store.new_root(), storage=store.direct)
    init_lakehouse(Lakehouse.of(direct))
    grant(direct, GROUP, [TOPIC], shares=args.shares)
    feed, rnd = TopicFeed(direct), random.Random(59)
    try:
        feed.deliver(TOPIC, messages(rnd, args.per_version))
        consume(direct, args.per_version)
        started = time.monotonic()
        for _ in range(args.lag // args.per_version):
            feed.deliver(TOPIC, messages(rnd, args.per_version))
        written_s = time.monotonic() - started
        latest = settled(direct)
        written = args.lag // args.per_version * args.per_version
        scraping = direct.replace(storage=store.storage("scrape"))
        kept = collector(scraping)  # the checker's, from scrape to scrape
        scrapes = {"cold": scrape(store, kept, direct, written), "warm": scrape(store, kept, direct, written)}
        reference = measure_reference(store, direct, args.reference_timeout_s)
        interval = checkpoint_interval(direct)
        for _ in range(interval - 1 - (latest % interval)):  # to the version before the next checkpoint
            feed.deliver(TOPIC, messages(rnd, 1))
            written += 1
        settled(direct)
        scrapes["cold, most commits past a checkpoint"] = scrape(store, collector(scraping), direct, written)
        scrapes["warm, after those commits"] = scrape(store, kept, direct, written)
        scrapes["warm, again"] = scrape(store, kept, direct, written)
    finally:
        feed.close()
    return {"topic": {"versions": latest + 1, "written_s": round(written_s, 1), "checkpoint_interval": interval},
            "scrapes": scrapes, "reference": reference, "targets": TARGETS}


def messages(rnd: random.Random, count: int) -> list[tuple[str, bytes]]:
    return [(f"key-{rnd.randrange(KEYS)}", BODY) for _ in range(count)]


def consume(config, count: int) -> None:
    """Group ``lagging`` handles ``count`` messages with a real consumer, then stops (saving its shares' records)."""
    from coordinator import ConsumeResult, MessageListener, TopicConsumer

    class Counting(MessageListener):
        handled = 0

        def consume(self, message):
            Counting.handled += 1
            return ConsumeResult.SUCCESS

    with TopicConsumer(GROUP, [TOPIC], Counting(), config.replace(consumer_poll_interval_ms=20)):
        deadline = time.monotonic() + 300
        while Counting.handled < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the consumer handled {Counting.handled} of {count} messages in 300 s")
            time.sleep(0.05)


def settled(config) -> int:
    """The topic's newest version, once its appender's checkpoint of it (if one is due) is written."""
    from coordinator.lakehouse import Lakehouse
    from coordinator.lakehouse.checkpoints import last_delta_checkpoint
    from coordinator.lakehouse.row_counts import RowCounts

    files = Lakehouse.of(config).files
    latest, interval = RowCounts(files, f"topics/{TOPIC}").latest(), checkpoint_interval(config)
    deadline = time.monotonic() + 120
    while latest >= interval and (last_delta_checkpoint(files, f"topics/{TOPIC}") or 0) < latest - latest % interval:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no checkpoint of version {latest - latest % interval} in 120 s")
        time.sleep(0.1)
    return latest


def checkpoint_interval(config) -> int:
    from coordinator.appender import DEFAULT_CHECKPOINT_INTERVAL
    from coordinator.lakehouse import Lakehouse, open_table

    lakehouse = Lakehouse.of(config)
    metadata = open_table(lakehouse.topic(TOPIC), storage=lakehouse.storage).metadata()
    return int(metadata.configuration.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL))


def collector(config):
    from coordinator.jobs.consumer_metrics import ConsumerGroupsCollector

    return ConsumerGroupsCollector(config, lambda: dt.datetime.now(dt.timezone.utc))


def scrape(store: support.LatencyStore, metrics, direct, written: int) -> dict:
    """One scrape by ``metrics`` (a collector): its requests, seconds and what it served, beside the lag there is
    (``written``: the messages written since the group stopped, every one it read being handled)."""
    before = store.counts("scrape")
    started = time.perf_counter()
    families = list(metrics.collect())
    seconds = time.perf_counter() - started
    requests = store.requests_since("scrape", before)
    served = {(family.name, sample.labels.get("topic")): sample.value
              for family in families for sample in family.samples if sample.labels.get("group") == GROUP}
    return {"seconds": round(seconds, 3), "requests": requests,
            "lag_messages": int(served[("txcoord_consumer_lag_messages", TOPIC)]),
            "lag_seconds": served[("txcoord_consumer_lag_seconds", TOPIC)],
            "written_lag": written, "commits_past_checkpoint": commits_past_checkpoint(direct)}


def commits_past_checkpoint(config) -> int:
    from coordinator.lakehouse import Lakehouse
    from coordinator.lakehouse.checkpoints import last_delta_checkpoint
    from coordinator.lakehouse.row_counts import RowCounts

    files = Lakehouse.of(config).files
    return RowCounts(files, f"topics/{TOPIC}").latest() - (last_delta_checkpoint(files, f"topics/{TOPIC}") or -1)


def measure_reference(store: support.LatencyStore, direct, timeout_s: float) -> dict:
    """``describe_consumer_group`` of :data:`REFERENCE_COMMIT` through the ``reference`` proxy, in a process of its
    own, stopped after ``timeout_s``."""
    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    process = context.Process(target=reference, daemon=True,
                              args=(direct.lakehouse, store.storage("reference"), answers))
    before = store.counts("reference")
    started = time.monotonic()
    process.start()
    process.join(timeout_s)
    finished = not process.is_alive()
    if not finished:
        process.kill()
        process.join()
    seconds = time.monotonic() - started
    try:
        answer = answers.get(timeout=5) if finished else {}
    except queue.Empty:  # it failed: its error is on stderr
        answer = {}
    return {"commit": REFERENCE_COMMIT, "finished": finished and "lag_messages" in answer,
            "seconds": round(answer.get("seconds", seconds), 1), "requests": store.requests_since("reference", before),
            "lag_messages": answer.get("lag_messages")}


def reference(root: str, storage: dict, answers) -> None:
    """In the reference's process: the old ``describe_consumer_group`` of group ``lagging``, timed."""
    from coordinator import CoordinatorConfig

    source = subprocess.run(["git", "show", f"{REFERENCE_COMMIT}:coordinator/ops/consumer_groups.py"],
                            cwd=harness.ROOT, capture_output=True, text=True, check=True).stdout
    module = types.ModuleType("reference_consumer_groups")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, f"{REFERENCE_COMMIT}:coordinator/ops/consumer_groups.py", "exec"), module.__dict__)
    started = time.perf_counter()
    described = module.describe_consumer_group(CoordinatorConfig(lakehouse=root, storage=storage), GROUP)
    seconds = time.perf_counter() - started
    lag = next(topic.lag_messages for topic in described.topics if topic.topic == TOPIC)
    answers.put({"seconds": seconds, "lag_messages": lag})


if __name__ == "__main__":
    main()
