"""The topic consumer: a consumer group's instance, handing each committed message to a listener.

Each topic is split into a fixed number of *shares* (the group's grant says how many) by a stable hash of a
message's ``keys`` (of its ``msg_id`` when it has none): the messages of one key are always in one share.
Every instance announces itself (:class:`~coordinator.consumer.group.ConsumerInstances`) and, every half
heartbeat, works out which shares it should hold by rendezvous hashing with bounded loads over the live
instances of its group (listed only around membership changes and every few heartbeats:
:meth:`TopicConsumer._survey`); it takes a
share with a claim written conditionally, so one share is handled by one instance at a time, and gives up the
shares another live instance should hold once its calls under way in them end. An instance whose own record it
could not renew for a heartbeat and a half stops starting calls: the others may take it for dead soon after.

Within a share, messages are taken in the topic's order (its versions in order, ``queue_offset`` within
each; :mod:`.topic_log`): a message starts only once every earlier message of its key is handled, so the
messages of one key are handled one after another, in order, across all instances (a key's due messages go to
a worker thread together, as one run: :mod:`.workers`); other keys' messages run at once, up to
``consumer_threads`` calls. A failure (``FAILURE``, an exception, an answer that is not a
:class:`ConsumeResult`, a call past ``consumer_timeout_ms``) delivers the message again after the next delay
of ``consumer_retry_delays_ms``, its key's later messages waiting; after ``consumer_max_attempts`` attempts it
moves to the group's dead letters and its key goes on.

Each share's progress (:class:`~coordinator.consumer.group.ShareProgress`) is saved, conditionally, at most
every ``consumer_commit_interval_ms`` while messages succeed, at once after a failure, and when the share is
given up or the consumer closes: a crash delivers again what was handled since the last save, never skips.

Example::

    with TopicConsumer("credits", ["ORDER_TOPIC"], Credits(), config) as consumer:
        ...   # consuming in the background until the block exits
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections import deque
from itertools import zip_longest
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa

from coordinator.config import CoordinatorConfig, parse_start_time
from coordinator.consumer.group import (LIVE_FOR_HEARTBEATS, REDRIVE_SOURCE, ConsumerGroup, ShareProgress,
                                        share_of, share_owners)
from coordinator.consumer.listener import ConsumeResult, MessageListener
from coordinator.consumer.message import ConsumedMessage
from coordinator.consumer.topic_log import CACHED_VERSIONS, TopicLog
from coordinator.consumer.workers import Run, Workers
from coordinator.exceptions import ConsumerStateError, CoordinatorError, InvalidArgumentError, one_line
from coordinator.lakehouse import Lakehouse
from coordinator.names import validate_name
from coordinator.storage import read_all
from coordinator.tables import DEAD_LETTERS

__all__ = ["TopicConsumer", "retry_delay_ms"]

_log = logging.getLogger("coordinator.consumer")

#: An instance that could not renew its record for this many heartbeats stops starting calls.
_FENCE_HEARTBEATS = 1.5
#: A quiet table is probed at most every this many poll intervals; an absent redrive table every _ABSENT_POLLS.
_IDLE_POLLS = 10
#: A table that grew within this many poll intervals is flowing: probed every poll interval, the quiet-time
#: backoff only past it (the gaps between a busy topic's versions, and the checker's stalls of a few seconds
#: on a loaded machine, had the next version wait up to a quarter longer: up to 1 s, most of a p99).
_FLOWING_POLLS = 50
#: On a local disk, where a probe is no request, a flowing table is probed this many times a poll interval, and
#: a quiet one every poll interval (the backoff saves requests on object storage; a local disk prices none).
_LOCAL_PROBES_PER_POLL = 4
_ABSENT_POLLS = 100
#: How many versions past the furthest-behind share of a topic with room to read another share reads: within
#: what the topic's log keeps of its versions (topic_log.CACHED_VERSIONS).
_READ_AHEAD_VERSIONS = CACHED_VERSIONS // 2
#: The group's instances are listed every look for this many heartbeats after a change, then every
#: _SURVEY_HEARTBEATS (:meth:`TopicConsumer._survey`).
_SETTLE_HEARTBEATS = 2
_SURVEY_HEARTBEATS = 5
#: An instance owed shares that a live instance still holds (it lets go once its look finds this one) looks
#: again after this many poll intervals, not half a heartbeat: two instances started together settled 3 s
#: after their start, one look of each, and now one look and this.
_OWED_LOOK_POLLS = 2


def retry_delay_ms(delays: Sequence[int], failed_attempts: int) -> int:
    """The delay before the attempt that follows ``failed_attempts`` failed ones: the ladder's entry, its last
    one repeating.

    Example::

        retry_delay_ms((10_000, 30_000), 1)  # 10000
        retry_delay_ms((10_000, 30_000), 5)  # 30000
    """
    return delays[min(failed_attempts, len(delays)) - 1]


class _Pending:
    """A message of a share not handled yet, with its retry state (slots: one is made per message read)."""

    __slots__ = ("row", "version", "offset", "lane", "attempts", "due_ms", "error", "dead", "inflight")

    def __init__(self, row: dict, version: int, offset: int, lane: str):
        self.row, self.version, self.offset, self.lane = row, version, offset, lane
        self.attempts = self.due_ms = 0
        self.error: Optional[str] = None
        self.dead = self.inflight = False


class _Share:
    """A share this instance holds: what it has read of the share's messages and what is left to handle."""

    def __init__(self, source: str, number: int, log: TopicLog, progress: ShareProgress, file_version: Optional[str],
                 now: float):
        self.source, self.number, self.log = source, number, log
        self.floor = progress.floor
        self.done = {version: set(offsets) for version, offsets in progress.done.items()}
        self.unread_retries = dict(progress.retrying)
        self.dead_letters = progress.dead_letters
        self.next_read = progress.version
        #: The messages read and not handled, in the topic's order (a dict as an ordered set: one is removed
        #: in O(1) whichever finishes first).
        self.pending: dict[_Pending, None] = {}
        self.file_version = file_version
        self.dirty = file_version is None
        self.saved_at = now
        self.releasing = False
        self.failure: Optional[str] = None
        self.claim: Optional[str] = None  # the version of this instance's claim of the share

    @property
    def watermark(self) -> int:
        return next(iter(self.pending)).version if self.pending else self.next_read

    def progress(self) -> ShareProgress:
        watermark = self.watermark
        for version in [version for version in self.done if version < watermark]:
            del self.done[version]
        retrying = dict(self.unread_retries)
        retrying |= {p.offset: {"attempts": p.attempts, "due_ms": p.due_ms, "error": p.error, "dead": p.dead}
                     for p in self.pending if p.attempts}
        return ShareProgress(watermark, self.floor, {v: sorted(o) for v, o in self.done.items() if o}, retrying,
                             self.dead_letters)

    def handled(self, pending: _Pending) -> None:
        del self.pending[pending]
        self.done.setdefault(pending.version, set()).add(pending.offset)
        self.dirty = True


