"""An instance's membership in its consumer group: its record, which instances are live, the claims of the shares
it holds, and the *fence* that keeps it from starting a call in a share it may have lost.

**Liveness.** The instance renews its record every heartbeat (:mod:`.instances`), on a thread of its own
(:meth:`Membership.start`): a long step of the consumer's loop (a version read and converted, slow requests on a
loaded machine) must not make its renewal late; the others take it for dead once the record is
:data:`~coordinator.consumer.instances.LIVE_FOR_HEARTBEATS` heartbeats old, and may then replace its claims. So it
holds its shares, proven, only while its last renewal is recent.

**Who is live, at O(1) a look.** At each look an instance reads the group's membership changes and the record
of its successor (the next live instance by id), and applies the changes made since its last look: reads the
record of an instance that joined, drops one that left or was found dead. It records its own joining and
leaving, and its successor found dead. It reads every record only when it missed more changes than are kept,
and lists the records every :data:`_SURVEY_HEARTBEATS` heartbeats, reading those written since by instances it
does not know (:meth:`~coordinator.consumer.instances.ConsumerInstances.joined`). A dead instance is found by the
one before it within half a heartbeat of its record going stale, and by the others at their next look after that.

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
    membership.join()               # the others read its record at their next look
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
from coordinator.consumer.instances import LIVE_FOR_HEARTBEATS, membership_changes
from coordinator.exceptions import CoordinatorError, one_line
from coordinator.storage import Versioned, read_all

__all__ = ["DECIDE_WITHIN_HEARTBEATS", "FENCE_HEARTBEATS", "Membership"]

_log = logging.getLogger("coordinator.consumer")

#: An instance that has not proved its hold on its shares for this many heartbeats starts no call.
FENCE_HEARTBEATS = 1.5
#: Another instance replaces a claim only within this many heartbeats of reading the record of the instance the
#: claim names; an instance back from a pause waits this long after renewing before reading its claims back.
DECIDE_WITHIN_HEARTBEATS = 0.25
#: The group's records are listed at least this often, whatever its membership changes say (:meth:`Membership.survey`).
_SURVEY_HEARTBEATS = 20


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
        self._listed: dict[str, int] = {}  # the group's records at the last listing, each with its time then
        self._surveyed_at = float("-inf")
        self._changes: Optional[bytes] = None  # the group's membership changes as this instance last read them
        self._applied: Optional[str] = None  # the id of the last of them applied to ``live``
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
            gap = False
            if self.suspect_since is None and self.clock() - self.proven_at <= FENCE_HEARTBEATS * self.heartbeat_s:
                self.proven_at = began
            elif self.suspect_since is None or began > self.suspect_since:
                if self.suspect_since is None and self.proven_at > float("-inf"):
                    _log.warning("consumer %s went %.1f s without proving its hold on its shares (paused, or its "
                                 "storage failing): it starts no call until it has read its claims back",
                                 self.instance_id, began - self.proven_at)
                    gap = True
                self.suspect_since = began
        if gap:  # the others may have taken it for dead: it joins again, as they then see
            self._rejoin()
        return True

    def _rejoin(self) -> None:
        """Record that this instance is back (after a gap, or taken for dead): the others read its record again."""
        try:
            self.group.instances.record_change(self.group.group, "joined", self.instance_id)
        except CoordinatorError as error:
            _log.warning("consumer %s could not tell its group it is back: %s", self.instance_id, one_line(error))

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
        """The group's live instances, at a cost that does not grow with the group: its membership changes (a
        GET) and the record of this instance's successor among the live ones, by id (a GET). The changes since
        the last look are applied: an instance that joined is read (a GET), one that left or was found dead is
        dropped; one that missed changes no longer kept reads every record (a LIST, and a GET each). A successor
        found dead is recorded as such, for the others. Every :data:`_SURVEY_HEARTBEATS` heartbeats the records
        are listed, and those written since by instances not known live are read (a change another overwrote).
        Every instance reading every other's record at every look cost a group of N instances N² requests a
        look, and reading every record at each change cost it N² requests at once."""
        now = self.clock()
        instances, group = self.group.instances, self.group.group
        written = instances.changes(group)
        live = set(self.live)
        if (None if written is None else written.data) != self._changes:
            live = self._apply(written, live)
        if now - self._surveyed_at >= _SURVEY_HEARTBEATS * self.heartbeat_s:
            self._surveyed_at = now
            joined, self._listed = instances.joined(group, live, self._listed)
            live |= joined
        else:
            successor = self._successor(live)
            if successor is not None and not instances.is_live(group, successor):
                instances.record_change(group, "dead", successor)  # applied at the next look, after any before it
                live.discard(successor)
        live.discard(self.instance_id)
        if now - self.renewed_at <= LIVE_FOR_HEARTBEATS * self.heartbeat_s:
            live.add(self.instance_id)
        self.live = live
        return live

    def _apply(self, written: Optional[Versioned], live: set[str]) -> set[str]:
        """``live`` after the changes ``written`` holds since the last one applied (each instance's last change
        decides: one whose last is joining is read, at once on object storage); every record read when that one
        is no longer kept (or never was)."""
        changes = membership_changes(written)
        ids = [change_id for change_id, _, _ in changes]
        self._changes = None if written is None else written.data
        if self._applied not in ids:
            self._applied = ids[-1] if ids else None
            self._surveyed_at = self.clock()
            live, self._listed = self.group.instances.joined(self.group.group, (), {})
            return live
        last = {instance_id: kind for _, kind, instance_id in changes[ids.index(self._applied) + 1:]}
        self._applied = ids[-1]
        if last.pop(self.instance_id, None) == "dead":  # taken for dead (a pause): the others drop it until it
            self._rejoin()                               # says it is back
        joined = [instance_id for instance_id, kind in last.items() if kind == "joined"]
        alive = read_all(lambda instance_id: self.group.instances.is_live(self.group.group, instance_id), joined,
                         remote=self.remote)
        return (live - set(last)) | {instance_id for instance_id, is_live in zip(joined, alive) if is_live}

    def _successor(self, live: set[str]) -> Optional[str]:
        """The live instance after this one by id (the first after the last): the one whose record it watches."""
        others = sorted(live - {self.instance_id})
        return next((other for other in others if other > self.instance_id), others[0] if others else None)

    def join(self) -> None:
        """Record that this instance joined (after its first renewal): the others read its record at their next
        look. Its own first look reads every record."""
        # What came before it, the first look's listing finds.
        self._applied = self.group.instances.record_change(self.group.group, "joined", self.instance_id)

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
            self.group.instances.record_change(self.group.group, "left", self.instance_id)
        except CoordinatorError as error:
            _log.warning("consumer %s could not withdraw its record: %s", self.instance_id, one_line(error))
