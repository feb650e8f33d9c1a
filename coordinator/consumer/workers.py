"""The threads that run a consumer's listener calls, where a call that hangs costs its thread, never the pool.

A call past its deadline is *abandoned*: its message counts as failed, a new thread takes the hung one's
place, and the hung one exits whenever its call returns, its answer ignored. A Python thread cannot be
stopped from outside: an abandoned thread is a daemon one, so it never keeps the process from exiting.

Example::

    workers = Workers(4, run=lambda task: task(), done=print)
    workers.submit(lambda: 42)      # done(task, result, error) is called from the worker's thread
    workers.close()                 # joins every thread but the abandoned ones
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional

__all__ = ["Task", "Workers"]


class Task:
    """One listener call: what to run, and whether it was abandoned (its answer, if any, is then ignored)."""

    def __init__(self, call: Callable[[], Any], payload: Any = None):
        self.call, self.payload = call, payload
        self.abandoned = False
        self.thread: Optional[threading.Thread] = None


class Workers:
    """``size`` threads running :class:`Task` calls; ``done(task, result, error)`` reports each finished one."""

    def __init__(self, size: int, done: Callable[[Task, Any, Optional[BaseException]], None], name: str = "consumer"):
        self._size, self._done, self._name = size, done, name
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._busy = 0
        self._started = 0
        for _ in range(size):
            self._spawn()

    @property
    def idle(self) -> int:
        """How many more calls could start now.

        Example::

            if workers.idle: workers.submit(task)
        """
        with self._lock:
            return self._size - self._busy

    def submit(self, task: Task) -> None:
        """Run ``task`` on the next free thread.

        Example::

            workers.submit(Task(lambda: listener.consume(message), payload=message))
        """
        with self._lock:
            self._busy += 1
        self._tasks.put(task)

    def abandon(self, task: Task) -> None:
        """Give up on ``task``, which runs past its deadline: its thread is left to it, another takes its place.

        Example::

            workers.abandon(task)   # task.abandoned is True; the pool is whole again
        """
        with self._lock:
            task.abandoned = True
            self._busy -= 1
            if task.thread in self._threads:
                self._threads.remove(task.thread)
        self._spawn()

    def close(self) -> None:
        """Stop the threads once the calls under way end, and join each (the abandoned ones excepted).

        Example::

            workers.close()
        """
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)
        for thread in threads:
            thread.join()

    def _spawn(self) -> None:
        with self._lock:
            self._started += 1
            thread = threading.Thread(target=self._work, name=f"{self._name}-worker-{self._started}", daemon=True)
            self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            with self._lock:
                task.thread = threading.current_thread()
            result, error = None, None
            try:
                result = task.call()
            except BaseException as raised:  # the listener's failure is the message's, never the thread's
                error = raised
            with self._lock:
                if task.abandoned:
                    return  # hung past its deadline, replaced: its answer counts for nothing
                self._busy -= 1
            self._done(task, result, error)
