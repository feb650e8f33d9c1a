"""Doorbells: on object storage the checker probes the commit logs of busy groups every trigger, and
those of quiet groups only when they ring.

On object storage every probe of a log is a request, so probing every log every trigger makes a
checker's requests grow with the groups, busy or not. A group whose logs grew within the last
:data:`QUIET_AFTER_S` is *awake*: its logs are probed every trigger. A group quiet for longer
*sleeps*: its logs are probed when its doorbell changes, and about every :data:`RECHECK_S` anyway
(for a writer that does not ring: an older producer, a ring lost in a crash). A group's doorbell is
one small object beside its directory, ``groups/<group>.bell``, which its writers replace after a
commit that follows a quiet spell of their own (:class:`Doorbell`). The checker lists ``groups/``
anyway, to find new groups, and the listing gives each doorbell's ETag: a sleeping group costs no
request. Why no record waits: docs/design.md#doorbells.

Spark asks the source for new commits every ``trigger_interval_ms`` (100); the listing of ``groups/``
and the probe of the operators' log (no group: no doorbell) are made at most every :data:`LIST_EVERY_S`
of those polls, the busy groups' probes at each: an idle checker's polls cost no request between two
listings, and a ring or a new group is seen within that much more.

A doorbell's bytes are the group's: the checker never reads them, only whether they changed.
A group that rings all the time is probed every trigger, as a busy one is. On a local disk a probe
costs no request: every log is probed every trigger, and nobody rings.

Example::

    watch = GroupWatch()
    awake = watch.start_round(["order_group", "billing"], {"billing": '"6f1c…"'})  # both, the first time
    watch.end_round({"order_group": True, "billing": False})
    Doorbell(Lakehouse("s3://lake/lh").files, "billing").landed()   # after a commit of billing's
"""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from typing import Callable, Iterable, Mapping, Optional

from coordinator.exceptions import AccessDeniedError
from coordinator.lakehouse import GROUPS_KEY, group_key, group_of_key
from coordinator.storage import FileStore, Listing

__all__ = ["LIST_EVERY_S", "QUIET_AFTER_S", "RECHECK_S", "Doorbell", "GroupWatch", "doorbell_key", "group_of_doorbell"]

_log = logging.getLogger("coordinator.doorbells")

#: A group whose logs did not grow for this long sleeps; a writer rings after half of it without a commit.
QUIET_AFTER_S = 10.0
#: A sleeping group's logs are probed about this often even if it never rings (each group at a period of its
#: own between 0.75 and 1.25 times this, so the groups' rechecks spread over the triggers).
RECHECK_S = 60.0
#: ``groups/`` is listed, and the logs of no group probed, at most this often.
LIST_EVERY_S = 0.5
_SUFFIX = ".bell"


def doorbell_key(group: str) -> str:
    """Where group ``group``'s doorbell is, relative to the lakehouse's root.

    Example::

        doorbell_key("order_group")  # 'groups/order_group.bell'
    """
    return f"{GROUPS_KEY}/{group_key(group)}{_SUFFIX}"


def group_of_doorbell(name: str) -> Optional[str]:
    """The group whose doorbell a file named ``name`` right under ``groups/`` is; ``None`` for any other name
    (a group's directory name never holds a ``.``: :func:`~coordinator.lakehouse.group_key`).

    Example::

        group_of_doorbell("order_group.bell")  # 'order_group'
    """
    stem = name.removesuffix(_SUFFIX)
    if stem == name or not stem or "." in stem or group_key(group_of_key(stem)) != stem:
        return None
    return group_of_key(stem)


