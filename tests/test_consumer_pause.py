"""A consumer instance paused (SIGSTOP: a GC pause, a frozen VM, a throttled pod) for 2x and 5x its group's liveness
window while keys flow, then resumed: the other instance takes its shares meanwhile, and the paused one, back,
starts no call in them. Per key, no two calls run at once, but a call already running when the pause began; and
each message is first handled after the one before it of its key. Real processes, real time: what is asserted
holds whatever the machine's load does to the timing (a slow renewal only keeps an instance fenced longer)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import defaultdict

from coordinator import CoordinatorConfig
from coordinator.consumer.instances import LIVE_FOR_HEARTBEATS
from coordinator.lakehouse import Lakehouse
from support.consumers import TopicFeed, grant
from support.processes import Job, child_environment
from support.waiting import wait_until

HEARTBEAT_MS = 500
WINDOW_S = LIVE_FOR_HEARTBEATS * HEARTBEAT_MS / 1000
KEYS = 20


class Flow:
    """Messages of KEYS keys, ten every 0.1 s, each body ``<key>:<n>`` (n counting up per key), until stopped."""

    def __init__(self, settings):
        self.feed, self.sent = TopicFeed(settings), defaultdict(int)
        self.stopped, self.thread = threading.Event(), threading.Thread(target=self._run, daemon=True)

    def _run(self):
        turn = 0
        while not self.stopped.wait(0.1):
            batch = []
            for key in (f"k{(turn * 10 + n) % KEYS}" for n in range(10)):
                batch.append((key, f"{key}:{self.sent[key]}".encode()))
                self.sent[key] += 1
            self.feed.deliver("ORDERS", batch)
            turn += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()
        self.feed.close()


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal, as /proc says."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def taken_over(calls, paused_pid: int, at: float) -> bool:
    """Whether another instance has handled, since ``at``, a key the paused one handled in the second before."""
    keys_before = {key for pid, key, _, start, *_ in calls if pid == paused_pid and at - 1 < start < at}
    return any(pid != paused_pid and key in keys_before and start > at for pid, key, _, start, *_ in calls)


def read_calls(path):
    calls = []
    for line in path.read_text().splitlines():
        pid, key, body, start, end, checked = line.split()
        calls.append((int(pid), key, int(body.split(":")[1]), float(start), float(end), float(checked)))
    return calls


def test_a_paused_instance_starts_no_call_in_the_shares_it_lost_and_keys_stay_in_order(tmp_path):
    settings = CoordinatorConfig(lakehouse=str(tmp_path / "lakehouse"))
    grant(settings, "credits", ["ORDERS"], shares=8)
    calls_path = tmp_path / "calls.txt"
    calls_path.touch()
    argv = [sys.executable, "-m", "support.calls_worker", "--lakehouse", settings.lakehouse, "--calls",
            str(calls_path), "--heartbeat-ms", str(HEARTBEAT_MS), "--call-ms", "20"]
    workers = [Job(argv, tmp_path / f"worker-{n}.log", env=child_environment(os.environ)).start() for n in range(2)]
    pauses = []  # (pid, paused at, resumed at), wall clock
    try:
        with Flow(settings) as flow:
            wait_until(lambda: len({int(line.split()[0]) for line in calls_path.read_text().splitlines()}) == 2, 60,
                       "both instances handling messages")
            paused = workers[0]
            for times_window in (2, 5):
                os.kill(paused.pid, signal.SIGSTOP)
                # When the pause began: once the process is seen stopped, every call it started is under way.
                wait_until(lambda: stopped(paused.pid), 10, "the process stopped", poll_s=0.001)
                at = time.time()
                # The pause is the event under test: real time passes while the process is stopped, at least
                # times_window liveness windows and until the other instance handles a key the paused one had.
                threading.Event().wait(times_window * WINDOW_S)
                wait_until(lambda: taken_over(read_calls(calls_path), paused.pid, at), 60, "the keys taken over")
                os.kill(paused.pid, signal.SIGCONT)
                pauses.append((paused.pid, at, time.time()))
                threading.Event().wait(3 * WINDOW_S)  # keys flow to both instances again
        sent = dict(flow.sent)
        wait_until(lambda: {(key, n) for _, key, n, *_ in read_calls(calls_path)}
                   >= {(key, n) for key, count in sent.items() for n in range(count)}, 120, "every message handled")
    finally:
        for worker in workers:
            if worker.exit_code() is None:
                os.kill(worker.pid, signal.SIGCONT)
                worker.stop()
    calls = read_calls(calls_path)
    by_key = defaultdict(list)
    for call in calls:
        by_key[call[1]].append(call)

    def running_at_a_pause(call):
        # Under way: its instance had let it start (checked its fence) before the pause began, and it ended after.
        pid, _, _, _, end, checked = call
        return any(pid == paused_pid and checked < at < end for paused_pid, at, _ in pauses)

    overlaps, order_breaks = [], []
    for key, key_calls in by_key.items():
        key_calls.sort(key=lambda call: call[3])
        for earlier, later in zip(key_calls, key_calls[1:]):
            if later[3] < earlier[4] and earlier[0] != later[0] and not running_at_a_pause(earlier):
                overlaps.append((earlier, later))
        first = {}
        for call in key_calls:
            first.setdefault(call[2], call)
        for n in range(1, len(first)):
            if first[n][3] < first[n - 1][4] and not running_at_a_pause(first[n - 1]):
                order_breaks.append((first[n - 1], first[n]))
    assert not overlaps, f"{len(overlaps)} calls of one key at once, e.g. {overlaps[:3]}"
    assert not order_breaks, f"{len(order_breaks)} messages first handled before the one before them, {order_breaks[:3]}"
    assert all(sorted(first) == list(range(sent[key])) for key, first in
               ((key, {call[2] for call in key_calls}) for key, key_calls in by_key.items()))
    handled_twice = len(calls) - sum(sent.values())
    # Delivered again: at most what an instance handled and had not saved when its shares moved (a commit
    # interval's worth, 5 s at the flow's 100 a second, at each of the two pauses and the two moves back).
    assert handled_twice <= 4 * 500, handled_twice
    records = [key for key in Lakehouse.of(settings).files.list("consumers/credits/_instances") if key.endswith(".json")]
    assert records == []  # both withdrew on SIGTERM
