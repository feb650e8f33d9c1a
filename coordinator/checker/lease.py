"""One active checker per lakehouse: a lease file with an expiry.

The checker holds ``system/_checker_lease.json`` while it runs and renews it every
``ttl_s / 3``. A second checker refuses to start while the lease is fresh, and takes it
over once its holder has stopped renewing it for ``ttl_s`` (the holder died). A holder
that finds its lease taken over stops before writing anything else.

The lease relies on atomic exclusive create and rename, which local and POSIX
filesystems provide.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Optional

from coordinator.exceptions import CheckerAlreadyRunningError, LeaseLostError

LEASE_FILE = "_checker_lease.json"


class CheckerLease:
    """The right to run the checker on one lakehouse.

    Example::

        lease = CheckerLease("lakehouse").acquire()   # raises CheckerAlreadyRunningError if held
        lease.renew()                                  # raises LeaseLostError if taken over
        lease.release()
    """

    def __init__(self, lakehouse: str, ttl_s: float = 30.0):
        self.path = os.path.join(os.path.abspath(lakehouse), "system", LEASE_FILE)
        self.ttl_s = ttl_s
        self.owner = uuid.uuid4().hex

    def acquire(self) -> "CheckerLease":
        """Take the lease, or raise :class:`CheckerAlreadyRunningError` naming its live holder."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read(self.path)
                if holder is not None and time.time() < holder["renewed_at"] + holder["ttl_s"]:
                    age = time.time() - holder["renewed_at"]
                    raise CheckerAlreadyRunningError(
                        f"another checker holds {self.path} (host {holder['host']}, pid {holder['pid']}, renewed "
                        f"{age:.0f} s ago); it is taken over only once it goes {holder['ttl_s']:.0f} s without renewal"
                    ) from None
                self._evict(holder)
                continue
            with os.fdopen(fd, "w") as file:
                json.dump(self._record(), file)
            return self

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

    def _record(self) -> dict:
        return {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                "renewed_at": time.time(), "ttl_s": self.ttl_s}

    def _evict(self, stale: Optional[dict]) -> None:
        """Move an expired (or unreadable) lease aside, unless it changed since we read it."""
        aside = f"{self.path}.stale-{uuid.uuid4().hex}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # someone else evicted it first
        moved = self._read(aside)
        if stale is not None and moved is not None and moved["owner"] != stale["owner"]:
            # A fresh lease was created between our read and the rename: give it back.
            os.rename(aside, self.path)
            raise CheckerAlreadyRunningError(f"another checker just took {self.path}")
        os.remove(aside)

    @staticmethod
    def _read(path: str) -> Optional[dict]:
        try:
            with open(path) as file:
                record = json.load(file)
            return record if {"owner", "renewed_at", "ttl_s", "host", "pid"} <= set(record) else None
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError, TypeError):
            return None