class Doorbell:
    """A writer's side: call :meth:`landed` after each of its commits landed; it rings after the first and
    after each commit whose previous one landed over half of :data:`QUIET_AFTER_S` before (by ``clock``), so
    that a sleeping group never holds a commit the checker has not been told of. A ring that fails is
    retried after the next commit; one the storage refuses (grants from before doorbells) is given up,
    with a warning: the checker still finds the group's commits within :data:`RECHECK_S`.

    Example::

        bell = Doorbell(lakehouse.files, "order_group")
        bell.landed()  # rings: the first commit
    """

    def __init__(self, files: FileStore, group: str, clock: Callable[[], float] = time.monotonic):
        self._files = files
        self._key = doorbell_key(group)
        self._clock = clock
        self._last_landed: Optional[float] = None
        self._refused = False

    def landed(self) -> None:
        """A commit of this writer's landed just now: ring if it follows a quiet spell."""
        now = self._clock()
        quiet = self._last_landed is None or now - self._last_landed > QUIET_AFTER_S / 2
        self._last_landed = now
        if quiet and not self._refused:
            self._ring()

    def _ring(self) -> None:
        try:
            self._files.put(self._key, uuid.uuid4().hex.encode())
        except AccessDeniedError as error:
            self._refused = True
            _log.warning("the storage refuses this group's doorbell (%s): grant it (`txcoord grants`); until then the "
                         "checker finds this group's commits after a quiet spell within %g s, not at once",
                         error, RECHECK_S)
        except Exception as error:  # the ring is an optimisation: the commit has landed whatever happens here
            self._last_landed = None
            _log.warning("could not ring the doorbell %s (again after the next commit): %s", self._key, error)


class GroupWatch:
    """The checker's side: which groups' logs a trigger probes. Each trigger is a round:
    :meth:`start_round` with the groups and doorbells listed, probes of the groups it returns, then
    :meth:`end_round` with which of them grew.

    A group is probed while awake (new, or grown within :data:`QUIET_AFTER_S` of its last growth seen);
    it falls asleep after a round that started that long after its last growth and found nothing, and is
    probed again when its doorbell's tag differs from the one last seen, or its recheck is due.

    Example::

        watch = GroupWatch()
        probe = watch.start_round(groups, bells)
        watch.end_round({group: grew(group) for group in probe})
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._listing: Optional[tuple[float, Listing]] = None  # when it was made, and what it found
        #: Whether the last :meth:`listing` listed: the logs of no group are probed in such rounds only.
        self.listed = False
        self._grown_seen_at: dict[str, float] = {}  # when a round that found it grown ended
        self._probed_at: dict[str, float] = {}  # when the last round that probed it started
        self._asleep: set[str] = set()
        self._bells: dict[str, Optional[str]] = {}
        self._round: tuple[float, frozenset[str]] = (0.0, frozenset())

    def listing(self, list_groups: Callable[[], Listing]) -> Listing:
        """``groups/``'s listing: a new one (``list_groups()``) if the last is :data:`LIST_EVERY_S` old, else the last.

        Example::

            watch.listing(lambda: files.listing("groups"))
        """
        now = self._clock()
        self.listed = self._listing is None or now - self._listing[0] >= LIST_EVERY_S
        if self.listed:
            self._listing = (now, list_groups())
        return self._listing[1]

    @property
    def probing(self) -> frozenset[str]:
        """The groups the current round probes."""
        return self._round[1]

    def start_round(self, groups: Iterable[str], bells: Mapping[str, str]) -> frozenset[str]:
        """The groups of ``groups`` to probe now, given each group's doorbell tag in ``bells`` (missing: no bell)."""
        now = self._clock()
        probe = set()
        for group in groups:
            bell = bells.get(group)
            if group not in self._probed_at:
                self._grown_seen_at[group] = now  # a group first seen is awake: its logs may hold anything
            if (group not in self._asleep or bell != self._bells.get(group)
                    or now - self._probed_at[group] >= _recheck_period(group)):
                probe.add(group)
                self._bells[group] = bell
        self._round = (now, frozenset(probe))
        return self._round[1]

    def end_round(self, grown: Mapping[str, bool]) -> None:
        """The round's probes are done: ``grown[group]`` says whether any log of a probed group grew."""
        started, probed = self._round
        ended = self._clock()
        for group in probed:
            self._probed_at[group] = started
            if grown.get(group, False):
                self._grown_seen_at[group] = ended
                self._asleep.discard(group)
            elif started >= self._grown_seen_at[group] + QUIET_AFTER_S:
                self._asleep.add(group)
        self._round = (started, frozenset())

    def asleep(self) -> frozenset[str]:
        """The groups asleep now."""
        return frozenset(self._asleep)


def _recheck_period(group: str) -> float:
    return RECHECK_S * (0.75 + 0.5 * (zlib.crc32(group.encode()) % 1000) / 1000)
