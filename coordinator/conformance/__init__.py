"""The conformance kit (``txcoord conformance``, docs/protocol.md#the-conformance-kit): a real checker on a
fresh lakehouse, a client under test driven through a line protocol on its stdin and stdout, and cases judged
by what the checker really did.

Its imports go one way, each module importing only those below it (tests/test_layering.py):

- at the bottom, what knows nothing of the kit: the client processes (:mod:`.client`), the checker's tables as
  read (:mod:`.observed`), a commit log written raw (:mod:`.raw_log`), the storage-fault proxy (:mod:`.faults`)
  and a server on loopback (:mod:`.loopback`), which the S3 server (:mod:`.versitygw`) is;
- :mod:`.primitives`: the run a case is given, the kit's settings and TOML, the checks every case makes;
- the case modules: :mod:`.basic`, :mod:`.malformed`, :mod:`.checkpointed`, :mod:`.numbering`, :mod:`.grant`,
  :mod:`.storage_faults`, :mod:`.versioning`;
- the case list (:mod:`.cases`), and the object store of ``--object-store`` (:mod:`.object_store`);
- on top, the runner (:mod:`.kit`), which the ``txcoord conformance`` command calls.

:mod:`.python_client` is the Python producer under the line protocol, apart from the kit: neither imports the other.

It sits on the floor of the jobs (tests/test_layering.py): it starts the checker job (``spark-submit``, as
deployed: no JVM in this process), reads the checker's tables and the instance records without Spark, writes raw
commits as a malformed client would, and imports the producer side only for its Python driver; never the demo.
"""
