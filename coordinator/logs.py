"""Structured logs: one JSON object per line, the transaction id a field of every line about a transaction.

Every log call of the coordinator about a transaction passes
``extra={"transaction_id": ...}`` (with ``check_id`` and ``producer_group`` where
known) and also names the id in its message (``transaction_id=…``), so the id is
there in plain text logs too. :class:`JsonFormatter` turns such records into
JSON lines that a log pipeline can index by transaction.

Example::

    import logging
    from coordinator.logs import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.getLogger("coordinator").addHandler(handler)
    # {"time": "2026-11-22T02:23:33.296+00:00", "level": "INFO", "logger": "coordinator.producer.transaction_producer",
    #  "thread": "order_0", "message": "transaction sent transaction_id=3f2a… messages=1 state=COMMIT_MESSAGE",
    #  "transaction_id": "3f2a…", "producer_group": "order_group"}
"""

from __future__ import annotations

import datetime as dt
import json
import logging

__all__ = ["CONTEXT_FIELDS", "JsonFormatter"]

#: Context fields copied from a record's ``extra`` into its JSON line, when present.
CONTEXT_FIELDS = ("transaction_id", "check_id", "producer_group")


class JsonFormatter(logging.Formatter):
    """Formats each record as one JSON object (time in UTC, ISO 8601), with :data:`CONTEXT_FIELDS`."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "thread": record.threadName,
            "message": record.getMessage(),
        }
        line |= {name: getattr(record, name) for name in CONTEXT_FIELDS if getattr(record, name, None) is not None}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)
