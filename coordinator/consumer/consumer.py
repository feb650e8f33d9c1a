"""The topic consumer: a consumer group's instance, handing each committed message to a listener.

Each topic is split into a fixed number of *shares* (the group's grant says how many) by a stable hash of a
message's ``keys`` (of its ``msg_id`` when it has none): the messages of one key are always in one share. The
consumer is made of three parts, each run by its loop thread:

* :class:`~coordinator.consumer.membership.Membership`: the instance's record, the group's live instances, the
  claims of its shares, and the fence that keeps it from starting a call in a share it may have lost;
* :class:`~coordinator.consumer.share.Share`: each share's reading, in the topic's order, and its progress record,
  and :class:`~coordinator.consumer.reading.Reading`, when to look for new versions of each source;
* :class:`~coordinator.consumer.dispatch.Dispatcher`: the listener calls, retries and dead letters.

Every half heartbeat the instance works out which shares it should hold (rendezvous hashing with bounded loads
over the live instances: :func:`~coordinator.consumer.group.share_owners`), takes them with a claim written
conditionally, and gives up those another live instance should hold once its calls under way in them end.

Each share's progress is saved, conditionally, at most every ``consumer_commit_interval_ms`` while messages
succeed, at once after a failure, and when the share is given up or the consumer closes: a crash delivers again
what was handled since the last save, never skips.

An error the storage may get over (``retriable``) is logged and the step tried again; one it will not (a record
that is not one, a refusal) stops the share it concerns, which :meth:`TopicConsumer.health` shows, the rest going
on; an error of the consumer's own stops the instance (:attr:`TopicConsumer.failure`).

Example::

    with TopicConsumer("credits", ["ORDER_TOPIC"], Credits(), config) as consumer:
        ...   # consuming in the background until the block exits
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from coordinator.config import CoordinatorConfig, parse_start_time
from coordinator.consumer.dispatch import Dispatcher, retry_delay_ms
from coordinator.consumer.group import REDRIVE_SOURCE, ConsumerGroup
from coordinator.consumer.listener import MessageListener
from coordinator.consumer.membership import Membership
from coordinator.consumer.reading import Reading
from coordinator.consumer.share import Share
from coordinator.consumer.topic_log import TopicLog
from coordinator.consumer.workers import Run
from coordinator.exceptions import (ConsumerStateError, CoordinatorError, InvalidArgumentError, PositionGoneError,
                                    one_line)
from coordinator.lakehouse import Lakehouse
from coordinator.lakehouse.pools import wait_for_arrow_pools_at_exit
from coordinator.lakehouse.row_counts import RowCounts
from coordinator.names import validate_name
from coordinator.storage import read_all

__all__ = ["ConsumerHealth", "TopicConsumer", "retry_delay_ms"]

_log = logging.getLogger("coordinator.consumer")

#: An instance owed shares that a live instance still holds (it lets go once its look finds this one) looks
#: again after this many poll intervals, not half a heartbeat.
_OWED_LOOK_POLLS = 2


@dataclass(frozen=True)
class ConsumerHealth:
    """How a consumer instance is doing (:meth:`TopicConsumer.health`): ``state`` (``created``, ``running``,
    ``stopped``: an error stopped it, ``closed``), that error, the shares it holds, the shares stopped by an error
    it does not retry (``"topic/share"`` -> the error, naming the way out), and whether it is fenced (it may have
    lost its shares and starts no call until it has read its claims back)."""

    state: str
    failure: Optional[str]
    shares: list[tuple[str, int]]
    stopped_shares: dict[str, str] = field(default_factory=dict)
    fenced: bool = False

    @property
    def ok(self) -> bool:
        """Running, with no share stopped."""
        return self.state == "running" and not self.stopped_shares


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
            consumer.close(timeout=25)
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
        self._remote = self.lakehouse.files.remote
        self._membership = Membership(self._group, self.instance_id, config, clock, self._remote)
        self._state = "created"
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._halted = False
        self._close_by: Optional[float] = None  # time.monotonic() by which close() gives up waiting
        self._shares: dict[tuple[str, int], Share] = {}
        #: Shares this instance cannot take, by an error it does not retry (a progress record that is not one).
        self._refused: dict[tuple[str, int], str] = {}
        self._reading = Reading(config, self._remote, self._position_gone)
        self._logs = self._reading.logs  # each source's TopicLog, by name
        self._row_counts: dict[str, RowCounts] = {}  # for the group's start record only (its lag's origin)
        self._finished: deque[Run] = deque()  # appended by worker threads, taken by the loop
        self._rebalanced_at = float("-inf")
        self._owed = False  # the last look found shares this instance should hold that a live one still held
        self._thread: Optional[threading.Thread] = None
        self._dispatcher: Optional[Dispatcher] = None
        self._metrics = None
        self._shares_per_topic = 0
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
            if self._state in ("closed", "stopped"):
                raise ConsumerStateError(f"consumer of group {self.group!r} was closed; create a new one")
            grant = self._group.require_grant(self.topics)
            self._shares_per_topic = grant.shares
            for source in (*self.topics, REDRIVE_SOURCE):
                key = (f"topics/{source}" if source != REDRIVE_SOURCE
                       else f"{self.lakehouse.consumer_dir(self.group)}/redrive")
                self._reading.add(source, TopicLog(self.lakehouse.files, key, self.lakehouse.storage))
                self._row_counts[source] = RowCounts(self.lakehouse.files, key)
            if self.config.consumer_metrics_port is not None:
                from coordinator.consumer.metrics import serve_consumer_metrics

                self._metrics = serve_consumer_metrics(self, self.config)
            wait_for_arrow_pools_at_exit()  # the process's own pyarrow reads end before it does
            self._membership.renew()  # its errors are start()'s
            self._membership.join()
            self._membership.start()
            self._dispatcher = Dispatcher(self._group, self.instance_id, self.listener, self.config, self.clock,
                                          self._runnable, self._on_finished, self._save, self._holds,
                                          self._metrics.counts(self.group) if self._metrics else None)
            self._thread = threading.Thread(target=self._run, name=f"consumer-{self.group}", daemon=True)
            self._state = "running"
            self._thread.start()
        _log.info("consumer started group=%s instance=%s topics=%s shares=%d", self.group, self.instance_id,
                  ",".join(self.topics), self._shares_per_topic)
        return self

    def close(self, timeout: Optional[float] = None) -> None:
        """Stop starting calls, let those under way finish, save every share's progress, give up the shares,
        withdraw this instance and join the threads. Idempotent. Raises the error that stopped the consumer, if
        one did.

        ``timeout`` (seconds, real time): wait at most this long in all, as a pod's grace period allows. The calls
        still running then are left to finish on their own (daemon threads): their messages are saved as not
        handled, so whoever takes the share delivers them again. ``None``: each call within
        ``consumer_timeout_ms``.

        Example::

            consumer.close(timeout=25)
        """
        with self._lock:
            state = self._state
            self._state = "closing" if state in ("running", "stopped") else "closed"
        if state not in ("running", "stopped"):
            return
        if timeout is not None:
            self._close_by = time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        self._thread.join()  # its drain waits for the calls until _close_by, then saves and gives up the shares
        self._dispatcher.close(None if self._close_by is None else max(0.0, self._close_by - time.monotonic()))
        if self._metrics is not None:
            self._metrics.forget(self)
        with self._lock:
            self._state = "closed"
        _log.info("consumer closed group=%s instance=%s", self.group, self.instance_id)
        self._raise_failure()

    def _raise_failure(self) -> None:
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

    def health(self) -> ConsumerHealth:
        """How this instance is doing: what a readiness probe or an alert reads (see :class:`ConsumerHealth`).

        Example::

            health = consumer.health()
            if not health.ok:
                print(health.state, health.failure, health.stopped_shares)
        """
        with self._lock:
            shares = dict(self._shares)
            state = self._state
        stopped = {f"{source}/{number}": one_line(share.stopped) for (source, number), share in shares.items()
                   if share.stopped is not None}
        stopped |= {f"{source}/{number}": reason for (source, number), reason in self._refused.items()}
        return ConsumerHealth(state, None if self.failure is None else one_line(self.failure), sorted(shares),
                              stopped, self._membership.fenced)

    def lag(self) -> dict[str, int]:
        """Messages of each topic this instance's shares have not handled yet, as far as it has looked: those
        read and not handled, and those of the versions it knows of and has not read (each version's count from
        its commit's statistics, split evenly over the shares). What the consumer's lag metric shows.

        Example::

            consumer.lag()  # {'ORDER_TOPIC': 120}
        """
        with self._lock:
            shares = list(self._shares.values())
        lag: dict[str, float] = {}
        for share in shares:
            log = share.log
            known = -1 if log.known is None else log.known
            unread = sum(log.known_count(version) for version in range(share.next_read, known + 1))
            lag[share.source] = (lag.get(share.source, 0) + len(share.pending) + sum(map(len, share.reread.values()))
                                 + unread / self._shares_per_topic)
        return {source: round(count) for source, count in lag.items()}

    def read_totals(self) -> dict[str, tuple[int, int]]:
        """Bytes and rows of each topic's data files this instance has read so far: of a topic the checker wrote by
        slot, about its shares' part (what the consumer's read metrics show).

        Example::

            consumer.read_totals()  # {'ORDER_TOPIC': (1048576, 1000)}
        """
        return {source: (log.bytes_read, log.rows_read) for source, log in self._reading.logs.items()}

    def _halt(self) -> None:
        """Stop at once, saving nothing and withdrawing nothing: what ``kill -9`` leaves behind (for tests)."""
        self._halted = True
        self._membership.stop()
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
                self._wake.wait(min(poll, max(0.0, self._reading.probe_due - time.monotonic())))
                self._wake.clear()
            if not self._halted:
                self._drain()
        except BaseException as error:  # whatever stops the loop stops this consumer, said once, loudly
            self.failure = error
            _log.error("consumer of group %s stopped: %s", self.group, one_line(error), exc_info=error)
            with self._lock:
                self._shares.clear()
                if self._state == "running":
                    self._state = "stopped"
            self._membership.stop()  # no longer live: its claims free for the others at once
            self._membership.withdraw()

    def _step(self) -> None:
        membership = self._membership
        heartbeat_s = membership.heartbeat_s
        if membership.failure is not None:
            raise membership.failure
        if membership.prove_due(holding=bool(self._shares)):
            self._prove()
        look_s = heartbeat_s / 2
        if self._owed:
            look_s = min(look_s, _OWED_LOOK_POLLS * self.config.consumer_poll_interval_ms / 1000)
        if self.clock() - self._rebalanced_at >= look_s:
            self._rebalance()
        self._take_finished()
        self._expire()
        self._reading.read([share for share in self._shares.values() if not share.releasing])
        if not membership.fenced:  # the shares again: reading may have lost one (a save refused after a gone version)
            self._dispatcher.dispatch([share for share in self._shares.values() if not share.releasing])
        self._save_due()
        self._steps += 1

    def _drain(self) -> None:
        """Closing: the calls under way finish (or time out, or close()'s timeout passes), then every share is
        saved and given up."""
        for share in self._shares.values():
            share.releasing = True
        dispatcher = self._dispatcher
        while dispatcher.outstanding and (self._close_by is None or time.monotonic() < self._close_by):
            self._take_finished()
            self._expire()
            self._wake.wait(self.config.consumer_poll_interval_ms / 1000)
            self._wake.clear()
        self._take_finished()
        for share in list(self._shares.values()):
            self._give_up(share)
        self._membership.stop()
        self._membership.withdraw()

    def _prove(self) -> None:
        """Back from a gap in its proof (a pause, a failing storage): keep the shares whose claims still name this
        instance as it wrote them, drop the others unsaved (another instance holds them now)."""
        held = [share for share in self._shares.values()]
        holds = self._membership.prove([(share.source, share.number, share.claim) for share in held])
        if holds is None:
            return
        for share, still in zip(held, holds):
            if not still:
                self._lose(share, "another instance claimed it while this one could not prove its hold")

    def _rebalance(self) -> None:
        self._rebalanced_at = self.clock()
        membership = self._membership
        before = membership.live
        try:
            live = membership.survey()
        except CoordinatorError as error:
            _log.warning("consumer %s could not survey its group: %s", self.instance_id, one_line(error))
            return
        membership.release_left_over()
        holders = membership.holders(self._logs, self._shares_per_topic)
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
        # the fence catch a share taken over in between.
        if live != before:
            for share, owner in zip(kept, membership.owners([(share.source, share.number) for share in kept])):
                if owner != self.instance_id:
                    self._lose(share, "its claim names another instance")
        if membership.fenced or self.instance_id not in live:
            return
        wanted = [(source, number) for source in self._logs for number in range(self._shares_per_topic)
                  if (source, number) not in self._shares and (source, number) not in self._refused
                  and holders[source][number] == self.instance_id]
        # At once on object storage: a dead instance's shares taken one after another, a few round trips each,
        # held up this loop (its heartbeat, its deliveries) for seconds at 25 ms a request.
        taken = read_all(lambda key: self._take(*key), wanted, remote=self._remote)
        self._owed = not all(taken)

    def _take(self, source: str, number: int) -> bool:
        """Take share ``number`` of ``source``; whether it was not held by another live instance (taken, or
        refused for a reason logged here)."""
        claim = None
        try:
            claim = self._membership.claim(source, number)
            if claim is None:
                return False  # its holder is live and lets go once it sees it should
            progress, version = self._group.progress(source, number)
            if progress is None:
                progress = self._group.start(source, lambda: self._start_version(source),
                                             lambda version: self._rows_before(source, version))
                if progress.version == 0:
                    progress.topic_rows_before = 0
        except CoordinatorError as error:
            _log.error("consumer %s cannot take share %d of %s: %s", self.instance_id, number, source,
                       one_line(error))
            if not error.retriable:
                self._refused[source, number] = one_line(error)
            if claim is not None:  # claimed, not taken: a claim kept would bar the instance hashing names next
                self._membership.release(source, number, claim)
            return True
        share = Share(source, number, self._shares_per_topic, self._logs[source], progress, version, self.clock())
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

    def _rows_before(self, source: str, version: int) -> Optional[int]:
        """How many messages ``source`` holds before ``version``, from its log's statistics, for the group's start
        record: what its lag is counted from (``txcoord consumer-groups describe``); ``None`` if they cannot be
        counted (each describe then counts them itself)."""
        try:  # counted once: the shares taken at once wait for the first, then find its counts kept
            return self._row_counts[source].before(version)
        except CoordinatorError as error:
            _log.warning("consumer %s: the messages of %s before version %d cannot be counted: %s", self.instance_id,
                         source, version, one_line(error))
            return None

    def _holds(self, share: Share) -> bool:
        return self._shares.get((share.source, share.number)) is share

    def _lose(self, share: Share, why: str, release: bool = False) -> None:
        """Drop ``share`` without saving: another instance holds it now. With ``release`` (its progress was written
        by another instance, its claim may still name this one), release the claim if it is still this instance's
        own: else the claim would name a live instance that no longer handles the share, and the instance
        the shares' hashing names would never take it."""
        _log.warning("consumer %s lost share %d of %s: %s", self.instance_id, share.number, share.source, why)
        share.releasing = True  # its runs not started yet stop
        with self._lock:
            self._shares.pop((share.source, share.number), None)
        if release:
            self._membership.release(share.source, share.number, share.claim)

    def _give_up(self, share: Share) -> None:
        """Save ``share``'s progress and release its claim."""
        if share.dirty and not self._save(share):
            return
        with self._lock:
            self._shares.pop((share.source, share.number), None)
        self._membership.release(share.source, share.number, share.claim)

    def _position_gone(self, share: Share, error: PositionGoneError, latest: Optional[int]) -> None:
        policy = self.config.consumer_position_gone
        outcome = share.position_gone(error, policy, share.log.latest() if latest is None else latest, self.clock())
        level = logging.ERROR if share.stopped is not None else logging.WARNING
        _log.log(level, "consumer %s: share %d of %s: %s; consumer_position_gone = %r: %s", self.instance_id,
                 share.number, share.source, one_line(error), policy, outcome)
        if self._metrics is not None:
            self._metrics.position_gone(self.group, share.source)
        if share.stopped is None:
            self._save(share)

    # Calls and saves.

    def _runnable(self, run: Run) -> bool:
        """On a worker's thread, before each call: whether it may start (not closing, the share still held and
        not stopped, this instance not fenced)."""
        share = run.payload
        return not (share.releasing or share.stopped is not None or self._stopping.is_set()
                    or self._membership.fenced)

    def _on_finished(self, run: Run) -> None:
        self._finished.append(run)
        # The loop wakes for a failure or a run handed back (to save or hand it again at once), and when the
        # workers are about to run dry, not for every run: a wake per message was the hand-off's cost.
        if len(run.outcomes) < len(run.items) or self._dispatcher.workers.queued < self.config.consumer_threads:
            self._wake.set()

    def _take_finished(self) -> None:
        finished = self._finished
        while finished:
            self._dispatcher.ended(finished.popleft())

    def _expire(self) -> None:
        for run in self._dispatcher.expire():
            _log.warning("consumer %s abandoned a listener call past %d ms (thread %s)", self.instance_id,
                         self.config.consumer_timeout_ms, run.thread.name if run.thread else "?")
            self._dispatcher.ended(run)

    def _save_due(self) -> None:
        now = self.clock()
        due = []
        for share in list(self._shares.values()):
            if share.releasing and not any(pending.inflight for pending in share.pending):
                self._give_up(share)
            elif share.dirty and now - share.saved_at >= self.config.consumer_commit_interval_ms / 1000:
                due.append(share)
        # Each share's own record, written at once on object storage.
        read_all(self._save, due, remote=self._remote)

    def _save(self, share: Share) -> bool:
        try:
            version = self._group.save_progress(share.source, share.number, share.progress(), share.file_version,
                                                self.instance_id)
        except CoordinatorError as error:
            _log.warning("consumer %s could not save share %d of %s: %s", self.instance_id, share.number,
                         share.source, one_line(error))
            if not error.retriable:
                share.stopped = error  # its record refused for good: nothing more is started in it
            return False
        if version is None:
            self._lose(share, "its progress was written by another instance", release=True)
            return False
        share.file_version, share.dirty, share.saved_at = version, False, self.clock()
        return True
