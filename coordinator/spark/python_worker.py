"""The Python that Spark starts for the checker's commit-log source: this interpreter, importing pyspark from
its installed, compiled package rather than from the zip Spark puts first on a worker's ``PYTHONPATH``.

Spark starts the source's worker (``python -m pyspark.sql.streaming.python_streaming_source_runner``) with
``$SPARK_HOME/python/lib/pyspark.zip`` first on its path, and gives it a fixed 10 s to connect back (not a
setting). Python keeps no compiled bytecode for a zip, so every start compiles the pyspark modules it imports
from source: four times the start of the same import from the installed package, and past those 10 s on a
loaded machine, where the source then fails to start (docs/performance.md#the-checkers-start). Where that zip
is the installed pyspark's own (pyspark from pip, as this package installs it), the worker leaves it off its
path and imports the same files from the package; where Spark is another installation, its zip stays.

Example::

    os.environ["PYSPARK_PYTHON"] = python_worker()  # '/home/me/.cache/txcoord/python-worker/3f1c2a90b4d5e6f7'
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shlex
import sys
from pathlib import Path

from coordinator.spark.jars import cache_dir

__all__ = ["python_worker"]


def python_worker() -> str:
    """The executable Spark is to start its Python workers with (``PYSPARK_PYTHON``): a script that runs this
    interpreter without the installed pyspark's own zip on ``PYTHONPATH``, written once per interpreter and
    pyspark; this interpreter itself when Spark is not the installed pyspark's (``SPARK_HOME`` elsewhere)."""
    try:  # the installed package, not the zip a Spark-started process may have imported pyspark from
        package = Path(importlib.metadata.distribution("pyspark").locate_file("pyspark"))
    except importlib.metadata.PackageNotFoundError:
        return sys.executable
    home = os.environ.get("SPARK_HOME")
    if not (package / "__init__.py").is_file() or (home and Path(home).resolve() != package.resolve()):
        return sys.executable  # Spark is another installation: its zip is its pyspark
    own_zip = str(package / "python" / "lib" / "pyspark.zip")
    script = _script(sys.executable, own_zip)
    path = cache_dir() / "python-worker" / hashlib.sha256(script.encode()).hexdigest()[:16]
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        written = path.with_name(f"{path.name}.{os.getpid()}")
        written.write_text(script)
        written.chmod(0o755)
        os.replace(written, path)  # whole or absent, whichever process writes it
    return str(path)


def _script(python: str, own_zip: str) -> str:
    return (
        "#!/bin/sh\n"
        "# Written by coordinator.spark.python_worker: this Python, without pyspark's zip on its path.\n"
        "set -f\n"
        f"own_zip={shlex.quote(own_zip)}\n"
        "kept=\n"
        "IFS=:\n"
        "for entry in ${PYTHONPATH-}; do\n"
        '    [ "$entry" = "$own_zip" ] || kept="${kept:+$kept:}$entry"\n'
        "done\n"
        "unset IFS\n"
        'PYTHONPATH=$kept\n'
        "export PYTHONPATH\n"
        f'exec {shlex.quote(python)} "$@"\n'
    )
