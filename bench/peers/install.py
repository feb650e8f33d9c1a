"""Install the peers: resolve RocketMQ's and Kafka's jars from Maven Central into ``.cache/peers``
and compile this directory's Java drivers against them; and this product's Java client (clients/java, built with
Maven by ``support.java_client``) with its driver, ``TxcoordPeer``.

Nothing of theirs is committed: each system's artifacts are named here (group, artifact,
version) and Maven resolves them, with their dependencies, into ``.cache/peers/<system>/lib``
once; later runs find them there and need no network. Each system gets its own class path, so
their dependencies never meet.

    python -m bench.peers.install            # all three; prints each system's class path
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from support.java_client import JAR, build_java_client, java_classpath

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "peers"
JAVA_SOURCES = Path(__file__).resolve().parent / "java"


@dataclass(frozen=True)
class System:
    """One peer: the Maven artifacts that make its server and client, and the driver class that runs the workload."""

    name: str
    version: str
    artifacts: tuple[str, ...]  # group:artifact:version
    driver: str
    #: The class path of jars built here rather than resolved (this product's Java client), or None.
    libraries: Optional[str] = None

    @property
    def home(self) -> Path:
        return CACHE / self.name

    @property
    def jars(self) -> str:
        return self.libraries or f"{self.home / 'lib'}/*"

    @property
    def classpath(self) -> str:
        """The resolved (or built) jars, then the compiled driver."""
        return f"{self.jars}:{self.home / 'classes'}"


ROCKETMQ = System(
    name="rocketmq",
    version="5.5.0",
    artifacts=tuple(f"org.apache.rocketmq:rocketmq-{module}:5.5.0"
                    for module in ("namesrv", "broker", "client", "tools")),
    driver="RocketMQPeer",
)
# 4.3.1, not 4.4.0: kafka_2.13 4.4.0 depends on kafka-tools-api 4.4.0, which is not on Maven Central.
KAFKA = System(
    name="kafka",
    version="4.3.1",
    artifacts=("org.apache.kafka:kafka_2.13:4.3.1", "org.apache.kafka:kafka-clients:4.3.1"),
    driver="KafkaPeer",
)
# This product through its Java client, the jar clients/java builds (its version is the pom's).
OURS_JAVA = System(name="ours-java", version=JAR.name.removeprefix("txcoord-client-").removesuffix(".jar"),
                   artifacts=(), driver="TxcoordPeer", libraries=java_classpath())
SYSTEMS = {system.name: system for system in (ROCKETMQ, KAFKA, OURS_JAVA)}


def _pom(system: System) -> str:
    dependencies = "".join(
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version></dependency>"
        for group, artifact, version in (coordinate.split(":") for coordinate in system.artifacts))
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            f"<groupId>bench.peers</groupId><artifactId>{system.name}</artifactId><version>1</version>"
            f"<dependencies>{dependencies}</dependencies></project>\n")


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        sys.exit(f"bench/peers needs `{tool}` on PATH (a JDK 17 and Maven); it was not found")
    return path


def resolve(system: System) -> Path:
    """The system's jars in ``.cache/peers/<name>/lib``, resolved by Maven on first use."""
    lib = system.home / "lib"
    marker = system.home / f".resolved-{system.version}"
    if marker.exists():
        return lib
    mvn = _require("mvn")
    shutil.rmtree(lib, ignore_errors=True)
    with tempfile.TemporaryDirectory() as project:
        (Path(project) / "pom.xml").write_text(_pom(system))
        print(f"resolving {system.name} {system.version} from Maven Central...", flush=True)
        result = subprocess.run([mvn, "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
                                 f"-DoutputDirectory={lib}"], cwd=project, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"Maven could not resolve {', '.join(system.artifacts)}:\n{result.stdout[-3000:]}")
    marker.touch()
    return lib


def compile_driver(system: System) -> Path:
    """``Workload.java`` and the system's driver, compiled against its jars (again whenever a source changed)."""
    classes = system.home / "classes"
    sources = [JAVA_SOURCES / "Workload.java", JAVA_SOURCES / f"{system.driver}.java"]
    if system.libraries:
        sources.append(JAR)  # compiled against the client as built now
    built = classes / f"{system.driver}.class"
    if built.exists() and all(source.stat().st_mtime <= built.stat().st_mtime for source in sources):
        return classes
    javac = _require("javac")
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    java_sources = [str(source) for source in sources if source.suffix == ".java"]
    result = subprocess.run([javac, "-nowarn", "-d", str(classes), "-cp", system.jars, *java_sources],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"javac failed for {system.driver}:\n{result.stderr}")
    return classes


def install(system: System) -> System:
    """Resolve (or, for this product's client, build) and compile; returns the system, ready to start."""
    if system.libraries:
        reason = build_java_client()
        if reason:
            sys.exit(f"bench/peers cannot run {system.name}: {reason}")
    else:
        resolve(system)
    compile_driver(system)
    return system


if __name__ == "__main__":
    for peer in SYSTEMS.values():
        install(peer)
        print(f"{peer.name} {peer.version}: {peer.classpath}")
