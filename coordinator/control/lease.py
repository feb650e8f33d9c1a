"""One active checker per lakehouse: a lease file with an expiry.

The checker holds ``system/_checker_lease.json`` while it runs and renews it every
``ttl_s / 3``. The lease lapses when its holder releases it, goes ``ttl_s`` without
renewing it (the holder died elsewhere, or stalled), or, seen from the holder's own host,
as soon as the holder's process is gone: a checker restarted after ``kill -9`` takes over
at once. A second checker either refuses to start while the lease is held or stands by
until it lapses. A holder that finds its lease taken over stops before writing anything else.

The lease relies on atomic exclusive create and rename, which local and POSIX
filesystems provide. Whether its holder's process is gone is told by
:mod:`coordinator.control.processes`; where that cannot be told, only the expiry counts.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from typing import Callable, Optional

from coordinator.control.processes import process_gone, this_process
from coordinator.exceptions import CheckerAlreadyRunningError, LeaseLostError
from coordinator.lakehouse import Lakehouse


log = logging.getLogger("coordinator.checker")


class CheckerLease:
    """The right to run the checker on one lakehouse.

    Example::

        lease = CheckerLease("lakehouse").acquire()   # raises CheckerAlreadyRunningError if held
        lease.renew()                                  # raises LeaseLostError if taken over
        lease.release()
        CheckerLease("lakehouse").acquire(wait=True, stop=stop_requested)  # stands by while held
    """

    def __init__(self, lakehouse: str, ttl_s: float = 30.0, clock: Callable[[], float] = time.time):
        self.path = Lakehouse(lakehouse).lease_file
        self.ttl_s = ttl_s
        #: Wall-clock seconds: every holder of a lakehouse's lease must share one clock.
        self.clock = clock
        self.owner = uuid.uuid4().hex

    def acquire(self, wait: bool = False, stop: Optional[threading.Event] = None) -> "CheckerLease":
        """Take the lease. While it is held, raise :class:`CheckerAlreadyRunningError` naming its
        holder, or with ``wait`` stand by and take it the moment it lapses.

        A standby logs its holder once, then polls every ``min(1 s, ttl_s / 10)``. Setting
        ``stop`` ends the wait with :class:`CheckerAlreadyRunningError`.
        """
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        stop = stop or threading.Event()
        standing_by = False
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
            if stop.wait(min(1.0, self.ttl_s / 10)):
                raise CheckerAlreadyRunningError(f"stopped while standing by: {held}")
        if standing_by:
            log.info("took over the checker lease %s", self.path)
        return self

    def ensure_free(self) -> None:
        """Raise :class:`CheckerAlreadyRunningError` if a live checker holds the lease now; take nothing.

        For a start that would not stand by anyway: it can refuse before starting Spark.
        """
        holder = self._read(self.path)
        if self._live(holder):
            raise self._refusal(holder)

    def renew(self) -> None:
        """Extend the lease; raise :class:`LeaseLostError` if another checker has taken it."""
        holder = self._read(self.path)
        if holder is None or holder["owner"] != self.owner:
            raise LeaseLostError(f"the checker lease {self.path} was taken over; this checker must stop")
        staging = f"{self.path}.{self.owner}"
        with open(staging, "w") as file:
            json.dump(self._record(), file)
        os.replace(staging, self.path)

    def release(self) -> None:
        """Give the lease up, if still ours."""
        holder = self._read(self.path)
        if holder is not None and holder["owner"] == self.owner:
            os.remove(self.path)

    def _take(self) -> Optional[dict]:
        """Create the lease, evicting a lapsed one: ``None`` once it is ours, else its live holder's record."""
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read(self.path)
                if self._live(holder):
                    return holder
                self._evict(holder)
                continue
            with os.fdopen(fd, "w") as file:
                json.dump(self._record(), file)
            return None

    def _live(self, holder: Optional[dict]) -> bool:
        """Whether ``holder`` (a lease record) still holds: renewed within its TTL, its process not gone."""
        return holder is not None and self.clock() < holder["renewed_at"] + holder["ttl_s"] and not process_gone(holder)

    def _held_by(self, holder: dict) -> str:
        return (f"another checker holds {self.path} (host {holder['host']}, pid {holder['pid']}, "
                f"renewed {self.clock() - holder['renewed_at']:.0f} s ago)")

    def _refusal(self, holder: dict) -> CheckerAlreadyRunningError:
        return CheckerAlreadyRunningError(
            f"{self._held_by(holder)}; it is taken over once released or {holder['ttl_s']:.0f} s without renewal")

    def _record(self) -> dict:
        return {"owner": self.owner, **this_process(), "renewed_at": self.clock(), "ttl_s": self.ttl_s}

    def _evict(self, stale: Optional[dict]) -> None:
        """Move a lapsed (or unreadable) lease aside, unless it changed since we read it."""
        aside = f"{self.path}.stale-{uuid.uuid4().hex}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # someone else evicted it first
        moved = self._read(aside)
        if stale is not None and moved is not None and moved["owner"] != stale["owner"]:
            # A fresh lease was created between our read and the rename: give it back, and read it again.
            os.rename(aside, self.path)
            return
        os.remove(aside)

    @staticmethod
    def _read(path: str) -> Optional[dict]:
        try:
            with open(path) as file:
                record = json.load(file)
            return record if {"owner", "renewed_at", "ttl_s", "host", "pid"} <= set(record) else None
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError, TypeError):
            return None
