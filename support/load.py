"""Offered load: sends on a fixed schedule from many threads, a producer at a steady rate, and processes that
start sending together, each a producer of its own with its share of a steady rate."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from typing import Callable, Optional, Sequence

from support.records import BODY

__all__ = ["PROCESS_START_TIMEOUT_S", "SteadySender", "SteadyShares", "StartedTogether", "send_on_schedule",
           "steady_share"]

#: How long the processes of a run wait for each other to be ready to send, by default.
PROCESS_START_TIMEOUT_S = 120


def send_on_schedule(send_one: Callable[[int], None], total: int, rate: float, threads: int,
                     deadline_s: Optional[float] = None, halt: Optional[threading.Event] = None) -> float:
    """Call ``send_one(k)`` for k in ``range(total)`` from ``threads`` threads, k at ``t0 + k / rate``
    (at once when ``rate`` is 0); return the seconds it took.

    The schedule is fixed in advance: a thread that falls behind sends at once, so a slow
    producer shows as a lower achieved rate, not a lower offered one. With ``deadline_s``, no send
    starts ``deadline_s`` or more after t0, so a run that falls behind still lasts its stated time;
    the sends in flight then finish, and the caller counts those never started. Once ``halt`` is set,
    no send starts either (the run ends early).

    Example::

        seconds = send_on_schedule(lambda k: producer.send_message_in_transaction(msg), 1000, rate=100, threads=8)
    """
    taken, lock = iter(range(total)), threading.Lock()
    halt = halt or threading.Event()
    t0 = time.monotonic()
    stop_at = None if deadline_s is None else t0 + deadline_s

    def worker() -> None:
        while not halt.is_set():
            with lock:
                k = next(taken, None)
            if k is None:
                return
            now = time.monotonic()
            due = t0 + k / rate if rate > 0 else now
            if stop_at is not None and max(now, due) >= stop_at:
                return
            if due > now and halt.wait(due - now):
                return
            send_one(k)

    workers = [threading.Thread(target=worker, name=f"sender-{i}") for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return time.monotonic() - t0


class SteadySender:
    """Offers ``rate`` transactions per second to ``topic`` for ``seconds`` from ``threads`` threads of
    one producer (:func:`send_on_schedule`, with ``seconds`` as its deadline). Each send's return time
    (``time.time()``) and transaction id are kept in ``sent``, or, with ``on_sent``, handed to it
    instead (a long run need not hold them all: ``on_sent(transaction_id, returned_at, send_seconds)``,
    called from the sending threads); ``sent_count`` counts them either way, and ``unsent`` counts the
    scheduled sends a producer that fell behind (or :meth:`halt` stopped) never started.
    """

    def __init__(self, producer, topic: str, rate: float, seconds: float, threads: int,
                 on_sent: Optional[Callable[[str, float, float], None]] = None):
        self.producer, self.topic, self.rate, self.seconds, self.threads = producer, topic, rate, seconds, threads
        self.sent: list[tuple[str, float, float]] = []  # (transaction id, returned at (epoch s), send seconds)
        self.on_sent = on_sent
        self.sent_count = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.total = int(rate * seconds)

    def _send_one(self, k: int) -> None:
        from coordinator import Message

        started = time.perf_counter()
        try:
            result = self.producer.send_message_in_transaction(Message(self.topic, BODY))
        except Exception:
            with self._lock:
                self.errors += 1
            return
        sent = (result.transaction_id, time.time(), time.perf_counter() - started)
        if self.on_sent is not None:
            self.on_sent(*sent)
        with self._lock:
            self.sent_count += 1
            if self.on_sent is None:
                self.sent.append(sent)

    @property
    def unsent(self) -> int:
        """Scheduled sends not started by the deadline (once :meth:`run` has returned)."""
        return self.total - self.sent_count - self.errors

    def run(self) -> float:
        """Send on schedule until the deadline; return the seconds it took (the sends in flight at
        the deadline finish first)."""
        return send_on_schedule(self._send_one, self.total, self.rate, self.threads, deadline_s=self.seconds,
                                halt=self._halt)

    def halt(self) -> None:
        """End the run early, from another thread: no send starts after this (those in flight finish)."""
        self._halt.set()

    def share(self, group: str, started_at: float, send_seconds: float) -> dict:
        """What it did, as :func:`steady_share` returns a process's share (for :class:`SteadyShares`): ``group``
        is its producer's, ``started_at`` (``time.time()``) when it started sending and ``send_seconds`` what
        :meth:`run` returned."""
        return {"group": group, "sent": self.sent, "total": self.total, "errors": self.errors, "unsent": self.unsent,
                "started_at": started_at, "send_seconds": send_seconds}


class StartedTogether:
    """``target(*call, ready)`` for each of ``calls``, each in a fresh Python interpreter (spawned: nothing of this
    process is inherited, as separate service instances share nothing), from ``with``. ``ready`` is a barrier every
    process shares with this one: each waits on it once it is ready to start (imports done, producer open), since
    on a loaded machine starting takes seconds and a process still starting would shorten, or miss, the window the
    others share. :meth:`wait_started` waits on it here; :meth:`results` are ``target``'s return values, in the
    order of ``calls``. A process that fails before the barrier leaves the others waiting ``start_timeout_s``.

    Example::

        with harness.StartedTogether(send_for, [(root, 8), (root, 8)]) as processes:
            sending_from = processes.wait_started()   # time.monotonic() once every process was ready
            first, second = processes.results()
    """

    def __init__(self, target: Callable, calls: Sequence[tuple], start_timeout_s: float = PROCESS_START_TIMEOUT_S):
        self.target, self.calls, self.start_timeout_s = target, [tuple(call) for call in calls], start_timeout_s
        self.started_at: Optional[float] = None  # time.monotonic() when the barrier let them go
        self._stack = contextlib.ExitStack()
        self._ready = self._running = None

    def __enter__(self) -> "StartedTogether":
        spawn = multiprocessing.get_context("spawn")
        try:
            manager = self._stack.enter_context(spawn.Manager())
            pool = self._stack.enter_context(spawn.Pool(len(self.calls)))
            # A manager's barrier: a pool's task arguments are pickled, and a plain one cannot be.
            self._ready = manager.Barrier(len(self.calls) + 1, timeout=self.start_timeout_s)
            self._running = pool.starmap_async(self.target, [(*call, self._ready) for call in self.calls])
        except BaseException:
            self._stack.close()
            raise
        return self

    def wait_started(self) -> float:
        """Wait until every process is ready, which lets them start; the ``time.monotonic()`` of that moment. A
        process's own failure is raised rather than the broken barrier it leaves."""
        if self.started_at is None:
            try:
                self._ready.wait()
            except threading.BrokenBarrierError:
                # The others wait for a process that failed before the barrier until it breaks; its error says why.
                self._running.wait(self.start_timeout_s)
                if self._running.ready() and not self._running.successful():
                    self._running.get()
                raise
            self.started_at = time.monotonic()
        return self.started_at

    def results(self) -> list:
        """Every process's return value, once all have returned (after :meth:`wait_started`)."""
        self.wait_started()
        return self._running.get()

    def __exit__(self, *exc_info) -> None:
        self._stack.close()


