"""Records as producers write them to a commit log, for tests and benchmarks that write them directly
(hostile ones included: every column can be overridden).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Optional

__all__ = ["BODY", "commit_rows", "end_record", "half_record", "half_rows"]

#: The body of a benchmark's messages.
BODY = b"x" * 200


def half_record(transaction_id: Optional[str], group: str = "g", topic: str = "T", body: bytes = b"hello",
                **overrides: Any) -> dict:
    """A HALF record of a single-message transaction as a well-behaved producer writes it (``None``: a record
    without a transaction id, as only a hostile writer makes); ``overrides`` replace any column."""
    record = dict(record_id=uuid.uuid4().hex, kind="HALF", transaction_id=transaction_id, producer_group=group,
                  msg_id=uuid.uuid4().hex, message_index=0, message_count=1, topic=topic, keys=f"key-{transaction_id}",
                  tags=None, properties={}, body=body, born_timestamp=dt.datetime.now(dt.timezone.utc))
    record.update(overrides)
    return record


def end_record(transaction_id: Optional[str], state: str = "COMMIT_MESSAGE", group: str = "g",
               check_id: Optional[str] = None, **overrides: Any) -> dict:
    """An END record; ``check_id`` marks it as the answer to a check."""
    record = dict(record_id=uuid.uuid4().hex, kind="END", transaction_id=transaction_id, producer_group=group, state=state, check_id=check_id, born_timestamp=dt.datetime.now(dt.timezone.utc))
    record.update(overrides)
    return record


def half_rows(transaction_ids: list[str], group: str, topic: str, properties: Optional[dict] = None) -> list[dict]:
    """One single-message HALF record per transaction id, as a producer writes it, with the benchmarks' body."""
    return [half_record(tid, group, topic, BODY, keys=tid[-8:], properties=dict(properties or {}))
            for tid in transaction_ids]


def commit_rows(transaction_ids: list[str], group: str) -> list[dict]:
    """The producer's own COMMIT END record of each transaction."""
    return [end_record(tid, group=group) for tid in transaction_ids]
