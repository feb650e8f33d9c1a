"""Coordination state kept on the lakehouse, JVM-free: who may run the checker (:mod:`.lease`), how
far it got (:mod:`.progress`), and which producer instances are alive to answer checks
(:mod:`.instances`); :mod:`.processes` tells whether a process that recorded itself still runs.

The checker and producers write these files; the operator tools read them without starting a JVM.
"""

__all__: list[str] = []  # its public surface is its modules, named above
