"""What the checker really did, read from its tables with txcoord's own readers (delta-rs, no Spark): the
topic tables, ``system/op``, ``system/half``, ``system/rejected``, the check requests and the instance records.

Example::

    seen = Observed(lakehouse)
    seen.outcome(transaction_id)          # {'outcome': 'COMMIT', 'check_id': None, ...} once decided
    seen.delivered("T", transaction_id)   # the rows of topics/T of that transaction
"""

from __future__ import annotations

from typing import Optional

import pyarrow.compute as pc

from coordinator.control.instances import ProducerInstance, ProducerInstances
from coordinator.lakehouse import Lakehouse, read_table
from coordinator.tables import CHECK_REQUESTS, HALF, OP, REJECTED

__all__ = ["Observed"]


class Observed:
    """The checker's tables of one lakehouse, read anew at each call."""

    def __init__(self, lakehouse: Lakehouse):
        self.lakehouse = lakehouse

    def _rows(self, path: str, column: Optional[str] = None, value: Optional[str] = None) -> list[dict]:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(path, storage_options=self.lakehouse.storage or None):
            return []
        where = None if column is None else pc.field(column) == value
        return read_table(path, filter=where, storage=self.lakehouse.storage).to_pylist()

    def delivered(self, topic: str, transaction_id: str) -> list[dict]:
        """The rows of ``topics/<topic>`` the transaction delivered."""
        return self._rows(self.lakehouse.topic(topic), "transaction_id", transaction_id)

    def outcome(self, transaction_id: str) -> Optional[dict]:
        """The transaction's first row in ``system/op`` (its decision), ``None`` while it is undecided."""
        rows = self._rows(self.lakehouse.path(OP), "transaction_id", transaction_id)
        return min(rows, key=lambda row: row["resolved_at"]) if rows else None

    def halves(self, group: str) -> list[dict]:
        """The halves the checker accepted from ``group`` (``system/half``)."""
        return self._rows(self.lakehouse.path(HALF), "producer_group", group)

    def log_records(self, group: str) -> list[dict]:
        """The records of ``group``'s first commit log, as stored (none if it does not exist)."""
        return self._rows(self.lakehouse.commit_log(group))

    def rejected(self, transaction_id: Optional[str] = None) -> list[dict]:
        """``system/rejected``: every row, or those naming ``transaction_id``."""
        column = None if transaction_id is None else "transaction_id"
        return self._rows(self.lakehouse.path(REJECTED), column, transaction_id)

    def rejected_from(self, group: str) -> list[dict]:
        """The refusals of records stored under ``groups/<group>/`` (whatever group they name)."""
        prefix = self.lakehouse.group_dir(group) + "/"
        return [row for row in self.rejected() if (row["commit_log"] or "").startswith(prefix)]

    def check_requests(self, transaction_id: str) -> list[dict]:
        """The checks the checker sent for the transaction (its own record, ``system/check_requests``)."""
        return sorted(self._rows(self.lakehouse.path(CHECK_REQUESTS), "transaction_id", transaction_id),
                      key=lambda row: row["check_times"])

    def instance(self, group: str, instance_id: str) -> Optional[ProducerInstance]:
        """The live instance ``instance_id`` of ``group``, as its record says, ``None`` if it is not live."""
        return next((live for live in ProducerInstances(self.lakehouse).live(group)
                     if live.instance_id == instance_id), None)
