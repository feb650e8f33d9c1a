"""A consumer process that records every listener call it makes: one line per call, ``pid key body start end
checked`` (wall-clock seconds; ``checked``: when the consumer last let the calling thread start a call, its fence
checked), appended to ``--calls`` once the call ends. What the pause tests read to tell whether two
instances ever ran the same key at once. Stops on SIGTERM (closing within ``--close-timeout`` seconds).

Example::

    python -m support.calls_worker --lakehouse L --calls calls.txt --heartbeat-ms 500
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lakehouse", required=True)
    parser.add_argument("--group", default="credits")
    parser.add_argument("--topic", default="ORDERS")
    parser.add_argument("--calls", required=True)
    parser.add_argument("--heartbeat-ms", type=int, default=500)
    parser.add_argument("--call-ms", type=float, default=5.0, help="how long each call takes")
    parser.add_argument("--commit-ms", type=int, default=5000, help="consumer_commit_interval_ms")
    parser.add_argument("--close-timeout", type=float, default=10.0)
    args = parser.parse_args()

    from coordinator import ConsumeResult, CoordinatorConfig, MessageListener, TopicConsumer

    calls = open(args.calls, "ab", buffering=0)
    pid = os.getpid()
    checked = threading.local()  # a call whose check came before a pause was under way when it began
    runnable = TopicConsumer._runnable

    def recording_check(consumer, run):
        checked.at = time.time()  # before the fence is read: a pause after this leaves the check to find it
        return runnable(consumer, run)

    TopicConsumer._runnable = recording_check

    class Recording(MessageListener):
        def consume(self, message):
            started = time.time()
            time.sleep(args.call_ms / 1000)  # the call's own work: long enough for two calls to be seen at once
            calls.write(f"{pid} {message.keys} {message.body.decode()} {started:.6f} {time.time():.6f} "
                        f"{checked.at:.6f}\n".encode())
            return ConsumeResult.SUCCESS

    config = CoordinatorConfig(lakehouse=args.lakehouse, consumer_heartbeat_ms=args.heartbeat_ms,
                               consumer_poll_interval_ms=20, consumer_commit_interval_ms=args.commit_ms,
                               consumer_threads=4)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = TopicConsumer(args.group, [args.topic], Recording(), config).start()
    # Woken twice a second: a SIGTERM right after a SIGCONT can reach a thread other than the main one, and a
    # wait with no timeout would not see the handler's set() until something else woke it.
    while not stop.wait(0.5):
        pass
    consumer.close(timeout=args.close_timeout)


if __name__ == "__main__":
    main()
