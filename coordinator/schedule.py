"""The check schedule: when the checker checks an unresolved transaction, and when it gives up.

RocketMQ's rule, timed by the checker's batch clock (the latest commit time among a batch's
records, :mod:`coordinator.checker.context`): a first check once the transaction's immunity has
passed since its half entered the commit log, then one every ``transaction_check_interval_ms``
after the last check request became visible; after ``transaction_check_max`` checks, or once older
than ``file_reserved_time_hours``, a discard. The checker acts by it (:mod:`coordinator.checker.check`)
and ``txcoord pending`` reports by it (:mod:`coordinator.ops.pending`), so the two cannot disagree.

Example::

    step = next_step(config, stored_us=t0, immunity_ms=6000, checks=0, last_check_us=None)
    step.action, step.at_us  # ('check', t0 + 6_000_000)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Optional

from coordinator.config import CoordinatorConfig

__all__ = ["CHECK", "DELIVER", "DISCARD", "EXPIRED", "Step", "check_or_discard", "clock_time", "clock_us", "next_step",
           "next_step_at"]

CHECK = "check"
DISCARD = "discard"
#: A committed transaction's next step while its topic cannot be written (coordinator.checker.delivery):
#: offered to the topic again at every batch, never checked or discarded.
DELIVER = "deliver"
#: Why a transaction older than ``file_reserved_time_hours`` is discarded.
EXPIRED = "expired: older than file_reserved_time_hours"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class Step:
    """What the checker does with a pending transaction: :data:`CHECK`, :data:`DISCARD` or :data:`DELIVER`,
    from batch clock ``at_us`` on; ``reason`` says why a discard, or why a delivery is withheld."""

    action: str
    at_us: int
    reason: Optional[str] = None


def next_step_at(config: CoordinatorConfig, stored_us: int, immunity_ms: int, last_check_us: Optional[int]) -> int:
    """The earliest batch clock at which a transaction stored at ``stored_us`` needs a check or a discard.

    Example::

        next_step_at(config, t0, 6000, None)  # t0 + 6 s: its immunity has passed
    """
    if last_check_us is None:
        due = stored_us + immunity_ms * 1000
    else:
        due = last_check_us + config.transaction_check_interval_ms * 1000
    return min(due, _expiry_us(config, stored_us) + 1)


def check_or_discard(config: CoordinatorConfig, now_us: int, stored_us: int, checks: int) -> Step:
    """What the checker does at batch clock ``now_us`` with a transaction whose step is due
    (``now_us >= next_step_at(...)``) and that has had ``checks`` checks.

    Example::

        check_or_discard(config, now_us, t0, checks=config.transaction_check_max).action  # 'discard'
    """
    if now_us > _expiry_us(config, stored_us):
        return Step(DISCARD, now_us, EXPIRED)
    if checks >= config.transaction_check_max:
        return Step(DISCARD, now_us, f"checked {checks} times without an answer")
    return Step(CHECK, now_us)


def next_step(config: CoordinatorConfig, stored_us: int, immunity_ms: int, checks: int,
              last_check_us: Optional[int], now_us: int = 0) -> Step:
    """What the checker's first batch from ``now_us`` on will do with a transaction, and from which
    batch clock on (a time before ``now_us``: the step is overdue, and the next batch takes it).

    Example::

        next_step(config, t0, 6000, checks=0, last_check_us=None)  # Step('check', t0 + 6 s)
    """
    at_us = next_step_at(config, stored_us, immunity_ms, last_check_us)
    return replace(check_or_discard(config, max(at_us, now_us), stored_us, checks), at_us=at_us)


def clock_us(moment: dt.datetime) -> int:
    """``moment`` (timezone-aware) as a batch clock: exact microseconds since the epoch.

    Example::

        clock_us(dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc))  # 1000000
    """
    return (moment - _EPOCH) // _MICROSECOND


def clock_time(us: int) -> dt.datetime:
    """Batch clock ``us`` as a UTC time (the inverse of :func:`clock_us`).

    Example::

        clock_time(1_000_000)  # datetime(1970, 1, 1, 0, 0, 1, tzinfo=timezone.utc)
    """
    return _EPOCH + us * _MICROSECOND


def _expiry_us(config: CoordinatorConfig, stored_us: int) -> int:
    return stored_us + int(config.file_reserved_time_hours * 3_600_000_000)
