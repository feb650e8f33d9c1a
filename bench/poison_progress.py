"""A share's progress record past a message that keeps failing (issue 59 point 2): its size after ``--messages``
messages are handled past one message whose retry is 10 minutes away, and what the next instance does with it.

One share (``--shares 1``), a topic of one poison message then ``--messages`` messages of other keys in
``--versions`` versions (written as the checker writes topics), one consumer instance in this process with a
listener that fails the poison message and counts the others. The record's size is read after the first version
is handled (the reference, in the same run) and after the last; then the instance is stopped as kill -9 leaves it
(nothing saved, nothing withdrawn), ``--after`` new messages are written, and a new instance of the group must
handle them all: its seconds to do so, and that the poison message is still waiting for its retry.
Target: ≤ 64 KiB after 1,000,000 messages, the new instance handling the new ones.

    python -m bench.poison_progress                              # 1,000,000 messages, local disk
    python -m bench.poison_progress --tiny                        # for bench/tests/test_bench.py

Prints the figures and writes ``bench/results/poison-progress.json`` (``--results`` to change).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from bench import harness

TARGET_BYTES = 64 * 1024


def run(args: argparse.Namespace) -> dict:
    from coordinator import ConsumeResult, CoordinatorConfig, MessageListener, TopicConsumer
    from coordinator.consumer.group import ConsumerGroup
    from coordinator.lakehouse import Lakehouse
    from support.consumers import TopicFeed, grant
    from support.waiting import wait_until

    report = harness.start_report("poison_progress", vars(args))
    with tempfile.TemporaryDirectory(prefix="poison-progress-") as root:
        config = CoordinatorConfig(lakehouse=str(Path(root) / "lakehouse"), consumer_retry_delays_ms=(600_000,),
                                   consumer_commit_interval_ms=1000)
        grant(config, "credits", ["ORDERS"], shares=1)
        feed = TopicFeed(config)
        poison = feed.deliver("ORDERS", [("stuck", b"poison")])[0]
        per_version = args.messages // args.versions

        class Counting(MessageListener):
            def __init__(self):
                self.handled, self.lock, self.poison_calls = 0, threading.Lock(), 0

            def consume(self, message):
                if message.msg_id == poison:
                    self.poison_calls += 1
                    return ConsumeResult.FAILURE
                with self.lock:
                    self.handled += 1
                return ConsumeResult.SUCCESS

        group = ConsumerGroup(Lakehouse.of(config), "credits")
        key = "consumers/credits/progress/ORDERS/0.json"

        def record_bytes(handled: int, listener: Counting, consumer) -> int:
            wait_until(lambda: listener.handled >= handled, 600, f"{handled} handled")
            consumer_saved = lambda: group.files.read(key) is not None and not any(  # noqa: E731
                share.dirty for share in list(consumer._shares.values()))
            wait_until(consumer_saved, 60, "its progress saved")
            return len(group.files.read(key).data)

        listener = Counting()
        written = 0
        feed.deliver("ORDERS", [(f"k{n % 997}", b"x") for n in range(per_version)])
        written += per_version
        consumer = TopicConsumer("credits", ["ORDERS"], listener, config).start()
        first_bytes = record_bytes(written, listener, consumer)
        started = time.monotonic()
        for version in range(1, args.versions):
            feed.deliver("ORDERS", [(f"k{n % 997}", b"x") for n in range(per_version)])
            written += per_version
        last_bytes = record_bytes(written, listener, consumer)
        handled_s = time.monotonic() - started
        consumer._halt()  # kill -9: nothing saved since, nothing withdrawn
        progress, _ = group.progress("ORDERS", 0)
        feed.deliver("ORDERS", [(f"n{n}", b"new") for n in range(args.after)])
        feed.close()
        again = Counting()
        restarted = time.monotonic()
        # The killed instance's record is live for two heartbeats more: the new instance takes the share then.
        with TopicConsumer("credits", ["ORDERS"], again, config):
            wait_until(lambda: again.handled >= args.after, 120, "the new messages, by the next instance")
            took_s = time.monotonic() - restarted
        report |= {
            "messages_handled_past": written,
            "record_bytes_after_first_version": first_bytes,
            "record_bytes_after_all": last_bytes,
            "ratio_to_first": round(last_bytes / first_bytes, 3),
            "unhandled_listed": sum(map(len, progress.unhandled.values())),
            "poison_attempts_saved": next(iter(progress.retrying.values()))["attempts"] if progress.retrying else 0,
            "handled_per_s": round((written - per_version) / handled_s),
            "next_instance_handled_new_s": round(took_s, 2),
            "met": last_bytes <= TARGET_BYTES and again.handled >= args.after,
        }
    print(f"progress record: {first_bytes} bytes after {per_version:,} handled past the poison message, "
          f"{last_bytes} bytes after {written:,} (x{report['ratio_to_first']}); target ≤ {TARGET_BYTES} bytes: "
          f"{'met' if report['met'] else 'MISSED'}; the next instance handled the {args.after} new messages in "
          f"{report['next_instance_handled_new_s']} s (the killed one's record going stale first)", flush=True)
    return harness.finish_report(report, Path(args.results or harness.RESULTS / "poison-progress.json"))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages handled past the poison one")
    parser.add_argument("--versions", type=int, default=300, help="versions they are written in")
    parser.add_argument("--after", type=int, default=200, help="messages written after the kill")
    parser.add_argument("--results", default=None, help="default: bench/results/poison-progress.json")
    args = harness.parse_args(parser, argv, "poison-progress", {"messages": 20_000, "versions": 10, "after": 20})
    run(args)


if __name__ == "__main__":
    main()
