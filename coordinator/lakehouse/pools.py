"""pyarrow's thread pools at the process's exit: waited for before the interpreter finalizes.

A pyarrow scan through a filesystem written in Python (delta-rs's default: ``DeltaTable.to_pyarrow_table()``,
``to_pyarrow_dataset()`` without a filesystem) returns while pyarrow's pool threads are still tearing it down,
and that teardown drops buffers and files Python owns, each under the GIL. One that takes the GIL once the
interpreter has begun to finalize is ended by CPython in the middle of a C++ destructor, and the process
aborts (``terminate called without an active exception``, exit 134). Exit callbacks run before that point,
so one that waits until both pools are idle lets the teardown finish first.

Example::

    wait_for_arrow_pools_at_exit()  # once a process uses the producer or a consumer: their start() calls it
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import threading
from typing import Callable, Optional

__all__ = ["wait_for_arrow_pools_at_exit"]

_log = logging.getLogger("coordinator.lakehouse.pools")
_lock = threading.Lock()
_registered = False

# Arrow's C++ API has no Python binding for these: pyarrow's own extension module is linked against
# libarrow, so the symbols are found through it, whatever the library's file is called on this platform.
_CPU_POOL = "_ZN5arrow8internal16GetCpuThreadPoolEv"  # arrow::internal::GetCpuThreadPool()
_IO_POOL = "_ZN5arrow2io8internal15GetIOThreadPoolEv"  # arrow::io::internal::GetIOThreadPool()
_WAIT_FOR_IDLE = "_ZN5arrow8internal10ThreadPool11WaitForIdleEv"  # arrow::internal::ThreadPool::WaitForIdle()
_NUM_TASKS = "_ZN5arrow8internal10ThreadPool11GetNumTasksEv"  # arrow::internal::ThreadPool::GetNumTasks()


def wait_for_arrow_pools_at_exit() -> bool:
    """Have this process wait, as it exits, until pyarrow's CPU and I/O pools have no task queued or
    running; whether that is arranged (once per process; ``False`` where pyarrow's library does not
    export the pools' functions). Its exit callback runs after the threads Python waits for have ended.

    Example::

        wait_for_arrow_pools_at_exit()  # True
    """
    global _registered
    with _lock:
        if not _registered:
            wait = _pools_waiter()
            if wait is None:
                return False
            atexit.register(wait)
            _registered = True
    return True


def _pools_waiter() -> Optional[Callable[[], None]]:
    """A function that returns once pyarrow's pools are both idle (``None`` if they cannot be reached).
    ctypes releases the GIL for each call, so the pools' tasks can take it meanwhile."""
    import pyarrow.lib

    try:
        library = ctypes.CDLL(pyarrow.lib.__file__)
        pools = [library[_CPU_POOL], library[_IO_POOL]]
        wait_for_idle, num_tasks = library[_WAIT_FOR_IDLE], library[_NUM_TASKS]
    except (OSError, AttributeError) as error:
        _log.debug("pyarrow's pools cannot be waited for at exit: %s", error)
        return None
    for pool in pools:
        pool.restype, pool.argtypes = ctypes.c_void_p, []
    wait_for_idle.restype, wait_for_idle.argtypes = None, [ctypes.c_void_p]
    num_tasks.restype, num_tasks.argtypes = ctypes.c_int, [ctypes.c_void_p]

    def wait() -> None:
        pointers = [pool() for pool in pools]
        # A task finishing on one pool may queue its continuation on the other.
        while any(num_tasks(pointer) for pointer in pointers):
            for pointer in pointers:
                wait_for_idle(pointer)
    return wait
