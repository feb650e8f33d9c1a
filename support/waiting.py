"""Waiting for something another process does: one polling rule for the benchmarks, the harness and the tests."""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

import tenacity

__all__ = ["Periodically", "wait_until"]

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float = 60.0, what: str = "the condition", poll_s: float = 0.05,
               retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``condition`` every ``poll_s`` until it returns something truthy, and return that; raise
    ``TimeoutError`` naming ``what`` once ``timeout_s`` have passed. An exception ``condition`` raises
    ends the wait at once, unless it is one of ``retry_on`` (a request that timed out, say): then it is
    called again, and the last such exception is the timeout's cause. The default bound is generous: a
    wait that passes costs no more for it, and a loaded machine (two test lanes on two cores) can take
    many times as long as a quiet one.

    Example::

        wait_until(lambda: log.exists(), 10, "the checker's log")
        rows = wait_until(lambda: read_rows() or None, 60, "a delivered row")
        wait_until(lambda: scrape(url), what="a scrape", retry_on=(OSError,))
    """

    def timed_out(state: tenacity.RetryCallState) -> T:
        error = state.outcome.exception() if state.outcome is not None else None
        raise TimeoutError(f"{what}: not within {timeout_s:g} s") from error

    retry = tenacity.retry_if_result(lambda found: not found)
    if retry_on:
        retry = retry | tenacity.retry_if_exception_type(retry_on)
    retrying = tenacity.Retrying(stop=tenacity.stop_after_delay(timeout_s), wait=tenacity.wait_fixed(poll_s),
                                 retry=retry, retry_error_callback=timed_out)
    return retrying(condition)


class Periodically:
    """Calls ``action`` in a thread of its own, again ``every_s`` after each call ends, while in its ``with``
    block (the last call ends before the block does).

    Example::

        with Periodically(lambda: samples.append(psutil.cpu_times()), every_s=0.5):
            run_the_load()
    """

    def __init__(self, action: Callable[[], object], every_s: float):
        self._action, self._every_s = action, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Periodically":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._action()
            self._stop.wait(self._every_s)
