"""The Spark jobs txcoord ships, each a module whose file ``spark-submit`` can run:
:mod:`.checker` (also ``txcoord checker``), and :mod:`.runtime`, what every job does first; and
:mod:`.training`, the short run of the checker that writes the driver's class archive."""

__all__: list[str] = []
