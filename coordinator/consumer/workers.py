"""The threads that run a consumer's listener calls, where a call that hangs costs its thread, never the pool.

Work is handed over a :class:`Run` at a time: messages of one key, called one after another in their order
(a keyless message is a run of its own), so a thread takes many messages per hand-off and per wake, not one.
A run stops at its first failed call (its key's later messages wait for the retry) and before any call once
``runnable(run)`` says no more may start (the share is given up, the consumer closes): what it did not call is
handed back, never started.

A call past its deadline is *abandoned*: its message counts as failed, a new thread takes the hung one's
place, and the hung one exits whenever its call returns, its answer ignored. A Python thread cannot be
stopped from outside: an abandoned thread is a daemon one, so it never keeps the process from exiting.

The threads share no lock per call: whether a call's answer counts or its call was abandoned is decided by
whichever of its thread and the abandoning loop first pops the call's one-item *ticket* (``list.pop`` is atomic).
A lock taken around each call made eight threads convoy on it (docs/performance-log.md#consumers).

Example::

    workers = Workers(4, call=lambda payload, item: handle(item), ok=lambda result, error: error is None,
                      done=print, clock=time.time)
    workers.submit(Run([1, 2, 3]))  # done(run) is called from the worker's thread once the run ends
    workers.close()                 # joins every thread but the abandoned ones
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["Run", "Workers"]


class Run:
    """Items to call one after another; ``outcomes`` holds ``(item, result, error)`` for each call that ended,
    in order, and ``current``/``started`` the call under way (``started`` by the workers' clock)."""

    __slots__ = ("items", "payload", "outcomes", "current", "started", "thread", "abandoned", "ticket")

    def __init__(self, items: list, payload: Any = None):
        self.items, self.payload = items, payload
        self.outcomes: list[tuple[Any, Any, Optional[BaseException]]] = []
        self.current: Any = None
        self.started: Optional[float] = None
        self.thread: Optional[threading.Thread] = None
        self.abandoned = False
        self.ticket: list = []  # the call under way's item until its thread or the abandoning loop pops it

    def unstarted(self) -> list:
        """The items no call was made for (the run stopped early), in order; the hung one of an abandoned run
        excluded."""
        called = len(self.outcomes) + (1 if self.abandoned else 0)
        return self.items[called:]


class Workers:
    """``size`` threads calling ``call(payload, item)`` for each item of each submitted :class:`Run`; ``done(run)``
    reports each run that ended (not an abandoned one). ``ok(result, error)`` says whether a call succeeded (a run stops
    at the first that did not); ``runnable(run)`` whether its next call may start."""

    def __init__(self, size: int, call: Callable[[Any, Any], Any], ok: Callable[[Any, Optional[BaseException]], bool],
                 done: Callable[["Run"], None], clock: Callable[[], float],
                 runnable: Callable[["Run"], bool] = lambda run: True, name: str = "consumer"):
        self._call, self._ok, self._done, self._clock, self._runnable = call, ok, done, clock, runnable
        self._name = name
        self._runs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._active: set[Run] = set()  # taken by a thread, not ended
        self._started = 0
        for _ in range(size):
            self._spawn()

    def submit(self, run: Run) -> None:
        """Run ``run`` on the next free thread.

        Example::

            workers.submit(Run([message_1, message_2], payload=share))
        """
        self._runs.put(run)

    @property
    def queued(self) -> int:
        """Runs submitted that no thread has taken yet (approximately, as threads take them)."""
        return self._runs.qsize()

    def abandon_overdue(self, deadline_s: float) -> list[Run]:
        """Give up on each run whose call under way started more than ``deadline_s`` ago by the clock: its thread
        is left to it (``run.current`` is the hung item), another takes its place. The runs given up.

        Example::

            for run in workers.abandon_overdue(60.0): ...   # run.abandoned is True; the pool is whole again
        """
        now = self._clock()
        hung = []
        for run in list(self._active):
            # The ticket before the start time: a call that ended and another that began between the two reads
            # shows the new call's start (not overdue), never the old call's start with the new call's ticket.
            ticket, started = run.ticket, run.started
            if started is None or now - started <= deadline_s:
                continue
            try:
                run.current = ticket.pop()
            except IndexError:
                continue  # its call just returned: the thread's answer counts
            run.abandoned = True
            self._active.discard(run)
            hung.append(run)
        if hung:
            with self._lock:
                for run in hung:
                    if run.thread in self._threads:
                        self._threads.remove(run.thread)
            for _ in hung:
                self._spawn()
        return hung

    def close(self, timeout: Optional[float] = None) -> None:
        """Stop the threads once the runs under way end, and join each (the abandoned ones excepted), waiting at
        most ``timeout`` seconds in all (``None``: as long as they take; a thread still running is a daemon one).

        Example::

            workers.close()
        """
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._runs.put(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _spawn(self) -> None:
        with self._lock:
            self._started += 1
            thread = threading.Thread(target=self._work, name=f"{self._name}-worker-{self._started}", daemon=True)
            self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        me, active = threading.current_thread(), self._active
        while True:
            run = self._runs.get()
            if run is None:
                return
            run.thread = me
            active.add(run)
            for item in run.items:
                if not self._runnable(run):
                    break
                ticket = run.ticket = [item]
                run.current, run.started = item, self._clock()
                result, error = None, None
                try:
                    result = self._call(run.payload, item)
                except BaseException as raised:  # the listener's failure is the message's, never the thread's
                    error = raised
                try:
                    ticket.pop()
                except IndexError:
                    return  # hung past its deadline, replaced: its answer counts for nothing
                run.current, run.started = None, None
                run.outcomes.append((item, result, error))
                if not self._ok(result, error):
                    break
            active.discard(run)
            self._done(run)
