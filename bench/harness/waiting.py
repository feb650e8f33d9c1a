"""Waiting for something another process does: one polling rule for the benchmarks, the harness and the tests."""

from __future__ import annotations

from typing import Callable, TypeVar

import tenacity

__all__ = ["wait_until"]

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
