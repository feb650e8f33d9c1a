"""The verdict every harness gives on deliveries: each expected message delivered once, nothing else.

The chaos harness checks it per message id against the producers' own databases; the soak, the drain and
the end-to-end benchmarks per transaction id against what their producer sent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Deliveries", "tally_deliveries"]


@dataclass(frozen=True)
class Deliveries:
    """``lost``: expected, never delivered; ``duplicated``: id → rows beyond its first; ``unexpected``:
    delivered, never expected (sorted lists, for reports)."""

    lost: list[str]
    duplicated: dict[str, int]
    unexpected: list[str]
    delivered: int  # distinct ids delivered

    @property
    def exactly_once(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected)

    def counts(self) -> dict[str, int]:
        """``lost``, ``duplicated`` (rows beyond the first of an id) and ``unexpected``, as a report counts them."""
        return {"lost": len(self.lost), "duplicated": sum(self.duplicated.values()), "unexpected": len(self.unexpected)}


def tally_deliveries(expected: Iterable[str], delivered_rows: Iterable[str]) -> Deliveries:
    """Compare the ids that had to be delivered with the id of every row delivered (an id twice: a duplicate).

    Example::

        tally_deliveries({"a", "b"}, ["a", "a", "c"]).counts()  # {'lost': 1, 'duplicated': 1, 'unexpected': 1}
    """
    expected, rows = set(expected), Counter(delivered_rows)
    return Deliveries(lost=sorted(expected - rows.keys()),
                      duplicated={key: count - 1 for key, count in sorted(rows.items()) if count > 1},
                      unexpected=sorted(rows.keys() - expected), delivered=len(rows))
