"""The checker's state that outlives it, on the lakehouse: who may run (:mod:`.lease`) and how
far it got (:mod:`.progress`).

Needs no Spark: the checker writes these files, and the operator tools read them
without starting a JVM.
"""
