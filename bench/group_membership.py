"""What a consumer group's membership costs each instance as the group grows (issue 61 point 5), and how soon a
stopped instance's shares move: an idle group of ``--instances`` instances (64) on the S3 server at
``--storage-latency-ms`` (25) a request, beside a group of two measured in the same run (the reference: an
instance's cost must not grow with its group; one alone watches no other).

1. A topic of one version; group ``members`` granted two shares of it an instance (so each holds some). The group's instances run as ``TopicConsumer``s in ``--processes`` processes, all through one
   proxy that counts their requests; one more process runs a single instance, the one stopped in step 3.
2. Once every share is held, the group's requests are counted for ``--idle-seconds``: per instance, per second and
   per day at S3 Standard's prices. The same for a group of two (one process).
3. The lone instance is stopped (SIGSTOP: on another host, a killed instance looks the same, its record aging
   without its process seen gone), and the time from its last renewal until every share it held is held by another
   instance is measured. Target: within three heartbeats.

Targets (issue 61 point 5): ≤ 4 requests a second and ≤ $0.25 a day per instance of an idle group of 64 at 25 ms a
request; a stopped instance's shares held again within three heartbeats (9 s at the default 3 s heartbeat).

    python -m bench.group_membership                 # 64 instances, 25 ms a request
    python -m bench.group_membership --tiny          # the smallest run, for bench/tests/test_bench.py

Prints each figure against its target and writes ``bench/results/group-membership-s3-<N>ms.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench import harness

import support

TOPIC = "BENCH_MEMBERS"
GROUP = "members"
TARGETS = {"requests_per_s": 4.0, "usd_per_day": 0.25, "move_heartbeats": 3.0}
TINY = {"instances": 4, "processes": 1, "idle_seconds": 4.0, "settle_seconds": 2.0, "heartbeat_ms": 1000}
START_TIMEOUT_S = 180


def instances_process(root: str, storage: dict, settings: dict, count: int, holding, renewed, ready, stop) -> None:
    """``count`` instances of :data:`GROUP` in this process; ``holding[n]`` is set to 1 + the index of the instance
    holding topic share n here (0: none here), ``renewed`` to the lone instance's last renewal (epoch seconds)."""
    from coordinator import ConsumeResult, CoordinatorConfig, MessageListener, TopicConsumer

    class Nothing(MessageListener):
        def consume(self, message):
            return ConsumeResult.SUCCESS

    config = CoordinatorConfig(lakehouse=root, storage=storage, **settings)
    consumers = [TopicConsumer(GROUP, [TOPIC], Nothing(), config).start() for _ in range(count)]
    ready.value = 1
    while not stop.value:
        held = {}
        for index, consumer in enumerate(consumers):
            for source, number in consumer.shares:
                if source == TOPIC:
                    held[number] = index + 1
        holding[:] = [held.get(number, 0) for number in range(len(holding))]
        renewed.value = consumers[0]._membership.renewed_at
        time.sleep(0.05)
    for consumer in consumers:
        consumer.close()


class Group:
    """The group's processes (the last runs the lone instance), started on entering."""

    def __init__(self, root: str, storage: dict, settings: dict, per_process: list[int], shares: int):
        context = multiprocessing.get_context("spawn")
        self.holding = [context.RawArray("b", shares) for _ in per_process]
        self.renewed = [context.RawValue("d", 0.0) for _ in per_process]
        self.ready = [context.RawValue("b", 0) for _ in per_process]
        self.stop = context.RawValue("b", 0)
        self.processes = [context.Process(target=instances_process, daemon=True, args=(
            root, storage, settings, count, self.holding[n], self.renewed[n], self.ready[n], self.stop))
            for n, count in enumerate(per_process)]

    def __enter__(self) -> "Group":
        for process in self.processes:
            process.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(ready.value for ready in self.ready):
            if time.monotonic() > deadline or not all(process.is_alive() for process in self.processes):
                raise RuntimeError("the group's processes did not start")
            time.sleep(0.1)
        return self

    def held(self, processes: Optional[list[int]] = None) -> set[int]:
        """The topic's shares held by an instance of ``processes`` (default: all)."""
        return {number for n in (processes if processes is not None else range(len(self.processes)))
                for number, index in enumerate(self.holding[n]) if index}

    def wait_all_held(self, shares: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.held()) < shares:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(self.held())} of {shares} shares held after {timeout_s:g} s")
            time.sleep(0.1)

    def __exit__(self, *exc_info) -> None:
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGCONT)
        self.stop.value = 1
        for process in self.processes:
            process.join(120)
            if process.is_alive():
                process.kill()
                process.join()


def idle_cost(store, instances: int, seconds: float) -> dict:
    before, started = store.counts("consumer"), time.monotonic()
    time.sleep(seconds)
    spent = store.requests_since("consumer", before)
    figures = support.idle_cost_per_day({kind: count / instances for kind, count in spent.items()},
                                        time.monotonic() - started)
    figures["instances"] = instances
    return figures


