"""One active checker per lakehouse: a lease file with an expiry.

The checker holds ``system/_checker_lease.json`` while it runs and renews it every
``ttl_s / 3``. The lease lapses when its holder releases it, goes ``ttl_s`` without
renewing it (the holder died elsewhere, or stalled), or, seen from the holder's own host,
as soon as the holder's process is gone: a checker restarted after ``kill -9`` takes over
at once. A second checker either refuses to start while the lease is held or stands by
until it lapses. A holder that finds its lease taken over stops before writing anything else.
A checker standing by announces itself in ``system/_checker_standbys/`` (renewed like the lease,
removed when it takes over or gives up) so that operators see it: :func:`standby_checkers`.

Every write is conditional (:mod:`coordinator.storage`): the lease is created only if absent,
and taken over, renewed or released only if it is still the version that was read, so of two
checkers racing for it one wins, on a local disk or on object storage alike. Whether its
holder's process is gone is told by :mod:`coordinator.control.processes`; where that cannot be
told, only the expiry counts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Callable, Optional, Union

from coordinator.control.processes import process_gone, this_process
from coordinator.exceptions import CheckerAlreadyRunningError, LeaseLostError
from coordinator.lakehouse import LEASE_KEY, STANDBYS_KEY, Lakehouse
from coordinator.storage import Versioned

__all__ = ["CheckerLease", "lease_record", "standby_checkers"]


log = logging.getLogger("coordinator.checker")


class CheckerLease:
    """The right to run the checker on one lakehouse.

    Example::

        lease = CheckerLease("lakehouse").acquire()   # raises CheckerAlreadyRunningError if held
        lease.renew()                                  # raises LeaseLostError if taken over
        lease.release()
        CheckerLease("lakehouse").acquire(wait=True, stop=stop_requested)  # stands by while held
    """

    def __init__(self, lakehouse: Union[str, Lakehouse], ttl_s: float = 30.0, clock: Callable[[], float] = time.time):
        lakehouse = Lakehouse.at(lakehouse)
        self.path = lakehouse.lease_file
        self.files = lakehouse.files
        self.ttl_s = ttl_s
        #: Wall-clock seconds: every holder of a lakehouse's lease must share one clock.
        self.clock = clock
        self.owner = uuid.uuid4().hex
        #: The ``renewed_at`` of the record this holder last wrote and saw land (``None``: it holds no lease).
        self.renewed_at: Optional[float] = None

    def acquire(self, wait: bool = False, stop: Optional[threading.Event] = None,
                prepare: Optional[Callable[[], None]] = None) -> "CheckerLease":
        """Take the lease. While it is held, raise :class:`CheckerAlreadyRunningError` naming its
        holder, or with ``wait`` stand by and take it the moment it lapses.

        A standby logs its holder once, announces itself, calls ``prepare()`` (if given) once, then
        polls every ``min(1 s, ttl_s / 10)``; ``prepare`` must return promptly (start what it prepares
        in the background). Setting ``stop`` ends the wait with :class:`CheckerAlreadyRunningError`.
        """
        stop = stop or threading.Event()
        standing_by = False
        announced_at = None
        try:
            while (holder := self._take()) is not None:
                age = self.clock() - holder["renewed_at"]
                held = self._held_by(holder)
                if not wait:
                    raise self._refusal(holder)
                if not standing_by:
                    log.warning("%s; standing by to take over once it is released, its process is gone or it goes "
                                "%.0f s without renewal (in %.0f s if it renews no more)",
                                held, holder["ttl_s"], max(0.0, holder["ttl_s"] - age))
                    standing_by = True
                if announced_at is None or self.clock() - announced_at >= self.ttl_s / 3:
                    announced_at = self.clock()
                    self.files.put(self._standby_key, _encode(self._record()))
                if prepare is not None:
                    prepare()
                    prepare = None
                if stop.wait(min(1.0, self.ttl_s / 10)):
                    raise CheckerAlreadyRunningError(f"stopped while standing by: {held}")
        finally:
            if announced_at is not None:
                self.files.delete(self._standby_key)
        if standing_by:
            log.info("took over the checker lease %s", self.path)
        return self

    @property
    def _standby_key(self) -> str:
        return f"{STANDBYS_KEY}/{self.owner}.json"

    def ensure_free(self) -> None:
        """Raise :class:`CheckerAlreadyRunningError` if a live checker holds the lease now; take nothing.

        For a start that would not stand by anyway: it can refuse before starting Spark.
        """
        holder = self._live_holder()
        if holder is not None:
            raise self._refusal(holder)

    def is_free(self) -> bool:
        """Whether no live checker holds the lease now (it may be taken the next moment); takes nothing.

        Example::

            if CheckerLease("lakehouse").is_free():
                ...  # prepare what only the holder needs
        """
        return self._live_holder() is None

    def _live_holder(self) -> Optional[dict]:
        """The lease's record if a live checker holds it now, else ``None``."""
        holder = lease_record(self.files.read(LEASE_KEY))
        return holder if self._live(holder) else None

    def renew(self) -> None:
        """Extend the lease; raise :class:`LeaseLostError` if another checker has taken it."""
        record = self._record()
        if not self._rewrite(record):
            self.renewed_at = None
            raise LeaseLostError(f"the checker lease {self.path} was taken over; this checker must stop")
        self.renewed_at = record["renewed_at"]

    def hold(self, for_s: float) -> None:
        """Make sure the lease stays this holder's for ``for_s`` seconds more at least: renew it unless the
        renewal this holder last saw land already gives that (then no request is made); raise
        :class:`LeaseLostError` as :meth:`renew` does.

        Nobody else can have taken over a lease renewed less than ``ttl_s`` ago: it lapses only when
        released (by its holder), at ``renewed_at + ttl_s``, or when its holder's process is gone. So a
        recent renewal proves the holding as well as a new one would, without a round trip to the storage.

        Example::

            lease.hold(lease.ttl_s * 2 / 3)   # renews only if the last renewal is over a third of the TTL old
        """
        if self.renewed_at is None or self.clock() + for_s >= self.renewed_at + self.ttl_s:
            self.renew()

    def release(self) -> None:
        """Give the lease up, if still ours: it is left marked released, and the next checker takes it at once."""
        self.renewed_at = None
        self._rewrite(self._record() | {"released": True})

    def _rewrite(self, record: dict) -> bool:
        """Replace the lease with ``record`` if it is ours and unchanged since read; whether it was."""
        current = self.files.read(LEASE_KEY)
        holder = lease_record(current)
        if holder is None or holder["owner"] != self.owner:
            return False
        return self.files.replace(LEASE_KEY, _encode(record), current.version) is not None

    def _take(self) -> Optional[dict]:
        """Create the lease, or take a lapsed one over: ``None`` once it is ours, else its live holder's record."""
        while True:
            current, record = self.files.read(LEASE_KEY), self._record()
            if current is None:
                if self.files.create(LEASE_KEY, _encode(record)) is not None:
                    self.renewed_at = record["renewed_at"]
                    return None
                continue  # another checker created it first: look at theirs
            holder = lease_record(current)
            if self._live(holder):
                return holder
            if self.files.replace(LEASE_KEY, _encode(record), current.version) is not None:
                self.renewed_at = record["renewed_at"]
                return None
            # another checker changed it since we read it: look again

    def _live(self, holder: Optional[dict]) -> bool:
        """Whether ``holder`` (a lease record) still holds: not released, renewed within its TTL, its
        process not gone."""
        return (holder is not None and not holder.get("released") and self.clock() < holder["renewed_at"] + holder["ttl_s"]
                and not process_gone(holder))

    def _held_by(self, holder: dict) -> str:
        return (f"another checker holds {self.path} (host {holder['host']}, pid {holder['pid']}, "
                f"renewed {self.clock() - holder['renewed_at']:.0f} s ago)")

    def _refusal(self, holder: dict) -> CheckerAlreadyRunningError:
        return CheckerAlreadyRunningError(
            f"{self._held_by(holder)}; it is taken over once released or {holder['ttl_s']:.0f} s without renewal")

    def _record(self) -> dict:
        return {"owner": self.owner, **this_process(), "renewed_at": self.clock(), "ttl_s": self.ttl_s}


def lease_record(current: Optional[Versioned]) -> Optional[dict]:
    """The lease record in a lease file's content, or ``None`` if there is none or it is unreadable
    (a lease file that cannot be read counts as lapsed, and is taken over)."""
    if current is None:
        return None
    try:
        record = json.loads(current.data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and {"owner", "renewed_at", "ttl_s", "host", "pid"} <= set(record) else None


def standby_checkers(lakehouse: Union[str, Lakehouse], clock: Callable[[], float] = time.time) -> list[dict]:
    """The checkers standing by for ``lakehouse``'s lease now (records as the lease's: host, pid,
    renewed_at, ttl_s...), oldest first: those renewed within their TTL whose process is not gone.

    Example::

        [f"{c['host']} pid {c['pid']}" for c in standby_checkers("lakehouse")]  # ['node-2 pid 5151']
    """
    files = Lakehouse.at(lakehouse).files
    records = (lease_record(files.read(key)) for key in files.list(f"{STANDBYS_KEY}/"))
    live = [r for r in records if r is not None and clock() < r["renewed_at"] + r["ttl_s"] and not process_gone(r)]
    return sorted(live, key=lambda r: r["renewed_at"])


def _encode(record: dict) -> bytes:
    return json.dumps(record).encode()
