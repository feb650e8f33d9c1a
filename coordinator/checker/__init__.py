"""The checker: a Structured Streaming job over the commit log (docs/design.md#the-checker). Spark only.

:mod:`.batch` runs a micro-batch in four phases, gather (:mod:`.gather`), decide (one module per step:
:mod:`.provenance`, :mod:`.ingest`, :mod:`.ends`, :mod:`.recover`, :mod:`.check`), write (:mod:`.writer`,
:mod:`.delivery`) and apply, over the checker's memory (:mod:`.memory`, read back from the tables by
:mod:`.rebuild`); the phases and steps are numbered in docs/design.md#a-batchs-steps alone; :mod:`.source` is the commit log
as a streaming source and :mod:`.query` the streaming query, :mod:`.metrics` its
listener. :mod:`coordinator.spark` starts Spark with the Delta jars, and
:mod:`coordinator.jobs.checker` runs the query as a job (``txcoord checker``).

The checker never imports the producer side. Its lease and progress record live in
:mod:`coordinator.control`, where the JVM-free operator tools read them.
"""

#: The checker's one name: its Spark application, its streaming query, and the app id of its idempotent writes.
CHECKER_NAME = "txcoord-checker"

__all__ = ["CHECKER_NAME"]
