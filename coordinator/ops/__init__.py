"""Operator tools, JVM-free: the lakehouse's health (:mod:`.status`), the hanging transactions and the
checker's next step for each (:mod:`.pending`), an operator's decision for one of them
(:mod:`.resolve`), one transaction's timeline (:mod:`.audit`),
maintenance (:mod:`.maintenance`), and every table as SQL (:mod:`.catalog`).

They read with delta-rs and never import pyspark; :mod:`coordinator.cli` puts them on the
command line. :mod:`.catalog` registers views in a Spark session the caller brings.
"""

__all__: list[str] = []  # its public surface is its modules, named above
