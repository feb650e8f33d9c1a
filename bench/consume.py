"""The consumer (``TopicConsumer``, issue 54 point 7): throughput, commit→handled, idle cost and failover.

Every consumer instance runs in a process of its own (spawned: a fresh interpreter, as a service runs it), with a
listener that does nothing but count (and, for commit→handled, note when it was handed each transaction).

* **throughput**: a topic of ``--messages`` messages written directly as the checker writes topics
  (``support.consumers.TopicFeed``: ``--versions`` versions, one data file each, rows in queue-offset order,
  random keys) before any consumer starts; then one process of a fresh group consumes it all, and then two
  processes of another fresh group do. Timed from the moment the instances are told to start (each already
  imported and configured) until the listeners have counted every message: the group's start (grant, announce,
  claims) is in the time. Targets: one process ≥ 20,000 messages/s on a local disk, ≥ 5,000/s at 25 ms a
  request; two processes ≥ 1.6 × one.
* **commit→handled**: the real checker job (``spark-submit``, ``--trigger-ms``) and a real producer in this
  process offering ``--rate`` transactions a second for ``--seconds`` (``support.SteadySender``), one consumer
  process already running. For each transaction: commit→visible (its topic version's commitInfo timestamp −
  the send's return, as ``bench/e2e.py`` measures it) and commit→handled (the listener's call − the send's
  return), each at p50 and p99; on a local disk also written→handled (the listener's call − the version's commit
  file's mtime: the consumer's own part, without the checker's write). Targets: handled ≤ visible + 150 ms at p50 and + 400 ms at p99 on a local disk,
  + 300 / + 800 ms at 25 ms a request.
* **idle cost** (with ``--storage-latency-ms`` only: a local disk prices nothing): one consumer process with
  nothing to handle, its requests counted by its proxy over ``--idle-seconds``, by kind, per second and per
  day at S3 Standard's request prices (``support.idle_cost_per_day``). Target: ≤ 4 requests/s, ≤ $0.25 a day.
* **failover**: two instances of a group consume while this process appends a version of
  ``--failover-batch`` messages every ``--failover-interval-ms``; one is killed (SIGKILL); the seconds until the
  other holds every share and until it has handled a message in each share the dead one held. Target: ≤ 10 s.

Behind ``--storage-latency-ms N`` the lakehouse is on the loopback S3 server (``support.LatencyStore``) and every
party goes through a proxy of its own adding N ms to every request: each consumer process (``consumer``,
``consumer-2``), the checker and the producer; the benchmark's own writes and reads go straight.

    python -m bench.consume                                        # local disk, 1,000,000 messages
    python -m bench.consume --storage-latency-ms 25                # the S3 server at 25 ms a request
    python -m bench.consume --messages 200000 --only throughput    # a phase or a few (throughput latency idle failover)
    python -m bench.consume --tiny                                 # every phase, small, for bench/tests/test_bench.py

Prints each figure against its target (met / missed) and writes ``bench/results/consume.json``
(``consume-s3-<N>ms.json`` with ``--storage-latency-ms N``; ``--results`` to change). With
``TXCOORD_BENCH_LOG=info`` (a logging level) in the environment, each consumer process logs to stderr: the shares it
takes and loses, its warnings (how the failover phase's stall at 25 ms a request was found).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import multiprocessing
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from bench import harness

import support

TOPIC = "BENCH_CONSUME"
PHASES = ("throughput", "latency", "idle", "failover")
#: How many shares the benchmark's groups split the topic into (the product's default).
SHARES = 16
#: Distinct keys of the throughput topic: enough that every share has work, few enough that keys repeat.
KEYS = 10_000
BODY = b"x" * 200
#: (local disk, at a storage latency): the targets of issue 54 point 7.
TARGETS = {
    "messages_per_s": (20_000, 5_000),
    "two_processes_speedup": 1.6,
    "handled_over_visible_p50_ms": (150, 300),
    "handled_over_visible_p99_ms": (400, 800),
    "idle_requests_per_s": 4,
    "idle_usd_per_day": 0.25,
    "failover_s": 10,
}
TINY = {"messages": 2_000, "versions": 10, "rate": 20, "seconds": 5, "threads": 4, "idle_seconds": 3,
        "failover_batch": 20, "drain": 120}
#: How often a consumer process publishes its count to this one.
PUBLISH_S = 0.02
#: How long the instances of a run may take to be ready (import, configure) before it gives up.
START_TIMEOUT_S = 120


# -------------------------------------------------------------------------------------------------
# A consumer instance, in a process of its own


def instance(root: str, storage: dict, group: str, settings: dict, counter, shares_held, holding, by_share, seen,
             ready, go, stop, cpu, read, record_path: Optional[str]) -> None:
    """One ``TopicConsumer`` of ``group`` on :data:`TOPIC`, what its listener is handed counted into ``counter`` (and
    per share into ``by_share``, and marking each queue offset below ``len(seen)`` in ``seen``, shared by the instances, so
    that a message handled twice counts once); ``shares_held`` says how many of the topic's shares it holds and
    ``holding`` which (1 at each share's index), ``read`` the bytes and rows of the topic's files it has read. Ready
    once configured, consuming from ``go`` until ``stop``; with ``record_path``, writes each handled transaction
    id and when."""
    from coordinator import CoordinatorConfig, ConsumeResult, MessageListener, TopicConsumer
    from coordinator.consumer.group import share_of

    if os.environ.get("TXCOORD_BENCH_LOG"):  # the consumer's own log on stderr, for a run being diagnosed
        logging.basicConfig(level=os.environ["TXCOORD_BENCH_LOG"].upper(),
                            format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s")
    config = CoordinatorConfig(lakehouse=root, storage=storage, **settings)
    handled = [0]
    per_share = [0] * len(by_share)
    records = [] if record_path else None
    # What the listener was handed, counted by this process's main thread: a lock in the listener, taken by
    # its 8 threads for each message, halved what one process handled, which measured the count, not the
    # consumer (docs/performance-log.md#what-changed-each-for-a-measured-reason).
    arrivals: collections.deque = collections.deque()
    share_of_keys: dict = {}

    class Counting(MessageListener):
        def consume(self, message):
            arrivals.append((message.queue_offset, message.keys, message.msg_id, message.transaction_id, time.time()))
            return ConsumeResult.SUCCESS

    def publish() -> None:
        while arrivals:
            offset, keys, msg_id, transaction_id, at = arrivals.popleft()
            share = share_of_keys.get(keys) if keys else None
            if share is None:
                share = share_of(keys, msg_id, len(per_share))
                if keys:
                    share_of_keys[keys] = share
            per_share[share] += 1
            handled[0] += 1
            if offset < len(seen):
                seen[offset] = 1
            if records is not None:
                records.append((transaction_id, at))
        counter.value = handled[0]
        by_share[:] = per_share
        cpu.value = time.process_time() - cpu_at_go

    listener = Counting()
    consumer = TopicConsumer(group, [TOPIC], listener, config)
    ready.value = 1
    while not go.value:
        time.sleep(PUBLISH_S)
    cpu_at_go = time.process_time()  # its imports and set-up are not the consuming's
    consumer.start()
    while not stop.value:
        time.sleep(PUBLISH_S)
        publish()
        held = {number for source, number in consumer.shares if source == TOPIC}
        holding[:] = [1 if number in held else 0 for number in range(len(holding))]
        shares_held.value = len(held)
        read[:] = consumer.read_totals().get(TOPIC, (0, 0))
    consumer.close()
    publish()
    if record_path:
        Path(record_path).write_text(json.dumps(records))


class Instances:
    """``count`` consumer processes of ``group``, each through its own route to the storage (``storages``),
    started (imported, configured) on entering; :meth:`go` lets them consume."""

    def __init__(self, root: str, storages: list[dict], group: str, settings: Optional[dict] = None,
                 record_dir: Optional[str] = None, offsets: int = 0):
        context = multiprocessing.get_context("spawn")
        self.seen = context.RawArray("B", offsets)
        # Flags polled, not events: a process killed -9 inside an event's wait would leave its lock held.
        self.go_event, self.stop_event = context.RawValue("b", 0), context.RawValue("b", 0)
        self.counters = [context.Value("q", 0, lock=False) for _ in storages]
        self.held = [context.Value("i", 0, lock=False) for _ in storages]
        self.by_share = [context.Array("q", SHARES, lock=False) for _ in storages]
        self.holding = [context.Array("b", SHARES, lock=False) for _ in storages]
        self.ready = [context.RawValue("b", 0) for _ in storages]
        self.cpu = [context.RawValue("d", 0.0) for _ in storages]
        #: Each instance's bytes and rows read of the topic's data files, as it last published them.
        self.read = [context.RawArray("q", 2) for _ in storages]
        self.records = [None if record_dir is None else os.path.join(record_dir, f"handled-{n}.json")
                        for n in range(len(storages))]
        self.processes = [context.Process(target=instance, daemon=True, args=(
            root, storage, group, settings or {}, self.counters[n], self.held[n], self.holding[n], self.by_share[n], self.seen, self.ready[n],
            self.go_event, self.stop_event, self.cpu[n], self.read[n], self.records[n]))
            for n, storage in enumerate(storages)]

    def __enter__(self) -> "Instances":
        for process in self.processes:
            process.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        for ready, process in zip(self.ready, self.processes):
            while not ready.value:
                time.sleep(0.1)
                if not process.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"a consumer process did not start (exit code {process.exitcode})")
        return self

    def go(self) -> float:
        self.go_event.value = 1
        return time.monotonic()

    def handled(self) -> int:
        return sum(counter.value for counter in self.counters)

    def distinct(self) -> int:
        """How many of the first ``offsets`` queue offsets have been handled, once or more."""
        return len(self.seen) - bytes(self.seen).count(0)

    def wait_distinct(self, timeout_s: float) -> Optional[float]:
        """When (``time.monotonic()``) every one of the ``offsets`` had been handled; ``None`` on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.handled() >= len(self.seen) and self.distinct() == len(self.seen):
                return time.monotonic()
            if not any(process.is_alive() for process in self.processes):
                break
            time.sleep(PUBLISH_S / 2)
        return None

    def wait_handled(self, count: int, timeout_s: float) -> Optional[float]:
        """When (``time.monotonic()``) the instances had handled ``count`` messages in all; ``None`` on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.handled() >= count:
                return time.monotonic()
            if not any(process.is_alive() for process in self.processes):
                break
            time.sleep(PUBLISH_S / 2)
        return None

    def wait_holding(self, shares: list[int], timeout_s: float) -> None:
        """Until instance n holds ``shares[n]`` of the topic's shares, each."""
        deadline = time.monotonic() + timeout_s
        while [held.value for held in self.held] != shares:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the consumers hold {[held.value for held in self.held]} shares, not {shares}")
            time.sleep(0.05)

    def wait_settled(self, timeout_s: float) -> Optional[tuple[float, int]]:
        """When (``time.monotonic()``) every instance held a share or more and all of them together every share,
        and how many messages had been handled by then; ``None`` on timeout or once every instance is gone."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(process.is_alive() for process in self.processes):
            held = [h.value for h in self.held]
            if all(held) and sum(held) == SHARES:
                return time.monotonic(), self.handled()
            time.sleep(PUBLISH_S / 2)
        return None

    def cpu_seconds(self) -> list[float]:
        """Each instance's CPU time since ``go`` (user and system, all its threads) when it last published its count."""
        return [round(cpu.value, 2) for cpu in self.cpu]

    def kill(self, n: int) -> None:
        self.processes[n].kill()
        self.processes[n].join()

    def handled_records(self) -> list[tuple[str, float]]:
        found = []
        for path in self.records:
            if path and os.path.exists(path):
                found += json.loads(Path(path).read_text())
        return found

    def __exit__(self, *exc_info) -> None:
        self.stop_event.value = 1
        self.go_event.value = 1
        for process in self.processes:
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join()


# -------------------------------------------------------------------------------------------------
# Where the lakehouse lives


class Storage:
    """A fresh lakehouse per phase on a local disk, or on the S3 server behind a proxy per party."""

    PARTIES = ("consumer", "consumer-2", "checker", "producer")

    def __init__(self, latency_ms: float):
        self._stack = contextlib.ExitStack()
        self.workdir = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-consume-"))
        self.store: Optional[support.LatencyStore] = None
        if latency_ms:
            self.store = self._stack.enter_context(support.LatencyStore(latency_ms, self.workdir, self.PARTIES))

    def lakehouse(self):
        """A fresh, initialised lakehouse, reached straight."""
        from coordinator.lakehouse import Lakehouse, init_lakehouse

        if self.store is not None:
            return self.store.new_lakehouse()
        lakehouse = Lakehouse(tempfile.mkdtemp(dir=self.workdir))
        init_lakehouse(lakehouse)
        return lakehouse

    def route(self, lakehouse, party: str) -> dict:
        """How ``party`` reaches ``lakehouse``: through its proxy, or as it is."""
        return lakehouse.storage if self.store is None else self.store.storage(party)

    def close(self) -> None:
        self._stack.close()


def grant(lakehouse, group: str) -> None:
    from coordinator.config import CoordinatorConfig

    support_consumers().grant(CoordinatorConfig(lakehouse=lakehouse.root, storage=lakehouse.storage), group, [TOPIC],
                              SHARES)


def support_consumers():
    from support import consumers

    return consumers


def feed(lakehouse, messages: int, versions: int) -> float:
    """Write :data:`TOPIC` with ``messages`` messages over ``versions`` versions, as the checker does; seconds taken."""
    from coordinator.config import CoordinatorConfig

    started = time.monotonic()
    writer = support_consumers().TopicFeed(CoordinatorConfig(lakehouse=lakehouse.root, storage=lakehouse.storage))
    keys = random.Random(54)
    per_version, extra = divmod(messages, versions)
    try:
        for version in range(versions):
            count = per_version + (1 if version < extra else 0)
            writer.deliver(TOPIC, [(f"k{keys.randrange(KEYS)}", BODY) for _ in range(count)])
    finally:
        writer.close()
    return time.monotonic() - started


# -------------------------------------------------------------------------------------------------
# The phases


def throughput(storage: Storage, args: argparse.Namespace) -> dict:
    lakehouse = storage.lakehouse()
    print(f"throughput: writing {args.messages:,} messages in {args.versions} versions...", flush=True)
    written_s = feed(lakehouse, args.messages, args.versions)
    print(f"  written in {written_s:.1f} s", flush=True)
    runs = {}
    for processes in (1, 2):
        group = f"bench-throughput-{processes}"
        grant(lakehouse, group)
        routes = [storage.route(lakehouse, party) for party in ("consumer", "consumer-2")[:processes]]
        with Instances(lakehouse.root, routes, group, offsets=args.messages) as instances:
            started = instances.go()
            settled = instances.wait_settled(args.drain)
            done = instances.wait_distinct(args.drain + args.messages / 1000)
            handled, distinct, cpu = instances.handled(), instances.distinct(), instances.cpu_seconds()
        runs[processes] = _throughput_run(processes, args.messages, started, settled, done, handled, distinct, cpu)
        runs[processes]["by_process"] = [c.value for c in instances.counters]
        run = runs[processes]
        print(f"  {processes} process(es): {distinct:,} handled ({handled - distinct} twice) in "
              f"{'(timed out)' if done is None else str(run['seconds']) + ' s'}: {run['messages_per_s']} messages/s; "
              f"settled after {run['settled_after_s']} s, {run['settled_messages_per_s']} messages/s from then; "
              f"{run['cores_used']} cores used", flush=True)
    return {"messages": args.messages, "versions": args.versions, "feed_seconds": round(written_s, 1),
            "one_process": runs[1], "two_processes": runs[2],
            "two_processes_speedup": _ratio(runs[2]["messages_per_s"], runs[1]["messages_per_s"]),
            "two_processes_settled_speedup": _ratio(runs[2]["settled_messages_per_s"],
                                                    runs[1]["settled_messages_per_s"])}


def _throughput_run(processes: int, messages: int, started: float, settled: Optional[tuple[float, int]],
                    done: Optional[float], handled: int, distinct: int, cpu: list[float]) -> dict:
    """One run's figures: the whole (from ``go`` to the last message, the group's start included) and the part
    after the group settled (every share held: the rate its instances keep once started), and the cores its
    processes used over the whole run (their CPU seconds over its seconds)."""
    seconds = None if done is None else round(done - started, 2)
    from_settled = None if done is None or settled is None or settled[0] >= done else done - settled[0]
    return {"processes": processes, "handled": handled, "distinct": distinct, "handled_twice": handled - distinct,
            "seconds": seconds,
            "messages_per_s": None if seconds is None else round(messages / seconds),
            "settled_after_s": None if settled is None else round(settled[0] - started, 2),
            "settled_messages_per_s": None if from_settled is None else round((messages - settled[1]) / from_settled),
            "cpu_seconds": cpu, "cores_used": None if not seconds else round(sum(cpu) / seconds, 2)}


def _ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return None if not numerator or not denominator else round(numerator / denominator, 2)


def commit_to_handled(storage: Storage, args: argparse.Namespace) -> dict:
    from coordinator import CoordinatorConfig, TransactionProducer

    object_store = storage.lakehouse() if storage.store is not None else None
    directory, checker = support.checker_on_fresh_lakehouse(
        None, "consume", args.trigger_ms, object_store,
        checker_storage=None if storage.store is None else storage.store.storage("checker"))
    lakehouse = checker.lakehouse
    group = "bench-latency"
    grant(lakehouse, group)
    records = tempfile.mkdtemp(dir=storage.workdir)
    try:
        print(f"commit→handled: starting the checker (trigger {args.trigger_ms} ms)...", flush=True)
        checker_start_s = checker.wait_ready(args.startup_timeout)
        with Instances(lakehouse.root, [storage.route(lakehouse, "consumer")], group, record_dir=records) as instances:
            instances.go()
            instances.wait_holding([SHARES], args.startup_timeout)  # its start is not what is measured
            config = CoordinatorConfig(lakehouse=lakehouse.root, storage=storage.route(lakehouse, "producer"))
            print(f"  checker ready after {checker_start_s} s; offering {args.rate:g} txn/s for {args.seconds:g} s",
                  flush=True)
            with TransactionProducer("bench-consume", support.Commits(), config) as producer:
                sender = support.SteadySender(producer, TOPIC, args.rate, args.seconds, args.threads)
                send_seconds = sender.run()
            sent = {tid: returned for tid, returned, _ in sender.sent}
            done = instances.wait_handled(len(sent), args.drain)
        handled = {}
        for tid, at in instances.handled_records():
            handled.setdefault(tid, at)
        visible = support.deliveries(lakehouse, TOPIC)
    finally:
        exit_code = checker.stop()
        shutil.rmtree(directory, ignore_errors=True)
    both = [tid for tid in sent if tid in handled and tid in visible]
    to_visible = [visible[tid].timestamp_s - sent[tid] for tid in both]
    to_handled = [handled[tid] - sent[tid] for tid in both]

    def ms(values: list[float], q: float) -> Optional[float]:
        value = harness.percentile(values, q)
        return None if value is None else round(value * 1000, 1)

    figures = {"rate": args.rate, "seconds": args.seconds, "achieved_txn_per_s": round(len(sent) / send_seconds, 1),
               "sent": len(sent), "visible": sum(1 for tid in sent if tid in visible),
               "handled": sum(1 for tid in sent if tid in handled), "all_handled": done is not None,
               "checker_start_s": checker_start_s, "checker_exit_code": exit_code, "trigger_ms": args.trigger_ms,
               "commit_to_visible_p50_ms": ms(to_visible, 0.5), "commit_to_visible_p99_ms": ms(to_visible, 0.99),
               "commit_to_handled_p50_ms": ms(to_handled, 0.5), "commit_to_handled_p99_ms": ms(to_handled, 0.99),
               "visible_to_handled_p50_ms": ms([h - v for h, v in zip(to_handled, to_visible)], 0.5),
               "visible_to_handled_p99_ms": ms([h - v for h, v in zip(to_handled, to_visible)], 0.99)}
    # The consumer's own part: from the topic version's commit file written (its mtime) to the listener's call;
    # commitInfo's timestamp is taken before the checker writes the file. A local disk only: on object storage
    # Last-Modified is in whole seconds.
    written = [handled[tid] - visible[tid].log_mtime for tid in both] if storage.store is None else []
    figures |= {"written_to_handled_p50_ms": ms(written, 0.5), "written_to_handled_p99_ms": ms(written, 0.99)}
    for q in ("p50", "p99"):
        handled_ms, visible_ms = figures[f"commit_to_handled_{q}_ms"], figures[f"commit_to_visible_{q}_ms"]
        figures[f"handled_over_visible_{q}_ms"] = (None if handled_ms is None or visible_ms is None
                                                   else round(handled_ms - visible_ms, 1))
    print(f"  sent {len(sent)} ({figures['achieved_txn_per_s']} txn/s), handled {figures['handled']}: commit→visible "
          f"p50 {figures['commit_to_visible_p50_ms']} ms p99 {figures['commit_to_visible_p99_ms']} ms; commit→handled "
          f"p50 {figures['commit_to_handled_p50_ms']} ms p99 {figures['commit_to_handled_p99_ms']} ms", flush=True)
    return figures


def idle(storage: Storage, args: argparse.Namespace) -> dict:
    lakehouse = storage.lakehouse()
    feed(lakehouse, 10, 1)  # a topic that exists, its one version handled before counting
    group = "bench-idle"
    grant(lakehouse, group)
    print(f"idle: one consumer with nothing to handle, its requests counted for {args.idle_seconds:g} s...", flush=True)
    with Instances(lakehouse.root, [storage.route(lakehouse, "consumer")], group) as instances:
        instances.go()
        instances.wait_handled(10, 60)
        time.sleep(args.idle_settle_seconds)  # its first rounds (claims, first saves) done
        before, started = storage.store.counts("consumer"), time.monotonic()
        time.sleep(args.idle_seconds)
        spent = storage.store.requests_since("consumer", before)
        seconds = time.monotonic() - started
    figures = support.idle_cost_per_day(spent, seconds)
    print(f"  {figures['requests_per_s']} requests/s ({ {k: v for k, v in spent.items() if v} }), "
          f"${figures['usd_per_day']} a day", flush=True)
    return figures


def failover(storage: Storage, args: argparse.Namespace) -> dict:
    lakehouse = storage.lakehouse()
    feed(lakehouse, args.failover_batch, 1)
    group = "bench-failover"
    grant(lakehouse, group)
    writer = support_consumers().TopicFeed(__import__("coordinator").CoordinatorConfig(
        lakehouse=lakehouse.root, storage=lakehouse.storage))
    keys = random.Random(7)
    stop = threading.Event()

    def produce() -> None:
        while not stop.wait(args.failover_interval_ms / 1000):
            writer.deliver(TOPIC, [(f"k{keys.randrange(KEYS)}", BODY) for _ in range(args.failover_batch)])

    feeder = threading.Thread(target=produce, name="failover-feed", daemon=True)
    routes = [storage.route(lakehouse, party) for party in ("consumer", "consumer-2")]
    print("failover: two instances consuming a growing topic; one killed -9...", flush=True)
    with Instances(lakehouse.root, routes, group) as instances:
        instances.go()
        feeder.start()
        try:
            instances.wait_settled(120)
            time.sleep(args.failover_settle_seconds)
            held_before = [h.value for h in instances.held]
            victim_shares = [n for n in range(SHARES) if instances.holding[0][n]]
            survivor_counts = list(instances.by_share[1])
            instances.kill(0)
            killed = time.monotonic()
            holds_all = handling_all = None
            deadline = killed + args.drain
            while time.monotonic() < deadline and handling_all is None:
                now = time.monotonic()
                if holds_all is None and instances.held[1].value == SHARES:
                    holds_all = now
                counts = instances.by_share[1]
                if all(counts[n] > survivor_counts[n] for n in victim_shares):
                    handling_all = now
                time.sleep(0.02)
        finally:
            stop.set()
            feeder.join()
            writer.close()
    figures = {"shares": SHARES, "held_before_kill": held_before, "victim_shares": len(victim_shares),
               "holds_all_after_s": None if holds_all is None else round(holds_all - killed, 2),
               "handling_all_after_s": None if handling_all is None else round(handling_all - killed, 2),
               "failover_s": None if holds_all is None or handling_all is None
               else round(max(holds_all, handling_all) - killed, 2)}
    print(f"  the survivor held every share after {figures['holds_all_after_s']} s and handled a message in each of "
          f"the {len(victim_shares)} the dead one held after {figures['handling_all_after_s']} s", flush=True)
    return figures


# -------------------------------------------------------------------------------------------------
# Against the targets


def verdicts(report: dict, latency_ms: float) -> list[dict]:
    """Each figure the run measured beside its target: ``met`` true, false, or ``None`` when not measured."""
    at = 1 if latency_ms else 0
    rows = []

    def row(name: str, value, target, at_most: bool, unit: str) -> None:
        met = None if value is None else (value <= target if at_most else value >= target)
        rows.append({"figure": name, "value": value, "target": f"{'≤' if at_most else '≥'} {target:g}{unit}",
                     "met": met})

    if "throughput" in report:
        t = report["throughput"]
        row("one process, messages/s", t["one_process"]["messages_per_s"], TARGETS["messages_per_s"][at], False, "")
        row("two processes / one", t["two_processes_speedup"], TARGETS["two_processes_speedup"], False, "×")
    if "latency" in report:
        t = report["latency"]
        row("commit→handled p50 − commit→visible p50, ms", t["handled_over_visible_p50_ms"],
            TARGETS["handled_over_visible_p50_ms"][at], True, " ms")
        row("commit→handled p99 − commit→visible p99, ms", t["handled_over_visible_p99_ms"],
            TARGETS["handled_over_visible_p99_ms"][at], True, " ms")
    if "idle" in report:
        t = report["idle"]
        row("idle consumer, requests/s", t["requests_per_s"], TARGETS["idle_requests_per_s"], True, "")
        row("idle consumer, $ a day", t["usd_per_day"], TARGETS["idle_usd_per_day"], True, "")
    if "failover" in report:
        row("failover after kill -9, s", report["failover"]["failover_s"], TARGETS["failover_s"], True, " s")
    return rows


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages in the throughput topic")
    parser.add_argument("--versions", type=int, default=300, help="versions the throughput topic is written in")
    parser.add_argument("--rate", type=float, default=500, help="commit→handled: transactions offered a second")
    parser.add_argument("--seconds", type=float, default=60, help="commit→handled: sending time")
    parser.add_argument("--threads", type=int, default=64, help="commit→handled: the producer's sender threads")
    parser.add_argument("--trigger-ms", type=int, default=__import__("coordinator").CoordinatorConfig().trigger_interval_ms,
                        help="the checker's trigger_interval_ms (default: the product's)")
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for the checker's first batch")
    parser.add_argument("--idle-seconds", type=float, default=60, help="idle: how long the requests are counted")
    parser.add_argument("--idle-settle-seconds", type=float, default=5,
                        help="idle: how long the consumer runs before counting starts")
    parser.add_argument("--failover-batch", type=int, default=100, help="failover: messages in each version appended")
    parser.add_argument("--failover-interval-ms", type=int, default=200, help="failover: how often a version is appended")
    parser.add_argument("--failover-settle-seconds", type=float, default=5,
                        help="failover: how long both instances consume before one is killed")
    parser.add_argument("--drain", type=float, default=120, help="seconds to wait for the last messages to be handled")
    parser.add_argument("--only", nargs="+", choices=PHASES, default=None, help="only these phases (default: all; "
                        "idle only with --storage-latency-ms)")
    parser.add_argument("--storage-latency-ms", type=float, default=0, help=support.LATENCY_HELP)
    parser.add_argument("--results", default=None, help="default: bench/results/consume.json (consume-s3-<N>ms.json)")
    args = harness.parse_args(parser, argv, "consume", TINY)
    args.results = args.results or str(harness.RESULTS / (
        f"consume-s3-{args.storage_latency_ms:g}ms.json" if args.storage_latency_ms else "consume.json"))
    phases = [phase for phase in (args.only or PHASES) if phase != "idle" or args.storage_latency_ms]
    report = harness.start_report("consume", vars(args))
    storage = Storage(args.storage_latency_ms)
    report["storage"] = ("local disk" if storage.store is None else storage.store.settings())
    try:
        for phase in phases:
            report[phase] = {"throughput": throughput, "latency": commit_to_handled, "idle": idle,
                             "failover": failover}[phase](storage, args)
    finally:
        storage.close()
    report["verdicts"] = verdicts(report, args.storage_latency_ms)
    where = "local disk" if not args.storage_latency_ms else f"S3 server at {args.storage_latency_ms:g} ms a request"
    print(f"\nconsumer, {where}:")
    harness.print_verdicts(report["verdicts"])
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
