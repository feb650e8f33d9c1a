"""The Spark jobs txcoord ships, each a module whose file ``spark-submit`` can run:
:mod:`.checker` (also ``txcoord checker``), and :mod:`.runtime`, what every job does first."""

__all__: list[str] = []
