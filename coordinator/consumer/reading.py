"""When a consumer instance looks for new versions of each of its sources (topics, and its group's redrive table),
and how far each of its shares reads: the probes a busy loop must not make at every step, and the read-ahead
that keeps a topic's shares together.

How far a source has grown is probed (a GET of its next commit file: :meth:`~.topic_log.TopicLog.latest`) only
once one of its shares has read all it knew of, and at most every probe interval: the poll interval while the
source grows; on object storage, once it has been quiet for :data:`_FLOWING_POLLS` poll intervals, a quarter of
the time since it last grew (a message after a quiet spell waits at most a quarter longer), up to
:data:`_IDLE_POLLS` poll intervals; on a local disk, where a probe is no request, a
:data:`_LOCAL_PROBES_PER_POLL`-th of the poll interval while flowing and the poll interval when quiet; the
group's redrive table, until an operator first redrives, every :data:`_ABSENT_POLLS` poll intervals. Probing
every poll interval was most of an idle consumer's requests (docs/performance-log.md#consumers).

Example::

    reading = Reading(config, remote=False, on_gone=consumer_position_gone)
    reading.add("ORDER_TOPIC", TopicLog(files, "topics/ORDER_TOPIC"))
    reading.read(shares)         # each share filled up to consumer_max_buffered
    reading.probe_due            # time.monotonic() when a source is next probed
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from coordinator.config import CoordinatorConfig
from coordinator.consumer.group import REDRIVE_SOURCE
from coordinator.consumer.share import Share
from coordinator.consumer.topic_log import CACHED_VERSIONS, TopicLog
from coordinator.exceptions import CoordinatorError, PositionGoneError, one_line

__all__ = ["Reading"]

_log = logging.getLogger("coordinator.consumer")

#: A quiet table is probed at most every this many poll intervals; an absent redrive table every _ABSENT_POLLS.
_IDLE_POLLS = 10
#: A table that grew within this many poll intervals is flowing: probed every poll interval, the quiet-time
#: backoff only past it (the gaps between a busy topic's versions, and the checker's stalls on a loaded machine,
#: had the next version wait up to a quarter longer: most of a p99).
_FLOWING_POLLS = 50
#: On a local disk, where a probe is no request, a flowing table is probed this many times a poll interval.
_LOCAL_PROBES_PER_POLL = 4
_ABSENT_POLLS = 100
#: How many versions past the furthest-behind share of a topic with room to read another share reads: within
#: what the topic's log keeps of its versions (topic_log.CACHED_VERSIONS).
_READ_AHEAD_VERSIONS = CACHED_VERSIONS // 2


class Reading:
    """The sources of one consumer instance and when each is probed (see the module's docstring). ``on_gone(share,
    error, latest)`` moves a share on from a version that is gone (``latest``: the source's newest version, if probed). Used by the consumer's loop thread alone."""

    def __init__(self, config: CoordinatorConfig, remote: bool,
                 on_gone: Callable[[Share, PositionGoneError, Optional[int]], None]):
        self.config, self.remote, self._on_gone = config, remote, on_gone
        self.logs: dict[str, TopicLog] = {}
        self._probed_at: dict[str, float] = {}  # time.monotonic() of each source's last probe
        self._grew_at: dict[str, float] = {}  # time.monotonic() of the last probe that found a source grown
        #: time.monotonic() when a source's next probe is due, if one is.
        self.probe_due = float("inf")

    def add(self, source: str, log: TopicLog) -> None:
        self.logs[source] = log

    def read(self, shares: list[Share]) -> None:
        """Fill each of ``shares`` up to ``consumer_max_buffered`` messages, not far past the furthest-behind share
        of its source with room to read. A share whose version is gone is passed to ``on_gone``; an error the
        storage may get over is logged once and tried again next time; one it will not stops the share."""
        self.probe_due = float("inf")
        latest, reading = {}, {}
        room = self.config.consumer_max_buffered
        readable = [share for share in shares if share.stopped is None]
        held: dict[str, set[int]] = {}
        for share in readable:
            held.setdefault(share.source, set()).add(share.number)
        for share in readable:  # each source's log reads the parts of its versions holding these shares
            share.log.want(held[share.source], share.shares)
        for share in readable:
            if len(share.pending) < room:
                reading[share.source] = min(reading.get(share.source, share.next_read), share.next_read)
        for share in readable:
            try:
                if share.source not in latest:
                    latest[share.source] = self._latest(share.source, readable)
                    first = reading.get(share.source)
                    if first is not None:
                        share.log.read_ahead(first, min(latest[share.source], first + 2 * _READ_AHEAD_VERSIONS - 1))
                # Not far past the furthest-behind share that has room to read: the shares of a topic drifted
                # apart past the versions the log keeps, and each version was read and converted again for each
                # share that came to it late (docs/performance-log.md#consumers).
                ahead = reading.get(share.source, share.next_read) + _READ_AHEAD_VERSIONS - 1
                share.fill(min(latest[share.source], ahead), room)
                share.failure = None
            except PositionGoneError as error:
                self._on_gone(share, error, latest.get(share.source))
            except CoordinatorError as error:
                if not error.retriable:
                    share.stopped = error
                    _log.error("consumer share %d of %s stopped: %s", share.number, share.source, one_line(error))
                elif share.failure != one_line(error):
                    _log.error("consumer cannot read share %d of %s: %s", share.number, share.source,
                               one_line(error))
                share.failure = one_line(error)

    def _latest(self, source: str, shares: list[Share]) -> int:
        """How far ``source`` has grown: probed only once one of its ``shares`` has read all it knew of, and at
        most every :meth:`_probe_interval` (a busy loop steps often, and a probe each time would cost a request
        per step)."""
        log, now = self.logs[source], time.monotonic()
        known = log.known
        caught_up = known is None or any(share.next_read > known for share in shares if share.source == source)
        interval = self._probe_interval(source, now)
        if caught_up and now - self._probed_at.get(source, float("-inf")) >= interval:
            self._probed_at[source] = now
            latest = log.latest()
            if latest != known:
                self._grew_at[source] = now
                interval = self._probe_interval(source, now)
            self.probe_due = min(self.probe_due, now + interval)
            return latest
        if caught_up:
            self.probe_due = min(self.probe_due, self._probed_at[source] + interval)
        return known

    def _probe_interval(self, source: str, now: float) -> float:
        """How long after its last probe ``source`` is probed again (see the module's docstring)."""
        poll = self.config.consumer_poll_interval_ms / 1000
        if source == REDRIVE_SOURCE and self.logs[source].known == -1:
            return poll * _ABSENT_POLLS
        quiet = now - self._grew_at.get(source, now)
        if not self.remote:
            return poll / _LOCAL_PROBES_PER_POLL if quiet < poll * _FLOWING_POLLS else poll
        if quiet < poll * _FLOWING_POLLS:
            return poll
        return min(max(poll, quiet / 4), poll * _IDLE_POLLS)
