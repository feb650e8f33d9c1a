"""The conformance kit (``txcoord conformance``, docs/protocol.md#the-conformance-kit): a real checker on a
fresh lakehouse, a client under test driven through a line protocol on its stdin and stdout, and cases judged
by what the checker really did (:mod:`.kit`, :mod:`.client`, :mod:`.cases`, :mod:`.malformed`).
:mod:`.python_client` is the Python producer under that protocol.

It sits on the floor of the jobs (tests/test_layering.py): it starts the checker job (``spark-submit``, as
deployed: no JVM in this process), reads the checker's tables and the instance records without Spark, writes raw
commits as a malformed client would, and imports the producer side only for its Python driver; never the demo.
"""
