"""Real RocketMQ and Kafka servers on loopback, each in its own working directory, started from the
jars ``install.py`` resolved and stopped (with everything they wrote) afterwards.

Durability is each system's default, stated in ``DURABILITY``: none of the three calls fsync
before acknowledging a write, so all three acknowledge once the write is in the operating
system's page cache (safe against a process crash, not against power loss).

Example::

    with RocketMQServer(workdir) as rocketmq:
        rocketmq.driver_args("BenchPeers", 8)  # ["--namesrv", "127.0.0.1:<port>"], topic created
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Optional

import support
from bench.peers.install import KAFKA, ROCKETMQ, System

#: The check-back settings shared with our checker (bench/peers/ours.py): immunity 6 s (both
#: systems' default) and a check round every 10 s (RocketMQ's default is 30 s, ours 60 s).
TRANSACTION_TIMEOUT_MS = 6000
TRANSACTION_CHECK_INTERVAL_MS = 10000

DURABILITY = {
    "rocketmq": "flushDiskType=ASYNC_FLUSH (the default): acknowledged once in the page cache; one broker, no replica",
    "kafka": "acks=all with one broker (replication factor 1) and the default log.flush settings: acknowledged "
             "once in the page cache",
    "ours": "a send returns once its half's Delta commit is on the local filesystem; the commit-log writer "
            "issues no fsync (a write, then a hard link of the commit file, as delta-rs does), so: in the page cache",
}
DURABILITY["ours-java"] = DURABILITY["ours"]  # the Java client's commits are made alike (docs/java.md#storage)


def java(system: System, main_class: str, *args: str, heap: str = "512m", cwd: Path) -> list[str]:
    """``java`` running ``main_class`` on the system's class path. Both home properties point at ``cwd``:
    RocketMQ's servers and clients write their logs under them, and those stay in the run's directory."""
    return ["java", f"-Xms{heap}", f"-Xmx{heap}", f"-Duser.home={cwd}", f"-Drocketmq.home.dir={cwd}",
            "-cp", system.classpath, main_class, *args]


def start_server(name: str, argv: list[str], workdir: Path, port: int, started: list[support.Job]) -> support.Job:
    """A Java server process in ``workdir`` (its output in ``<name>.log`` there), added to ``started`` at once
    (to be stopped whatever happens), returned once it listens on ``port``."""
    server = support.Job(argv, workdir / f"{name}.log", cwd=workdir).start()
    started.append(server)
    server.wait_for(lambda: _listening(port), f"{name} listening on {port}", 120, poll_s=0.3)
    return server


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class RocketMQServer:
    """A RocketMQ name server and one broker (ASYNC_MASTER, ASYNC_FLUSH) with the shared check-back settings."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.namesrv_port, self.broker_port = support.free_port(), support.free_port()
        self.namesrv_address = f"127.0.0.1:{self.namesrv_port}"
        self.broker_address = f"127.0.0.1:{self.broker_port}"
        self.settings = {
            "brokerClusterName": "BenchCluster", "brokerName": "broker-a", "brokerId": 0, "brokerIP1": "127.0.0.1",
            "namesrvAddr": self.namesrv_address, "listenPort": self.broker_port,
            "storePathRootDir": workdir / "store", "storePathCommitLog": workdir / "store" / "commitlog",
            "brokerRole": "ASYNC_MASTER", "flushDiskType": "ASYNC_FLUSH", "autoCreateTopicEnable": "false",
            "transactionTimeOut": TRANSACTION_TIMEOUT_MS, "transactionCheckInterval": TRANSACTION_CHECK_INTERVAL_MS,
        }
        self.servers: list[support.Job] = []

    def __enter__(self) -> "RocketMQServer":
        (self.workdir / "namesrv.conf").write_text(f"listenPort={self.namesrv_port}\n")
        (self.workdir / "broker.conf").write_text("".join(f"{key}={value}\n" for key, value in self.settings.items()))
        try:
            start_server("namesrv", java(ROCKETMQ, "org.apache.rocketmq.namesrv.NamesrvStartup", "-c", "namesrv.conf",
                                         heap="256m", cwd=self.workdir), self.workdir, self.namesrv_port, self.servers)
            start_server("broker", java(ROCKETMQ, "org.apache.rocketmq.broker.BrokerStartup", "-c", "broker.conf",
                                        heap="1g", cwd=self.workdir), self.workdir, self.broker_port, self.servers)
        except BaseException:
            self.stop()
            raise
        return self

    def driver_args(self, topic: str, queues: int, timeout_s: float = 60) -> list[str]:
        """Create ``topic`` (``mqadmin updateTopic``, retried until the broker has registered with the name
        server); return the driver's connection options."""
        argv = java(ROCKETMQ, "org.apache.rocketmq.tools.command.MQAdminStartup", "updateTopic",
                    "-n", self.namesrv_address, "-b", self.broker_address, "-t", topic,
                    "-r", str(queues), "-w", str(queues), heap="256m", cwd=self.workdir)
        deadline = time.monotonic() + timeout_s
        while True:
            result = subprocess.run(argv, cwd=self.workdir, capture_output=True, text=True)
            if "success" in result.stdout:
                return ["--namesrv", self.namesrv_address]
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not create RocketMQ topic {topic}:\n{result.stdout[-2000:]}")
            time.sleep(1)

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop(30)

    def __exit__(self, *exc_info) -> None:
        self.stop()


class KafkaServer:
    """One Kafka node in KRaft mode (broker and controller in one process), formatted afresh."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port, self.controller_port = support.free_port(), support.free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.settings = {
            "process.roles": "broker,controller", "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": workdir / "data",
            "offsets.topic.replication.factor": 1, "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1, "group.initial.rebalance.delay.ms": 0,
        }
        self.server: Optional[support.Job] = None

    def __enter__(self) -> "KafkaServer":
        config = self.workdir / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in self.settings.items()))
        # "=" joins the value: a URL-safe base64 id may start with "-", which would read as an option.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        format_storage = java(KAFKA, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(config),
                              heap="256m", cwd=self.workdir)
        formatted = subprocess.run(format_storage, cwd=self.workdir, capture_output=True, text=True)
        if formatted.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed:\n{formatted.stdout[-2000:]}{formatted.stderr[-2000:]}")
        started: list[support.Job] = []
        try:
            self.server = start_server("kafka", java(KAFKA, "kafka.Kafka", str(config), heap="1g", cwd=self.workdir),
                                       self.workdir, self.port, started)
        except BaseException:
            for server in started:
                server.stop(30)
            raise
        return self

    def driver_args(self, topic: str, partitions: int) -> list[str]:
        """The driver's connection options (the driver creates ``topic`` with ``partitions`` through the Admin API)."""
        return ["--bootstrap", self.bootstrap]

    def __exit__(self, *exc_info) -> None:
        if self.server is not None:
            self.server.stop(30)


def fresh_workdir(parent: Path, name: str) -> Path:
    path = parent / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