def run_group(store, args, instances: int, processes: int, stop_one: bool) -> dict:
    lakehouse = store.new_lakehouse()
    from coordinator.config import CoordinatorConfig
    from support.consumers import TopicFeed, grant

    direct = CoordinatorConfig(lakehouse=lakehouse.root, storage=lakehouse.storage)
    feed = TopicFeed(direct)
    feed.deliver(TOPIC, [("k", b"x")])
    feed.close()
    shares = 2 * instances
    grant(direct, GROUP, [TOPIC], shares)
    settings = {"consumer_heartbeat_ms": args.heartbeat_ms}
    lone = 1 if stop_one else 0
    rest = instances - lone
    per_process = [rest // processes + (1 if n < rest % processes else 0) for n in range(processes)] if rest else []
    per_process = [count for count in per_process if count] + ([1] if lone else [])
    print(f"a group of {instances} in {len(per_process)} processes: starting...", flush=True)
    with Group(lakehouse.root, store.storage("consumer"), settings, per_process, shares) as group:
        group.wait_all_held(shares, START_TIMEOUT_S)
        time.sleep(args.settle_seconds)
        figures = idle_cost(store, instances, args.idle_seconds)
        print(f"  idle, per instance: {figures['requests_per_s']} requests/s, ${figures['usd_per_day']} a day "
              f"({ {k: v for k, v in figures['requests'].items() if v} })", flush=True)
        if stop_one:
            figures["stopped"] = stop_and_wait(group, shares, args)
    return figures


def stop_and_wait(group: Group, shares: int, args) -> dict:
    lone = len(group.processes) - 1
    lost = group.held([lone])
    os.kill(group.processes[lone].pid, signal.SIGSTOP)
    last_renewal = group.renewed[lone].value
    others = list(range(lone))
    deadline = time.monotonic() + 20 * args.heartbeat_ms / 1000
    while not lost <= group.held(others):
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    moved_s = time.time() - last_renewal if lost <= group.held(others) else None
    heartbeats = None if moved_s is None else round(moved_s / (args.heartbeat_ms / 1000), 2)
    print(f"  a stopped instance's {len(lost)} shares held by others {moved_s and round(moved_s, 2)} s after its "
          f"last renewal ({heartbeats} heartbeats)", flush=True)
    return {"shares": len(lost), "moved_after_last_renewal_s": moved_s and round(moved_s, 2),
            "moved_after_heartbeats": heartbeats}


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=64, help="the group's instances")
    parser.add_argument("--processes", type=int, default=4, help="processes they run in, besides the stopped one's")
    parser.add_argument("--heartbeat-ms", type=int, default=3000, help="consumer_heartbeat_ms (the product's default)")
    parser.add_argument("--idle-seconds", type=float, default=60, help="how long the requests are counted")
    parser.add_argument("--settle-seconds", type=float, default=10, help="how long the group runs before counting")
    parser.add_argument("--storage-latency-ms", type=float, default=25.0, help=support.LATENCY_HELP)
    parser.add_argument("--results", default=None)
    args = harness.parse_args(parser, argv, "group_membership", TINY)
    args.results = args.results or str(harness.RESULTS / f"group-membership-s3-{args.storage_latency_ms:g}ms.json")
    report = harness.start_report("group_membership", vars(args))
    with tempfile.TemporaryDirectory(prefix="bench-members-") as workdir, \
            support.LatencyStore(args.storage_latency_ms, workdir, ("consumer",)) as store:
        report["storage"] = store.settings()
        report["two"] = run_group(store, args, 2, 1, stop_one=False)
        report["group"] = run_group(store, args, args.instances, args.processes, stop_one=True)
    group, two = report["group"], report["two"]
    report["per_instance_over_two"] = {key: round(group[key] / two[key], 2) if two[key] else None
                                       for key in ("requests_per_s", "usd_per_day")}
    moved = group["stopped"]["moved_after_heartbeats"]
    report["verdicts"] = [
        {"figure": "requests/s per instance", "value": group["requests_per_s"], "target": TARGETS["requests_per_s"],
         "met": group["requests_per_s"] <= TARGETS["requests_per_s"]},
        {"figure": "$ a day per instance", "value": group["usd_per_day"], "target": TARGETS["usd_per_day"],
         "met": group["usd_per_day"] <= TARGETS["usd_per_day"]},
        {"figure": "shares moved, heartbeats after the last renewal", "value": moved,
         "target": TARGETS["move_heartbeats"], "met": None if moved is None else moved <= TARGETS["move_heartbeats"]},
    ]
    print(f"\nan idle group of {args.instances} / of two, per instance: requests/s "
          f"{report['per_instance_over_two']['requests_per_s']}×, $ a day {report['per_instance_over_two']['usd_per_day']}×")
    harness.print_verdicts(report["verdicts"])
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
