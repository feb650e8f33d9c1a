"""The checker: a Structured Streaming job over the commit log (DESIGN §4).

One module per batch step — :mod:`.ingest`, :mod:`.resolve` (with promote),
:mod:`.check` — run in order by :mod:`.batch`; :mod:`.query` is the streaming
query with its heartbeat. The checker never imports the producer side.
"""

from coordinator.checker.batch import BatchSummary, run_batch
from coordinator.checker.query import CheckerQuery, read_records

__all__ = ["BatchSummary", "CheckerQuery", "read_records", "run_batch"]
