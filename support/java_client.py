"""The Java client (clients/java) for the tests: its jar built once per session with Maven (offline when
Maven's repository already holds every dependency: it is cached per machine in ~/.m2), and the classpath
that runs it, its example service or its conformance driver."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from support.environment import REPO_ROOT

__all__ = ["JAR", "JAVA_CLIENT", "JVM_OPTIONS", "build_java_client", "java_classpath"]

JAVA_CLIENT = Path(REPO_ROOT) / "clients" / "java"
#: The client's jar, once built.
JAR = JAVA_CLIENT / "target" / "txcoord-client-0.1.0.jar"
#: The JVM's settings for the client's runs on a small, shared machine: the serial collector, and C1 alone, whose
#: compiles finish early where C2's compete with the run for two cores (docs/performance-log.md#java-client).
JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def build_java_client(timeout_s: float = 600) -> Optional[str]:
    """Builds the client's jar and its lib/ unless they are newer than every source; returns why it cannot
    (no Maven, no JDK), or None once built. Tries offline first, then online (a fresh ~/.m2)."""
    if shutil.which("mvn") is None or shutil.which("java") is None:
        return "the Java client's tests need Maven and a JDK (sudo apt-get install maven default-jdk-headless)"
    # The lock `make test`'s background build holds (Makefile: JAVA_CLIENT_BUILD): its jar is waited for, not
    # built a second time beside it.
    with open(JAVA_CLIENT / "target.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sources = [p for p in (JAVA_CLIENT / "pom.xml", *(JAVA_CLIENT / "src" / "main").rglob("*")) if p.is_file()]
        if JAR.exists() and (JAVA_CLIENT / "target" / "lib").is_dir() and (JAVA_CLIENT / "target" / "examples-lib").is_dir() and \
                JAR.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
            return None
        for offline in (["-o"], []):
            result = subprocess.run(["mvn", "-q", "-B", *offline, "-DskipTests", "package"], cwd=JAVA_CLIENT,
                                    capture_output=True, text=True, timeout=timeout_s)
            if result.returncode == 0:
                return None
    raise AssertionError(f"mvn package failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")


def java_classpath() -> str:
    """The classpath of the built client: its jar, its runtime dependencies, and an SLF4J binding (slf4j-simple,
    in target/examples-lib: the client brings none) that puts its logs on stderr."""
    return os.pathsep.join([str(JAR), str(JAVA_CLIENT / "target" / "lib" / "*"),
                            str(JAVA_CLIENT / "target" / "examples-lib" / "*")])
