"""An instance's membership in its consumer group: its record, which instances are live, the claims of the shares
it holds, and the *fence* that keeps it from starting a call in a share it may have lost.

**Liveness.** The instance renews its record every heartbeat (:mod:`.instances`), on a thread of its own
(:meth:`Membership.start`): a long step of the consumer's loop (a version read and converted, slow requests on a
loaded machine) must not make its renewal late; the others take it for dead once the record is
:data:`~coordinator.consumer.instances.LIVE_FOR_HEARTBEATS` heartbeats old, and may then replace its claims. So it
holds its shares, proven, only while its last renewal is recent.

**The fence.** ``proven_at`` is the clock when the instance last proved it holds its shares: the start of a
renewal that landed within :data:`FENCE_HEARTBEATS` heartbeats of the previous proof (its record never looked
stale), or of a renewal followed by reading its claims back. Past :data:`FENCE_HEARTBEATS` heartbeats from it,
the instance is *fenced*: it starts no call (a worker asks before each one) until it proves its hold again. An
instance whose renewal failed, or came late (it was paused: a GC pause, a frozen VM, a throttled pod), renews,
waits :data:`DECIDE_WITHIN_HEARTBEATS` of a heartbeat (another instance replaces a claim only within that of
reading the record that made it look dead: :meth:`~coordinator.consumer.group.ConsumerGroup.claim_share`), then
reads back the claim of every share it holds and drops each one another instance claimed since, unsaved. What
may overlap a successor's calls is only a call already running when the pause began (its bound:
``consumer_timeout_ms``). The margin between the fence (1.5 heartbeats) and death (2) absorbs the skew between
the instances' clocks and the scheduling delay between a worker's check and its call.

Example::

    membership = Membership(ConsumerGroup(lakehouse, "credits"), "9c1e…", config, time.time)
    membership.renew()              # the first renewal, whose errors the caller sees
    membership.start()              # then every heartbeat, on its own thread
    membership.fenced               # False: renewed just now
    live = membership.survey()      # {'9c1e…', …}
    membership.stop()
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable, Optional

from coordinator.config import CoordinatorConfig
from coordinator.consumer.group import ConsumerGroup, share_owners
from coordinator.consumer.instances import LIVE_FOR_HEARTBEATS
from coordinator.exceptions import CoordinatorError, one_line
from coordinator.storage import read_all

__all__ = ["DECIDE_WITHIN_HEARTBEATS", "FENCE_HEARTBEATS", "Membership"]

_log = logging.getLogger("coordinator.consumer")

#: An instance that has not proved its hold on its shares for this many heartbeats starts no call.
FENCE_HEARTBEATS = 1.5
#: Another instance replaces a claim only within this many heartbeats of reading the record of the instance the
#: claim names; an instance back from a pause waits this long after renewing before reading its claims back.
DECIDE_WITHIN_HEARTBEATS = 0.25
#: The group's instances are listed every look for this many heartbeats after a change, then every
#: _SURVEY_HEARTBEATS (:meth:`Membership.survey`).
_SETTLE_HEARTBEATS = 2
_SURVEY_HEARTBEATS = 5


class Membership:
    """Instance ``instance_id`` of ``group`` (see the module's docstring). Used by the consumer's loop thread, but
    its renewals (its heartbeat thread) and :attr:`fenced` (which workers read before each call)."""

    def __init__(self, group: ConsumerGroup, instance_id: str, config: CoordinatorConfig, clock: Callable[[], float],
                 remote: bool):
        self.group, self.instance_id, self.clock, self.remote = group, instance_id, clock, remote
        self.heartbeat_s = config.consumer_heartbeat_ms / 1000
        self._poll_s = config.consumer_poll_interval_ms / 1000
        self._lock = threading.Lock()  # the proof's state, between the heartbeat thread and the loop's
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: An error the storage will not get over, met renewing the record: the consumer stops with it.
        self.failure: Optional[CoordinatorError] = None
        self.rounds = 0  # rounds of the heartbeat thread: a test moving the clock waits for the next ones
        self._retry_at = float("-inf")  # after a failed renewal, when the next is tried
        self.renewed_at = float("-inf")  # when the last renewal that landed began
        self.proven_at = float("-inf")
        #: When the instance renewed after a gap in its proof: its claims are read back from
        #: ``suspect_since + DECIDE_WITHIN_HEARTBEATS`` heartbeats on; ``None`` while its proof holds.
        self.suspect_since: Optional[float] = None
        self.live: set[str] = set()  # the group's live instances, as the last look found them
        self._settled_from = self._surveyed_at = float("-inf")
        #: Claims of shares this instance dropped, still to release: a claim left naming a live instance would
        #: stall its share (the instance the hashing names never replaces it).
        self.unreleased: dict[tuple[str, int], str] = {}

    @property
    def fenced(self) -> bool:
        """Whether the instance may have lost its shares: it starts no call while this holds."""
        return self.suspect_since is not None or self.clock() - self.proven_at > FENCE_HEARTBEATS * self.heartbeat_s

    def start(self) -> None:
        """Renew the record every heartbeat from now on, on a thread of its own, until :meth:`stop`: it looks at
        the clock every poll interval (no request), and renews when a heartbeat has passed since the last
        renewal (after a failed one, a tenth of a heartbeat later)."""
        self._thread = threading.Thread(target=self._beat, name=f"consumer-{self.group.group}-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (before the record is withdrawn, or as kill -9 leaves it)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stopped.wait(self._poll_s):
            now = self.clock()
            if now - self.renewed_at >= self.heartbeat_s and now >= self._retry_at:
                try:
                    if not self.renew():
                        self._retry_at = now + self.heartbeat_s / 10
                except CoordinatorError as error:
                    self.failure = error
                    return
            self.rounds += 1

    def renew(self) -> bool:
        """Renew the instance's record. The proof of its hold moves on if the renewal landed before the previous
        proof ran out; else the instance is suspect until :meth:`prove` reads its claims back. An error the
        storage may get over is logged (whether it was renewed); one it will not is raised."""
        began = self.clock()
        try:
            self.group.instances.announce(self.group.group, self.instance_id, self.heartbeat_s)
        except CoordinatorError as error:
            if not error.retriable:
                raise  # its own record refused (a revoked grant): nothing this instance does can go on
            _log.warning("consumer %s could not renew its record: %s", self.instance_id, one_line(error))
            return False
        with self._lock:
            self.renewed_at = began
            if self.suspect_since is None and self.clock() - self.proven_at <= FENCE_HEARTBEATS * self.heartbeat_s:
                self.proven_at = began
            elif self.suspect_since is None or began > self.suspect_since:
                if self.suspect_since is None and self.proven_at > float("-inf"):
                    _log.warning("consumer %s went %.1f s without proving its hold on its shares (paused, or its "
                                 "storage failing): it starts no call until it has read its claims back",
                                 self.instance_id, began - self.proven_at)
                self.suspect_since = began
        return True

    def prove_due(self, holding: bool) -> bool:
        """Whether the instance is suspect and may read its claims back now (at once when ``holding`` none: there
        is nothing to read back)."""
        return self.suspect_since is not None and (
            not holding or self.clock() - self.suspect_since >= DECIDE_WITHIN_HEARTBEATS * self.heartbeat_s)

    def prove(self, held: list[tuple[str, int, Optional[str]]]) -> Optional[list[bool]]:
        """Read back the claim of each of the ``held`` shares (source, number, claim version); for each, whether
        this instance still holds it. The hold is proven from the renewal that made the instance suspect, if
        that renewal is recent enough; ``None`` (try again later) if a claim could not be read or it is not."""
        began = self.suspect_since
        try:
            holds = read_all(lambda item: self.group.holds(item[0], item[1], self.instance_id, item[2]), held,
                             remote=self.remote)
        except CoordinatorError as error:
            _log.warning("consumer %s could not read its claims back: %s", self.instance_id, one_line(error))
            return None
        with self._lock:
            if self.suspect_since != began:
                return None  # renewed late again meanwhile: read back from that renewal
            if self.clock() - began > FENCE_HEARTBEATS * self.heartbeat_s:
                self.suspect_since = None  # took too long: renewed again, then proven from that renewal
                self.proven_at = float("-inf")
                return None
            self.suspect_since, self.proven_at = None, began
        return holds

    def survey(self) -> set[str]:
        """The group's live instances. Listed (a LIST, and a GET a record) while the membership settles, for
        :data:`_SETTLE_HEARTBEATS` heartbeats since this instance started or the live set last changed, and then
        every :data:`_SURVEY_HEARTBEATS` heartbeats, when an instance that joined is found; in between, the records
        of the instances known live are read again (a GET each), to find one dead as soon. A LIST every half
        heartbeat cost an idle instance more than its heartbeat: on S3 a LIST is priced as 12.5 GETs."""
        now = self.clock()
        if (now - self._settled_from < _SETTLE_HEARTBEATS * self.heartbeat_s
                or now - self._surveyed_at >= _SURVEY_HEARTBEATS * self.heartbeat_s):
            self._surveyed_at = now
            live = {record.instance_id for record in self.group.instances.live(self.group.group)}
        else:
            others = sorted(self.live - {self.instance_id})
            alive = read_all(lambda other: self.group.instances.is_live(self.group.group, other), others,
                             remote=self.remote)
            live = {other for other, is_live in zip(others, alive) if is_live}
            if now - self.renewed_at <= LIVE_FOR_HEARTBEATS * self.heartbeat_s:
                live.add(self.instance_id)
        if live != self.live:
            self._settled_from = now
        self.live = live
        return live

    def holders(self, sources: Iterable[str], shares: int) -> dict[str, list[Optional[str]]]:
        """Which live instance should hold each share of each source, by the last :meth:`survey`."""
        return {source: share_owners(self.group.group, source, shares, self.live) for source in sources}

    def claim(self, source: str, number: int) -> Optional[str]:
        """Claim share ``number`` of ``source`` (see :meth:`ConsumerGroup.claim_share`); the claim's version, or
        ``None`` while another live instance holds it. Storage errors are raised."""
        claim = self.group.claim_share(source, number, self.instance_id, self.live,
                                       decide_within_s=DECIDE_WITHIN_HEARTBEATS * self.heartbeat_s)
        if claim is not None:
            self.unreleased.pop((source, number), None)
        return claim

    def owners(self, held: list[tuple[str, int]]) -> list[Optional[str]]:
        """The instance each of the ``held`` shares' claim names now."""
        return read_all(lambda key: self.group.share_owner(*key), held, remote=self.remote)

    def release(self, source: str, number: int, claim: Optional[str]) -> None:
        """Release this instance's claim of share ``number`` of ``source``, at version ``claim``, if unchanged
        since; tried again at the next look if the storage fails."""
        if claim is None:
            return
        try:
            self.group.release_share(source, number, self.instance_id, claim)
        except CoordinatorError as error:
            _log.warning("consumer %s could not release share %d of %s: %s", self.instance_id, number, source,
                         one_line(error))
            self.unreleased[source, number] = claim
            return
        self.unreleased.pop((source, number), None)

    def release_left_over(self) -> None:
        """Release again the claims a failing storage kept this instance from releasing."""
        for (source, number), claim in list(self.unreleased.items()):
            self.release(source, number, claim)

    def withdraw(self) -> None:
        try:
            self.group.instances.withdraw(self.group.group, self.instance_id)
        except CoordinatorError as error:
            _log.warning("consumer %s could not withdraw its record: %s", self.instance_id, one_line(error))
