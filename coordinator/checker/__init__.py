"""The checker: a Structured Streaming job over the commit log (DESIGN §4).

One module per batch step — :mod:`.ingest`, :mod:`.resolve` (with promote),
:mod:`.check` — run in order by :mod:`.batch` over the checker's memory
(:mod:`.state`), writing through :mod:`.writer`; :mod:`.source` is the commit log
as a streaming source and :mod:`.query` the streaming query. The checker never
imports the producer side.

:mod:`.lease` and :mod:`.progress` need no Spark, so JVM-free tools (``txcoord
status``, maintenance) read them without loading pyspark: the Spark-side names
below are loaded on first use.
"""

_SPARK_SIDE = {
    "BatchSummary": "coordinator.checker.batch",
    "run_batch": "coordinator.checker.batch",
    "CheckerQuery": "coordinator.checker.query",
    "read_records": "coordinator.checker.source",
}


def __getattr__(name: str):
    if name in _SPARK_SIDE:
        import importlib

        return getattr(importlib.import_module(_SPARK_SIDE[name]), name)
    raise AttributeError(f"module 'coordinator.checker' has no attribute {name!r}")


__all__ = sorted(_SPARK_SIDE)
