"""Waiting for something another process does: one polling rule for the benchmarks, the harness and the tests."""

from __future__ import annotations

from typing import Callable, TypeVar

import tenacity

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float = 10.0, what: str = "the condition", poll_s: float = 0.05) -> T:
    """Call ``condition`` every ``poll_s`` until it returns something truthy, and return that; raise
    ``TimeoutError`` naming ``what`` once ``timeout_s`` have passed. An exception ``condition`` raises
    ends the wait at once.

    Example::

        wait_until(lambda: log.exists(), 10, "the checker's log")
        rows = wait_until(lambda: read_rows() or None, 60, "a delivered row")
    """

    def timed_out(state: tenacity.RetryCallState) -> T:
        raise TimeoutError(f"{what}: not within {timeout_s:g} s")

    retrying = tenacity.Retrying(stop=tenacity.stop_after_delay(timeout_s), wait=tenacity.wait_fixed(poll_s),
                                 retry=tenacity.retry_if_result(lambda found: not found),
                                 retry_error_callback=timed_out)
    return retrying(condition)
