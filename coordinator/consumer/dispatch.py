"""Handing a consumer's messages to its listener, and what follows each call: handled, retried after its delay,
or moved to the group's dead letters once out of attempts.

Within a share, a message starts only once every earlier message of its key is handled: a key's due messages
go to a worker thread together, as one run (:mod:`.workers`), stopping at a failure; other keys' messages run at
once, up to ``consumer_threads`` calls. A failure (``FAILURE``, an exception, an answer that is not a
:class:`ConsumeResult`, a call past ``consumer_timeout_ms``) delivers the message again after the next delay of
``consumer_retry_delays_ms``, its key's later messages waiting; after ``consumer_max_attempts`` attempts it moves
to the group's dead letters (its identity: :func:`~coordinator.consumer.group.dead_letter_id`, written once by
an application transaction of its own) and its key goes on.

Example::

    dispatcher = Dispatcher(consumer_group, "9c1e…", listener, config, clock, runnable, on_finished, save)
    dispatcher.dispatch(shares)       # the due runs of every share, handed to the workers in turn
    dispatcher.settle(share, pending, error=None)
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from itertools import zip_longest
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa

from coordinator.config import CoordinatorConfig
from coordinator.consumer.group import REDRIVE_SOURCE, ConsumerGroup, dead_letter_id
from coordinator.consumer.listener import ConsumeResult, MessageListener
from coordinator.consumer.message import ConsumedMessage
from coordinator.consumer.share import Pending, Share
from coordinator.consumer.workers import Run, Workers
from coordinator.exceptions import CoordinatorError, one_line
from coordinator.tables import DEAD_LETTERS

__all__ = ["CallCounts", "Dispatcher", "retry_delay_ms"]

_log = logging.getLogger("coordinator.consumer")


def retry_delay_ms(delays: Sequence[int], failed_attempts: int) -> int:
    """The delay before the attempt that follows ``failed_attempts`` failed ones: the ladder's entry, its last
    one repeating.

    Example::

        retry_delay_ms((10_000, 30_000), 1)  # 10000
        retry_delay_ms((10_000, 30_000), 5)  # 30000
    """
    return delays[min(failed_attempts, len(delays)) - 1]


class CallCounts:
    """What an instance's listener calls came to, by source (each a callable taking the source, or the source and
    seconds): what the consumer's metrics count. Nothing counted by default."""

    def __init__(self, handled: Callable = lambda source, seconds: None, failed: Callable = lambda source: None,
                 retried: Callable = lambda source: None, dead: Callable = lambda source: None):
        self.handled, self.failed, self.retried, self.dead = handled, failed, retried, dead


class Dispatcher:
    """The listener calls of one consumer instance (see the module's docstring). ``runnable(run)`` says whether a
    run's next call may start; ``finished(run)`` hears of each run that ended, on a worker's thread;
    ``save(share)`` saves a share's progress (whether it was saved); ``held(share)`` whether the instance still
    holds it. Used by the consumer's loop thread, but the calls, on the workers' threads."""

    def __init__(self, group: ConsumerGroup, instance_id: str, listener: MessageListener, config: CoordinatorConfig,
                 clock: Callable[[], float], runnable: Callable[[Run], bool], finished: Callable[[Run], None],
                 save: Callable[[Share], bool], held: Callable[[Share], bool], counts: Optional[CallCounts] = None):
        self.group, self.instance_id, self.listener, self.config, self.clock = group, instance_id, listener, config, clock
        self._save, self._held = save, held
        self.counts = counts or CallCounts()
        self.workers = Workers(config.consumer_threads, self._call, _succeeded, finished, clock, runnable,
                               name=f"consumer-{group.group}")
        self.outstanding = 0  # runs handed to the workers and not reported back yet
        self._turn = 0  # the share the next round of deliveries begins with
        self._dead_letters = None

    def dispatch(self, shares: list[Share]) -> None:
        """Hand the workers, for each key whose earlier messages are all handled, its messages that are due, as
        one run: a hand-off per key, not per message. The shares' runs are queued in turn, beginning with the
        share after the last round's first: in the shares' own order, the runs of the shares held longest
        filled the queue, and shares taken over from a dead instance waited. Then the dead letters of messages
        out of attempts before a crash are written."""
        shares = [share for share in shares if share.pending and share.stopped is None]
        if not shares:
            return
        start = self._turn % len(shares)
        self._turn = start + 1
        now_ms = int(self.clock() * 1000)
        due = [(share, *_due_runs(share, now_ms)) for share in shares[start:] + shares[:start]]
        for turn in zip_longest(*(runs for _, runs, _ in due)):
            for run in turn:
                if run is not None:
                    for pending in run.items:
                        pending.inflight = True
                    self.outstanding += 1
                    self.workers.submit(run)
        for share, _, dying in due:
            for pending in dying:
                if not self._held(share):
                    break  # lost while an earlier dead letter was buried (its save refused): its holder delivers
                self.bury(share, pending)

    def ended(self, run: Run) -> None:
        """A run reported back (or abandoned): settle each call it made, free what it did not start."""
        self.outstanding -= 1
        share = run.payload
        held = self._held(share)
        for pending, result, error in run.outcomes:
            pending.inflight = False
            if held:  # else lost meanwhile: its new holder delivers it again
                self.settle(share, pending, _failure(result, error))
        if run.abandoned:
            run.current.inflight = False
            if held:
                self.settle(share, run.current, f"the listener did not answer within consumer_timeout_ms "
                                                f"({self.config.consumer_timeout_ms} ms)")
        for pending in run.unstarted():
            pending.inflight = False

    def expire(self) -> list[Run]:
        """The runs whose call under way passed ``consumer_timeout_ms``, given up (see :mod:`.workers`)."""
        return self.workers.abandon_overdue(self.config.consumer_timeout_ms / 1000)

    def settle(self, share: Share, pending: Pending, error: Optional[str]) -> None:
        if error is None:
            share.handled(pending)
            return
        pending.attempts += 1
        pending.error = error
        self.counts.failed(share.source)
        _log.info("consumer %s: message %s of %s failed (attempt %d): %s", self.instance_id, pending.row["msg_id"],
                  share.source, pending.attempts, error)
        if pending.attempts >= self.config.consumer_max_attempts:
            pending.dead = True
        else:
            self.counts.retried(share.source)
            pending.due_ms = int(self.clock() * 1000) + retry_delay_ms(self.config.consumer_retry_delays_ms,
                                                                       pending.attempts)
        share.dirty = True
        if self._save(share) and pending.dead:
            self.bury(share, pending)

    def bury(self, share: Share, pending: Pending) -> None:
        """Move ``pending``, out of attempts, to the group's dead letters; its key goes on. The write is recorded
        by an application transaction named after the dead letter, so whoever writes it again (this instance
        after a crash, the share's next holder) writes nothing."""
        row = _dead_letter_row(pending, share, self.instance_id, self.clock())
        identity = row.column("dead_letter_id")[0].as_py()
        try:
            self._dead_letter_appender().append(row, app_transaction=(f"txcoord-dead-letter.{identity}", 0))
        except CoordinatorError as error:
            _log.error("consumer %s could not write a dead letter for %s: %s", self.instance_id,
                       pending.row["msg_id"], one_line(error))
            return
        _log.warning("consumer %s: message %s of %s is dead letter %s after %d attempts: %s", self.instance_id,
                     pending.row["msg_id"], share.source, identity, pending.attempts, pending.error)
        self.counts.dead(share.source)
        share.handled(pending)
        self._save(share)

    def close(self, timeout: Optional[float] = None) -> None:
        self.workers.close(timeout)
        if self._dead_letters is not None:
            self._dead_letters.close()

    def _call(self, share: Share, pending: Pending) -> Any:
        """On a worker's thread: the listener's call for ``pending``."""
        started = time.perf_counter()
        result = self.listener.consume(_message(pending, share.source, pending.attempts + 1))
        if result is ConsumeResult.SUCCESS:
            self.counts.handled(share.source, time.perf_counter() - started)
        return result

    def _dead_letter_appender(self):
        if self._dead_letters is None:
            from coordinator.appender import DeltaAppender
            from coordinator.lakehouse import create_table

            lakehouse = self.group.lakehouse
            path = lakehouse.consumer_table(self.group.group, "dead_letters")
            create_table(DEAD_LETTERS, path, lakehouse.storage)
            self._dead_letters = DeltaAppender(path, storage=lakehouse.storage)
        return self._dead_letters


