"""Offered load: sends on a fixed schedule from many threads, and a producer at a steady rate."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from tests.support.records import BODY

__all__ = ["SteadySender", "send_on_schedule"]


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