def steady_share(root: str, storage: dict[str, str], group: str, topic: str, rate: float, seconds: float,
                 threads: int, ready) -> dict:
    """One process's share of a steady offered load, run by :class:`StartedTogether`: a producer of ``group`` on
    the lakehouse at ``root`` (reached with ``storage``), its local transactions committing, then, once every
    process is ready (``ready``), a :class:`SteadySender` of ``rate`` to ``topic`` for ``seconds`` from
    ``threads`` threads. Returns :meth:`SteadySender.share`: the ``group``, every send (its return time is a
    ``time.time()``, comparable across the machine's processes), the sends scheduled (``total``), failed
    (``errors``) and never started (``unsent``), when sending started (``started_at``, ``time.time()``) and its
    ``send_seconds``; :class:`SteadyShares` puts the processes' together."""
    from coordinator import CoordinatorConfig, TransactionProducer
    from support.listeners import Commits

    with TransactionProducer(group, Commits(), CoordinatorConfig(lakehouse=root, storage=storage)) as producer:
        sender = SteadySender(producer, topic, rate, seconds, threads)
        ready.wait()
        started_at = time.time()
        send_seconds = sender.run()
    return sender.share(group, started_at, send_seconds)


class SteadyShares:
    """The processes' :func:`steady_share` results together, as a :class:`SteadySender` holds one producer's:
    every send (``sent``), the sends scheduled (``total``), failed (``errors``) and never started (``unsent``);
    when the first process started sending (``started_at``, ``time.time()``), the ``seconds`` until the last one
    finished, and each process's counts (:meth:`by_process`).

    Example::

        shares = SteadyShares(processes.results())
        len(shares.sent) / shares.seconds   # the achieved rate of all of them
    """

    def __init__(self, shares: list[dict]):
        self.shares = shares
        self.sent: list[tuple[str, float, float]] = [send for share in shares for send in share["sent"]]
        self.total = sum(share["total"] for share in shares)
        self.errors = sum(share["errors"] for share in shares)
        self.unsent = sum(share["unsent"] for share in shares)
        self.started_at = min(share["started_at"] for share in shares)
        self.seconds = max(share["started_at"] + share["send_seconds"] for share in shares) - self.started_at

    def by_process(self, delivered: Optional[Callable[[str], bool]] = None) -> list[dict]:
        """Each process's group and counts, in the order of the processes; with ``delivered`` (whether a
        transaction id was delivered), how many of its sends were."""
        return [{"group": share["group"], "offered": share["total"], "sent": len(share["sent"]),
                 "send_errors": share["errors"], "unsent": share["unsent"],
                 **({} if delivered is None else
                    {"delivered": sum(1 for tid, _, _ in share["sent"] if delivered(tid))})}
                for share in self.shares]
