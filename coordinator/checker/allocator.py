"""The Arrow allocator of the checker's processes: the C library's, not pyarrow's default (mimalloc).

mimalloc commits its arenas eagerly, so the first batch of a drain pays for its memory in page faults;
the C library's allocator does not, and keeps a long run's memory as flat. The figures are in
docs/performance-log.md#figures-quoted-elsewhere-before.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["use_system_allocator"]


def use_system_allocator() -> None:
    """Make the C library's allocator this process's default Arrow memory pool (see the module's docstring).

    Example::

        use_system_allocator()   # first thing in a process that decides or reads commit logs
        pa.default_memory_pool().backend_name   # 'system'
    """
    pa.set_memory_pool(pa.system_memory_pool())
