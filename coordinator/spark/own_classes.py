"""txcoord's own Java class for Spark, compiled once into the user's cache from the source this package
ships (``java/``): :data:`CONDITIONAL_PUT_CHECKPOINT_MANAGER`, which writes each streaming checkpoint file on
S3 with one conditional PUT (why it is hand-written:
docs/performance-log.md#the-checker-at-500-txns-25-ms-a-request-issue-45-point-3).

It needs a JDK's ``javac`` (``JAVA_HOME``'s, else the one on the ``PATH``), compiling against the Spark in use;
without one, or if it will not compile there, sessions start without it and the checker writes its checkpoint
with Spark's own manager, slower on S3 (a warning says so, once).

Example::

    from coordinator.spark.own_classes import own_jar
    own_jar()  # PosixPath('/home/me/.cache/txcoord/spark/own/txcoord-3f1c2a90b4d5e6f7.jar'), or None without a JDK
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Optional

from coordinator.spark.jars import cache_dir, exclusively, spark_home

__all__ = ["CONDITIONAL_PUT_CHECKPOINT_MANAGER", "own_jar"]

log = logging.getLogger(__name__)

CONDITIONAL_PUT_CHECKPOINT_MANAGER = "io.txcoord.spark.ConditionalPutCheckpointFileManager"
#: The release the classes are compiled for: Spark 4's own minimum, so any JVM that runs Spark loads them.
_JAVA_RELEASE = "17"
_COMPILE_TIMEOUT_S = 300


def own_jar() -> Optional[Path]:
    """The jar of txcoord's own classes for the Spark in use, compiled into the cache when missing; None
    (with a warning, once a process) when no JDK is found or the sources do not compile against that Spark."""
    sources = sorted(Path(str(importlib.resources.files("coordinator.spark") / "java")).glob("*.java"))
    jar = cache_dir() / "spark" / "own" / f"txcoord-{_identity(sources)}.jar"
    if jar.is_file():
        return jar
    javac = _javac()
    if javac is None:
        _warn_once("no JDK (javac) found: the checker writes its Spark checkpoint on S3 with Spark's own manager, "
                   "in more requests a micro-batch; install a JDK 17+ or set JAVA_HOME to one")
        return None
    with exclusively(jar.parent / ".lock"):  # a second process waits, then finds the jar
        if not jar.is_file():
            try:
                _compile(javac, sources, jar)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as error:
                _warn_once(f"txcoord's Java classes did not compile against the Spark in {spark_home()}, so the checker "
                           f"writes its checkpoint on S3 with Spark's own manager: {getattr(error, 'stderr', None) or error}")
                return None
    return jar


@lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    log.warning(message)


def _identity(sources: list[Path]) -> str:
    """What the jar is only valid for: the sources and the Spark installation's jars they compile against."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    digest.update("\0".join(sorted(path.name for path in (spark_home() / "jars").glob("*.jar"))).encode())
    return digest.hexdigest()[:16]


def _javac() -> Optional[str]:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").is_file():
        return str(Path(java_home) / "bin" / "javac")
    return shutil.which("javac")


def _compile(javac: str, sources: list[Path], jar: Path) -> None:
    """Compile ``sources`` against Spark's jars and write ``jar`` whole (a temporary file, then a rename)."""
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as work:
        classes = Path(work) / "classes"
        subprocess.run([javac, "--release", _JAVA_RELEASE, "-nowarn", "-d", str(classes),
                        "-cp", str(spark_home() / "jars" / "*"), *map(str, sources)],
                       check=True, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S)
        staged = Path(work) / jar.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: txcoord\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        os.replace(staged, jar)