def _due_runs(share: Share, now_ms: int) -> tuple[list[Run], list[Pending]]:
    """``share``'s runs that may start (a key's due messages, in order, behind none of its earlier ones), and
    its messages out of attempts before a crash whose dead letters are still to write."""
    runs: dict[str, list[Pending]] = {}
    dying, blocked = [], set()
    for pending in share.pending:
        lane = pending.lane
        if lane in blocked:
            continue
        if pending.inflight or pending.dead or pending.due_ms > now_ms:
            blocked.add(lane)  # its key's later messages wait for this one
            if pending.dead and not pending.inflight:
                dying.append(pending)
            continue
        runs.setdefault(lane, []).append(pending)
    return [Run(run, share) for run in runs.values()], dying


def _succeeded(result: Any, error: Optional[BaseException]) -> bool:
    return error is None and result is ConsumeResult.SUCCESS


def _failure(result: Any, error: Optional[BaseException]) -> Optional[str]:
    """Why a listener call failed, or ``None`` if it succeeded."""
    if error is not None:
        return f"the listener raised {one_line(error)}"
    if result is ConsumeResult.SUCCESS:
        return None
    if result is ConsumeResult.FAILURE:
        return "the listener returned FAILURE"
    return f"the listener returned {result!r} ({type(result).__name__}), not a ConsumeResult"


def _message(pending: Pending, source: str, attempt: int) -> ConsumedMessage:
    row = pending.row
    # Every field set at once: the frozen dataclass's __init__ sets each through object.__setattr__, the largest
    # part of handing a message to a listener that does nothing (docs/performance-log.md#consumers).
    message = object.__new__(ConsumedMessage)
    message.__dict__.update(topic=row["topic"], msg_id=row["msg_id"], transaction_id=row["transaction_id"],
                            keys=row["keys"], tags=row["tags"], properties=dict(row["properties"] or {}),
                            body=row["body"] or b"", queue_offset=pending.offset,
                            commit_timestamp=row["commit_timestamp"], delivery_attempt=attempt,
                            born_timestamp=row["born_timestamp"],
                            topic_version=-1 if source == REDRIVE_SOURCE else pending.version)
    return message


def _dead_letter_row(pending: Pending, share: Share, instance_id: str, now: float) -> pa.Table:
    row = {name: pending.row.get(name) for name, _ in DEAD_LETTERS.columns}
    if row["properties"] is not None:
        row["properties"] = list(row["properties"].items())
    row |= {"dead_letter_id": dead_letter_id(share.source, pending.version, pending.offset, pending.row["msg_id"],
                                             share.epoch),
            "topic_version": -1 if share.source == REDRIVE_SOURCE else pending.version, "share": share.number,
            "attempts": pending.attempts, "last_error": pending.error, "consumer_instance": instance_id,
            "dead_at": dt.datetime.fromtimestamp(now, dt.timezone.utc)}
    return pa.Table.from_pylist([row], schema=DEAD_LETTERS.arrow_schema())