class TopicConsumer:
    """An instance of consumer group ``group`` handing the messages of ``topics`` to ``listener`` (see the
    module's docstring). ``start()`` begins consuming in background threads; ``close()`` lets the calls under
    way finish, saves progress, gives up its shares and joins every thread it started (a call abandoned past
    its deadline excepted). Also a context manager.

    ``clock`` (epoch seconds) is what every deadline, delay and heartbeat is measured with: tests move it by hand.

    Example::

        consumer = TopicConsumer("credits", ["ORDER_TOPIC"], Credits(), CoordinatorConfig.load())
        consumer.start()
        try:
            ...
        finally:
            consumer.close()
    """

    def __init__(self, group: str, topics: Sequence[str], listener: MessageListener, config: CoordinatorConfig, *,
                 clock: Callable[[], float] = time.time):
        self.group = validate_name("consumer group", group)
        if isinstance(topics, str) or not isinstance(topics, Sequence) or not topics:
            raise InvalidArgumentError(f"topics must be a non-empty list of topic names, got {topics!r}")
        self.topics = tuple(dict.fromkeys(validate_name("topic", topic) for topic in topics))
        if not isinstance(listener, MessageListener):
            raise InvalidArgumentError(f"listener must be a MessageListener, got {type(listener).__name__}")
        self.listener, self.config, self.clock = listener, config, clock
        #: This instance of the group, as its record and claims name it (``consumers/<group>/_instances``).
        self.instance_id = uuid.uuid4().hex
        self.lakehouse = Lakehouse.of(config)
        self._group = ConsumerGroup(self.lakehouse, self.group, clock=clock)
        self._state = "created"
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._halted = False
        self._shares: dict[tuple[str, int], _Share] = {}
        #: Claims of shares this instance dropped, still to release (a release refused by a failing storage is
        #: tried again at each look): a claim left naming a live instance would stall its share.
        self._unreleased: dict[tuple[str, int], str] = {}
        self._logs: dict[str, TopicLog] = {}
        self._probed_at: dict[str, float] = {}  # time.monotonic() of each source's last probe
        self._grew_at: dict[str, float] = {}  # time.monotonic() of the last probe that found a source grown
        self._probe_due = float("inf")  # time.monotonic() when a source's next probe is due, if one is
        self._outstanding = 0  # runs handed to the workers and not reported back yet
        self._finished: deque[Run] = deque()  # appended by worker threads, taken by the loop
        self._announced_at = float("-inf")
        self._rebalanced_at = float("-inf")
        self._owed = False  # the last look found shares this instance should hold that a live one still held
        self._live: set[str] = set()  # the group's live instances, as the last look found them
        self._settled_from = self._surveyed_at = float("-inf")  # when the live set last changed, was last listed
        self._dead_letters = None
        self._thread: Optional[threading.Thread] = None
        self._workers: Optional[Workers] = None
        self._shares_per_topic = 0
        self._dispatch_from = 0  # the turn of the share the next round of deliveries begins with
        self._steps = 0  # rounds of the loop so far: a test moving the clock waits for the next ones
        #: The error that stopped this consumer, if one did (also logged); ``close()`` raises it.
        self.failure: Optional[BaseException] = None

    def start(self) -> "TopicConsumer":
        """Check the group's grant, announce this instance and start consuming in the background. Idempotent;
        returns ``self``. Raises :class:`~coordinator.exceptions.AccessDeniedError` naming the grant when the
        group may not read one of its topics, :class:`ConsumerStateError` after :meth:`close`.

        Example::

            consumer = TopicConsumer("credits", ["ORDER_TOPIC"], Credits(), config).start()
        """
        with self._lock:
            if self._state == "running":
                return self
            if self._state == "closed":
                raise ConsumerStateError(f"consumer of group {self.group!r} was closed; create a new one")
            grant = self._group.require_grant(self.topics)
            self._shares_per_topic = grant.shares
            for source in (*self.topics, REDRIVE_SOURCE):
                key = (f"topics/{source}" if source != REDRIVE_SOURCE
                       else f"{self.lakehouse.consumer_dir(self.group)}/redrive")
                self._logs[source] = TopicLog(self.lakehouse.files, key)
            self._announce()
            self._workers = Workers(self.config.consumer_threads, self._call, _succeeded, self._on_finished,
                                    self.clock, self._runnable, name=f"consumer-{self.group}")
            self._thread = threading.Thread(target=self._run, name=f"consumer-{self.group}", daemon=True)
            self._state = "running"
            self._thread.start()
        _log.info("consumer started group=%s instance=%s topics=%s shares=%d", self.group, self.instance_id,
                  ",".join(self.topics), self._shares_per_topic)
        return self

    def close(self) -> None:
        """Stop starting calls, let those under way finish (each within ``consumer_timeout_ms``), save every
        share's progress, give up the shares, withdraw this instance and join the threads. Idempotent. Raises
        the error that stopped the consumer, if one did.

        Example::

            consumer.close()
        """
        with self._lock:
            if self._state != "running":
                self._state = "closed"
                return
            self._state = "closed"
        self._stopping.set()
        self._wake.set()
        self._thread.join()
        self._workers.close()
        if self._dead_letters is not None:
            self._dead_letters.close()
        _log.info("consumer closed group=%s instance=%s", self.group, self.instance_id)
        if self.failure is not None:
            raise ConsumerStateError(f"consumer of group {self.group!r} stopped: {one_line(self.failure)}") \
                from self.failure

    def __enter__(self) -> "TopicConsumer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def shares(self) -> list[tuple[str, int]]:
        """The (topic, share) pairs this instance holds now (the group's redrive table as ``~redrive``).

        Example::

            consumer.shares  # [('ORDER_TOPIC', 0), ('ORDER_TOPIC', 5), ...]
        """
        with self._lock:
            return sorted(self._shares)

    def _halt(self) -> None:
        """Stop at once, saving nothing and withdrawing nothing: what ``kill -9`` leaves behind (for tests)."""
        self._halted = True
        self._stopping.set()
        self._wake.set()
        self._thread.join()
        with self._lock:
            self._state = "closed"

    # The background loop: every step below runs on its thread alone, so a share's state needs no lock.

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._step()
                # Until the next probe is due, not a whole poll interval: a step woken early by a finished call
                # skips a probe not yet due, and waiting a whole interval after it put the probe off by as much.
                poll = self.config.consumer_poll_interval_ms / 1000
                self._wake.wait(min(poll, max(0.0, self._probe_due - time.monotonic())))
                self._wake.clear()
            if not self._halted:
                self._drain()
        except BaseException as error:  # whatever stops the loop stops this consumer, said once, loudly
            self.failure = error
            _log.error("consumer of group %s stopped: %s", self.group, one_line(error), exc_info=error)
            self._stop_delivering()

    def _step(self) -> None:
        now = self.clock()
        heartbeat_s = self.config.consumer_heartbeat_ms / 1000
        if now - self._announced_at >= heartbeat_s:
            self._announce()
        look_s = heartbeat_s / 2
        if self._owed:
            look_s = min(look_s, _OWED_LOOK_POLLS * self.config.consumer_poll_interval_ms / 1000)
        if now - self._rebalanced_at >= look_s:
            self._rebalance()
            if self.clock() - self._announced_at >= heartbeat_s:
                self._announce()  # a long look (shares taken, slow requests) must not cost this instance its record
        self._take_finished()
        self._expire()
        self._read()
        self._dispatch()
        self._save_due()
        self._steps += 1

    def _drain(self) -> None:
        """Closing: the calls under way finish (or time out), then every share is saved and given up."""
        for share in self._shares.values():
            share.releasing = True
        while self._outstanding:
            self._take_finished()
            self._expire()
            self._wake.wait(self.config.consumer_poll_interval_ms / 1000)
            self._wake.clear()
        self._take_finished()
        for share in list(self._shares.values()):
            self._give_up(share)
        try:
            self._group.instances.withdraw(self.group, self.instance_id)
        except CoordinatorError as error:
            _log.warning("consumer %s could not withdraw its record: %s", self.instance_id, one_line(error))

    def _announce(self) -> None:
        try:
            self._group.instances.announce(self.group, self.instance_id, self.config.consumer_heartbeat_ms / 1000)
        except CoordinatorError as error:
            _log.warning("consumer %s could not renew its record: %s", self.instance_id, one_line(error))
            return
        self._announced_at = self.clock()

    @property
    def _fenced(self) -> bool:
        return self.clock() - self._announced_at > _FENCE_HEARTBEATS * self.config.consumer_heartbeat_ms / 1000

    def _rebalance(self) -> None:
        self._rebalanced_at = now = self.clock()
        try:
            live = self._survey(now)
        except CoordinatorError as error:
            _log.warning("consumer %s could not survey its group: %s", self.instance_id, one_line(error))
            return
        for key, claim in list(self._unreleased.items()):
            self._release(key[0], key[1], claim)
        changed, self._live = live != self._live, live
        holders = {source: share_owners(self.group, source, self._shares_per_topic, live) for source in self._logs}
        kept = []
        for key, share in list(self._shares.items()):
            if share.releasing:
                continue
            if holders[key[0]][key[1]] != self.instance_id:
                share.releasing = True  # another live instance should hold it: handed over once its calls end
            else:
                kept.append(share)
        # Read when the group's membership changed, when a share may have moved, not at every look: a GET a
        # share every half heartbeat was most of an idle instance's requests; the conditional progress write and
        # the fence catch a share taken over in between. At once on object storage: one after another, a round
        # trip each, they held up every delivery.
        owners = read_all(lambda share: self._group.share_owner(share.source, share.number), kept if changed else [],
                          remote=self.lakehouse.files.remote)
        for share, owner in zip(kept, owners):
            if owner != self.instance_id:
                self._lose(share, "its claim names another instance")
        if self._fenced or self.instance_id not in live:
            return
        wanted = [(source, number) for source in self._logs for number in range(self._shares_per_topic)
                  if (source, number) not in self._shares
                  and holders[source][number] == self.instance_id]
        # At once on object storage: a dead instance's shares taken one after another, a few round trips each,
        # held up this loop (its heartbeat, its deliveries) for seconds at 25 ms a request.
        taken = read_all(lambda key: self._take(key[0], key[1], live), wanted, remote=self.lakehouse.files.remote)
        self._owed = not all(taken)

    def _survey(self, now: float) -> set[str]:
        """The group's live instances. Listed (a LIST, and a GET a record) while the membership settles, for
        :data:`_SETTLE_HEARTBEATS` heartbeats since this instance started or the live set last changed, and then
        every :data:`_SURVEY_HEARTBEATS` heartbeats, when an instance that joined is found; in between, the records
        of the instances known live are read again (a GET each), to find one dead as soon. A LIST every half
        heartbeat cost an idle instance more than its heartbeat: on S3 a LIST is priced as 12.5 GETs."""
        heartbeat_s = self.config.consumer_heartbeat_ms / 1000
        if (now - self._settled_from < _SETTLE_HEARTBEATS * heartbeat_s
                or now - self._surveyed_at >= _SURVEY_HEARTBEATS * heartbeat_s):
            self._surveyed_at = now
            live = {record.instance_id for record in self._group.instances.live(self.group)}
        else:
            others = sorted(self._live - {self.instance_id})
            alive = read_all(lambda other: self._group.instances.is_live(self.group, other), others,
                             remote=self.lakehouse.files.remote)
            live = {other for other, is_live in zip(others, alive) if is_live}
            if now - self._announced_at <= LIVE_FOR_HEARTBEATS * heartbeat_s:
                live.add(self.instance_id)
        if live != self._live:
            self._settled_from = now
        return live

    def _take(self, source: str, number: int, live: set[str]) -> bool:
        """Take share ``number`` of ``source``; whether it was not held by another live instance (taken, or
        refused for a reason logged here)."""
        claim = None
        try:
            claim = self._group.claim_share(source, number, self.instance_id, live)
            if claim is None:
                return False  # its holder is live and lets go once it sees it should
            self._unreleased.pop((source, number), None)
            progress, version = self._group.progress(source, number)
            if progress is None:
                progress = ShareProgress(self._group.start_version(source, lambda: self._start_version(source)))
        except CoordinatorError as error:
            _log.error("consumer %s cannot take share %d of %s: %s", self.instance_id, number, source,
                       one_line(error))
            if claim is not None:  # claimed, not taken: a claim kept would bar the instance hashing names next
                self._release(source, number, claim)
            return True
        share = _Share(source, number, self._logs[source], progress, version, self.clock())
        share.claim = claim
        with self._lock:
            self._shares[source, number] = share
        _log.info("consumer %s took share %d of %s at version %d", self.instance_id, number, source, progress.version)
        return True

    def _start_version(self, source: str) -> int:
        log, start = self._logs[source], self.config.consumer_start_from
        if source == REDRIVE_SOURCE or start == "earliest":
            return log.earliest()
        if start == "latest":
            return log.latest() + 1
        return log.first_at(int(parse_start_time(start).timestamp() * 1000))

    def _lose(self, share: _Share, why: str, release: bool = False) -> None:
        """Drop ``share`` without saving: another instance holds it now. With ``release`` (its progress was written
        by another instance, its claim may still name this one), release the claim if it is still this instance's
        own: else the claim would name a live instance that no longer handles the share, and the instance
        the shares' hashing names would never take it."""
        _log.warning("consumer %s lost share %d of %s: %s", self.instance_id, share.number, share.source, why)
        share.releasing = True  # its runs not started yet stop
        with self._lock:
            self._shares.pop((share.source, share.number), None)
        if release:
            self._release(share.source, share.number, share.claim)

    def _release(self, source: str, number: int, claim: str) -> None:
        """Release this instance's claim of share ``number`` of ``source``, at version ``claim``, if unchanged since;
        tried again at the next look if the storage fails."""
        try:
            self._group.release_share(source, number, self.instance_id, claim)
        except CoordinatorError as error:
            _log.warning("consumer %s could not release share %d of %s: %s", self.instance_id, number, source,
                         one_line(error))
            self._unreleased[source, number] = claim
            return
        self._unreleased.pop((source, number), None)

    def _give_up(self, share: _Share) -> None:
        """Save ``share``'s progress and release its claim (it has no call under way)."""
        if share.dirty and not self._save(share):
            return
        with self._lock:
            self._shares.pop((share.source, share.number), None)
        self._release(share.source, share.number, share.claim)

    def _read(self) -> None:
        self._probe_due = float("inf")
        latest, reading = {}, {}
        for share in self._shares.values():
            if not share.releasing and len(share.pending) < self.config.consumer_max_buffered:
                reading[share.source] = min(reading.get(share.source, share.next_read), share.next_read)
        for share in list(self._shares.values()):
            if share.releasing:
                continue
            try:
                if share.source not in latest:
                    latest[share.source] = self._latest(share.source)
                    first = reading.get(share.source)
                    if first is not None:
                        share.log.read_ahead(first, min(latest[share.source], first + 2 * _READ_AHEAD_VERSIONS - 1))
                # Not far past the furthest-behind share that has room to read: the shares of a topic drifted
                # apart (44 versions in 30 s, a 1,000,000-message topic) past the versions the log keeps, and each
                # version was read and converted again for each share that came to it late.
                ahead = reading.get(share.source, share.next_read) + _READ_AHEAD_VERSIONS - 1
                self._fill(share, min(latest[share.source], ahead))
                share.failure = None
            except CoordinatorError as error:
                if share.failure != one_line(error):
                    _log.error("consumer %s cannot read share %d of %s: %s", self.instance_id, share.number,
                               share.source, one_line(error))
                share.failure = one_line(error)

    def _latest(self, source: str) -> int:
        """How far ``source`` has grown: probed (a request) only once one of its shares has read all it knew of,
        and at most every :meth:`_probe_interval`: a busy loop steps often, and a probe each time would cost a
        request per step."""
        log, now = self._logs[source], time.monotonic()
        known = log.known
        caught_up = known is None or any(share.next_read > known for (name, _), share in self._shares.items()
                                         if name == source and not share.releasing)
        interval = self._probe_interval(source, now)
        if caught_up and now - self._probed_at.get(source, float("-inf")) >= interval:
            self._probed_at[source] = now
            latest = log.latest()
            if latest != known:
                self._grew_at[source] = now
                interval = self._probe_interval(source, now)
            self._probe_due = min(self._probe_due, now + interval)
            return latest
        if caught_up:
            self._probe_due = min(self._probe_due, self._probed_at[source] + interval)
        return known

    def _probe_interval(self, source: str, now: float) -> float:
        """On object storage, the poll interval while ``source`` grows and until it has been quiet for
        :data:`_FLOWING_POLLS` poll intervals; then a quarter of the time since it last grew (a message after a
        quiet spell waits at most a quarter longer), up to :data:`_IDLE_POLLS` poll intervals. On a local disk
        (a probe is no request) a :data:`_LOCAL_PROBES_PER_POLL`-th of the poll interval while flowing, then the
        poll interval;
        :data:`_ABSENT_POLLS` while the group's redrive table does not exist (until an operator first redrives; a
        topic that does not exist yet is probed as a quiet one: its first messages are not held up). Probing every
        poll interval was most of an idle consumer's requests (docs/performance.md)."""
        poll = self.config.consumer_poll_interval_ms / 1000
        if source == REDRIVE_SOURCE and self._logs[source].known == -1:
            return poll * _ABSENT_POLLS
        quiet = now - self._grew_at.get(source, now)
        if not self.lakehouse.files.remote:
            return poll / _LOCAL_PROBES_PER_POLL if quiet < poll * _FLOWING_POLLS else poll
        if quiet < poll * _FLOWING_POLLS:
            return poll
        return min(max(poll, quiet / 4), poll * _IDLE_POLLS)

    def _fill(self, share: _Share, latest: int) -> None:
        pending, floor, retries = share.pending, share.floor, share.unread_retries
        while len(pending) < self.config.consumer_max_buffered and share.next_read <= latest:
            version = share.next_read
            done = share.done.get(version, ())
            for row in share.log.share_rows(version, share.number, self._shares_per_topic, share_of):
                offset = row["queue_offset"]
                if offset < floor or offset in done:
                    continue
                message = _Pending(row, version, offset, row["keys"] or f"\0{row['msg_id']}")
                retry = retries.pop(offset, None) if retries else None
                if retry is not None:
                    message.attempts, message.due_ms = retry["attempts"], retry["due_ms"]
                    message.error, message.dead = retry["error"], retry.get("dead", False)
                pending[message] = None
            share.next_read += 1
            share.dirty = True

    def _dispatch(self) -> None:
        """Hand the workers, for each key whose earlier messages are all handled, its messages that are due, as
        one run (called in order, stopping at a failure): a hand-off per key, not per message. The shares' runs
        are queued in turn, beginning with the share after the last round's first: in the shares' own order, the
        runs of the shares held longest filled the queue, and shares taken over from a dead instance waited."""
        if self._fenced:
            return
        now_ms = int(self.clock() * 1000)
        shares = [share for share in self._shares.values() if not share.releasing and share.pending]
        if not shares:
            return
        start = self._dispatch_from % len(shares)
        self._dispatch_from = start + 1
        due = [(share, *self._due_runs(share, now_ms)) for share in shares[start:] + shares[:start]]
        for turn in zip_longest(*(runs for _, runs, _ in due)):
            for run in turn:
                if run is not None:
                    for pending in run.items:
                        pending.inflight = True
                    self._outstanding += 1
                    self._workers.submit(run)
        for share, _, dying in due:
            for pending in dying:
                if self._shares.get((share.source, share.number)) is not share:
                    break  # lost while an earlier dead letter was buried (its save refused): its holder delivers
                self._bury(share, pending)

    def _due_runs(self, share: _Share, now_ms: int) -> tuple[list[Run], list[_Pending]]:
        """``share``'s runs that may start (a key's due messages, in order, behind none of its earlier ones), and
        its messages out of attempts before a crash whose dead letters are still to write."""
        runs: dict[str, list[_Pending]] = {}
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

    def _call(self, share: _Share, pending: _Pending) -> Any:
        """On a worker's thread: the listener's call for ``pending``."""
        return self.listener.consume(_message(pending, share.source, pending.attempts + 1))

    def _runnable(self, run: Run) -> bool:
        """On a worker's thread, before each call: whether it may start (not closing, the share still held, this
        instance not fenced)."""
        return not (run.payload.releasing or self._stopping.is_set() or self._fenced)

    def _on_finished(self, run: Run) -> None:
        self._finished.append(run)
        # The loop wakes for a failure or a run handed back (to save or hand it again at once), and when the
        # workers are about to run dry, not for every run: a wake per message was the hand-off's cost.
        if len(run.outcomes) < len(run.items) or self._workers.queued < self.config.consumer_threads:
            self._wake.set()

    def _take_finished(self) -> None:
        finished = self._finished
        while finished:
            self._ended(finished.popleft())

    def _expire(self) -> None:
        for run in self._workers.abandon_overdue(self.config.consumer_timeout_ms / 1000):
            _log.warning("consumer %s abandoned a listener call past %d ms (thread %s)", self.instance_id,
                         self.config.consumer_timeout_ms, run.thread.name if run.thread else "?")
            self._ended(run)

    def _ended(self, run: Run) -> None:
        """A run reported back (or abandoned): settle each call it made, free what it did not start."""
        self._outstanding -= 1
        share = run.payload
        held = self._shares.get((share.source, share.number)) is share
        for pending, result, error in run.outcomes:
            pending.inflight = False
            if held:  # else lost meanwhile: its new holder delivers it again
                self._settle(share, pending, _failure(result, error))
        if run.abandoned:
            run.current.inflight = False
            if held:
                self._settle(share, run.current, f"the listener did not answer within consumer_timeout_ms "
                                                 f"({self.config.consumer_timeout_ms} ms)")
        for pending in run.unstarted():
            pending.inflight = False

    def _settle(self, share: _Share, pending: _Pending, error: Optional[str]) -> None:
        if error is None:
            share.handled(pending)
            return
        pending.attempts += 1
        pending.error = error
        _log.info("consumer %s: message %s of %s failed (attempt %d): %s", self.instance_id, pending.row["msg_id"],
                  share.source, pending.attempts, error)
        if pending.attempts >= self.config.consumer_max_attempts:
            pending.dead = True
        else:
            pending.due_ms = int(self.clock() * 1000) + retry_delay_ms(self.config.consumer_retry_delays_ms,
                                                                       pending.attempts)
        share.dirty = True
        if self._save(share) and pending.dead:
            self._bury(share, pending)

    def _bury(self, share: _Share, pending: _Pending) -> None:
        """Move ``pending``, out of attempts, to the group's dead letters; its key goes on."""
        number = share.dead_letters + 1
        try:
            self._dead_letter_appender().append(
                _dead_letter_row(pending, share, number, self.instance_id, self.clock()),
                app_transaction=(f"txcoord-consumer.{share.source}.{share.number}", number))
        except CoordinatorError as error:
            _log.error("consumer %s could not write a dead letter for %s: %s", self.instance_id,
                       pending.row["msg_id"], one_line(error))
            return
        _log.warning("consumer %s: message %s of %s is a dead letter after %d attempts: %s", self.instance_id,
                     pending.row["msg_id"], share.source, pending.attempts, pending.error)
        share.dead_letters = number
        share.handled(pending)
        self._save(share)

    def _dead_letter_appender(self):
        if self._dead_letters is None:
            from coordinator.appender import DeltaAppender
            from coordinator.lakehouse import create_table

            path = self.lakehouse.consumer_table(self.group, "dead_letters")
            create_table(DEAD_LETTERS, path, self.lakehouse.storage)
            self._dead_letters = DeltaAppender(path, storage=self.lakehouse.storage)
        return self._dead_letters

    def _save_due(self) -> None:
        now = self.clock()
        due = []
        for share in list(self._shares.values()):
            if share.releasing and not any(pending.inflight for pending in share.pending):
                self._give_up(share)
            elif share.dirty and now - share.saved_at >= self.config.consumer_commit_interval_ms / 1000:
                due.append(share)
        # Each share's own record, written at once on object storage (as the claims are read in _rebalance).
        read_all(self._save, due, remote=self.lakehouse.files.remote)

    def _save(self, share: _Share) -> bool:
        try:
            version = self._group.save_progress(share.source, share.number, share.progress(), share.file_version,
                                                self.instance_id)
        except CoordinatorError as error:
            _log.warning("consumer %s could not save share %d of %s: %s", self.instance_id, share.number,
                         share.source, one_line(error))
            return False
        if version is None:
            self._lose(share, "its progress was written by another instance", release=True)
            return False
        share.file_version, share.dirty, share.saved_at = version, False, self.clock()
        return True

    def _stop_delivering(self) -> None:
        with self._lock:
            self._shares.clear()


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


