"""The Arrow allocator of the checker's processes: the C library's, not pyarrow's default (mimalloc).

Measured on a 2-core machine (2026-11-26), deciding the three batches of a 300,000-transaction backlog
in a fresh process, six runs each: the first batch took 1.66–2.05 s with mimalloc, of which 0.7–0.9 s
was system time (page faults: mimalloc commits its arenas eagerly; with ``MIMALLOC_ARENA_EAGER_COMMIT=0``
it did as well as the C library), and 1.23–1.64 s with the C library's allocator; the three batches
3.5–4.6 s against 3.3–4.0 s. Eight such rounds in one process kept its memory flat with either
(824–903 MB resident with mimalloc, 929–988 MB with the C library's). In the checker job, three drains
each way: the first batch 3.19–3.23 s against 3.28–3.68 s.
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
