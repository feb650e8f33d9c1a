"""The two statistics every benchmark report and measuring test quotes."""

from __future__ import annotations

import statistics
from typing import Optional

__all__ = ["median", "percentile"]


def percentile(values: list[float], q: float) -> Optional[float]:
    """The ``q`` quantile by nearest rank (``None`` for no values).

    Example::

        percentile([1, 2, 3, 4], 0.5)  # 3
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> Optional[float]:
    """The median (``None`` for no values).

    Example::

        median([3, 1, 2, 4])  # 2.5
    """
    return statistics.median(values) if values else None
