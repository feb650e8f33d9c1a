"""Telling whether a process that recorded itself on the lakehouse (a checker holding the lease, a
producer instance) still runs, when it ran on this host.

A process is told apart by its host name, pid namespace, pid and start time (from ``/proc``),
so a reused pid does not pass for it. Where that cannot be told (another host, another pid
namespace, no ``/proc``), callers fall back on time: a lease's expiry, an instance's heartbeats.
Hosts that share a lakehouse must have distinct host names.
"""

from __future__ import annotations

import os
import socket
from typing import Optional

__all__ = ["process_gone", "this_process"]


def this_process() -> dict:
    """What identifies this process, to be recorded beside what it holds.

    Example::

        this_process()  # {'host': 'node-1', 'pid': 4242, 'pid_namespace': 'pid:[4026531836]', 'started': '81234'}
    """
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_namespace": _pid_namespace(), "started": _process_start(pid)}


def process_gone(holder: dict) -> bool:
    """Whether a record (a lease, a producer instance) names a process of this host that no longer runs.

    ``False`` when that cannot be told: the holder is on another host or in another pid
    namespace, this host has no ``/proc``, or the lease predates the ``started`` field.
    A pid that now belongs to another process, or to a zombie (killed, not yet reaped),
    counts as gone.

    Example::

        process_gone(json.load(open("lakehouse/system/_checker_lease.json")))  # True after kill -9 of its checker
    """
    if (holder.get("started") is None or holder.get("host") != socket.gethostname()
            or holder.get("pid_namespace") != _pid_namespace()):
        return False
    return _process_start(holder["pid"]) != holder["started"]


def _pid_namespace() -> Optional[str]:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_start(pid: int) -> Optional[str]:
    """Process ``pid``'s start (clock ticks after boot), or ``None``: not running, or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            stat = file.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "(name)", which may hold spaces and parentheses
    return None if fields[0] in ("Z", "X") else fields[19]  # fields 3 (state) and 22 (starttime) of proc(5)
