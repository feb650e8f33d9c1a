"""Refusing records: the first failed rule gives the reason, recorded in ``system/rejected``."""

from __future__ import annotations

from typing import Optional

# Long hostile values are kept, shortened, so a refusal row stays readable and small.
_MAX_ECHOED_CHARS = 256
_ECHOED = ("record_id", "kind", "transaction_id", "producer_group", "msg_id", "topic", "state", "check_id")


def rejection(record: dict, reason: str) -> dict:
    """A ``system/rejected`` row (less ``batch_id``) for a record of :class:`BatchRecords` rows.

    Example::

        rejection(record, "unknown transaction")["reason"]  # 'unknown transaction'
    """
    row = {name: _echo(record.get(name)) for name in _ECHOED}
    row.update(reason=reason, commit_version=record.get("commit_version"), stored_timestamp=record.get("stored_us"),
               commit_log=record.get("commit_log"))
    return row


def _echo(value) -> Optional[str]:
    return None if value is None else str(value)[:_MAX_ECHOED_CHARS]