def _message(pending: _Pending, source: str, attempt: int) -> ConsumedMessage:
    row = pending.row
    # Every field set at once: the frozen dataclass's __init__ sets each through object.__setattr__, 6 µs a
    # message, the largest part of handing one to a listener that does nothing (docs/performance.md, consumers).
    message = object.__new__(ConsumedMessage)
    message.__dict__.update(topic=row["topic"], msg_id=row["msg_id"], transaction_id=row["transaction_id"],
                            keys=row["keys"], tags=row["tags"], properties=dict(row["properties"] or {}),
                            body=row["body"] or b"", queue_offset=pending.offset,
                            commit_timestamp=row["commit_timestamp"], delivery_attempt=attempt,
                            born_timestamp=row["born_timestamp"],
                            topic_version=-1 if source == REDRIVE_SOURCE else pending.version)
    return message


def _dead_letter_row(pending: _Pending, share: _Share, number: int, instance_id: str, now: float) -> pa.Table:
    row = {name: pending.row.get(name) for name, _ in DEAD_LETTERS.columns}
    if row["properties"] is not None:
        row["properties"] = list(row["properties"].items())
    row |= {"dead_letter_id": f"{share.source}.{share.number}.{number}",
            "topic_version": -1 if share.source == REDRIVE_SOURCE else pending.version, "share": share.number,
            "attempts": pending.attempts, "last_error": pending.error, "consumer_instance": instance_id,
            "dead_at": dt.datetime.fromtimestamp(now, dt.timezone.utc)}
    return pa.Table.from_pylist([row], schema=DEAD_LETTERS.arrow_schema())
