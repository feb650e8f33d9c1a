"""A storage server of the tests run as a process on a free loopback port: started, awaited until it
listens, stopped with its whole process group (a server's children go with it); and where such a
server is installed (:func:`tool_cache`). Standard library only.

Example::

    class MyServer(LoopbackServer):
        name = "my server"

        def start(self) -> "MyServer":
            self.launch(["my-server", "--port", str(self.port)])
            return self
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

_READY_TIMEOUT_S = 30.0


def tool_cache(tool: str, version: str) -> Path:
    """Where ``version`` of a test server ``tool`` is installed: under txcoord's cache (``TXCOORD_CACHE_DIR``,
    else the user's cache directory, as for the Spark jars), so that every checkout of this machine, each
    fresh CI clone included, builds it once. Python's standard library only: the scripts run before the
    virtual environment exists, so this is platformdirs' Linux rule, not platformdirs.

    Example::

        tool_cache("s3", "versitygw-v1.8.0")  # PosixPath('/home/me/.cache/txcoord/s3/versitygw-v1.8.0')
    """
    root = os.environ.get("TXCOORD_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "txcoord"
    return Path(root) / tool / version


class LoopbackServer:
    """A server process on ``127.0.0.1:port`` (a free port unless given), its output to ``log_file``.
    Subclasses name it and start it with :meth:`launch`; ``with`` starts and stops it."""

    #: How errors name it.
    name = "the server"

    def __init__(self, port: Optional[int] = None, log_file: Optional[str] = None):
        self.port = port or free_port()
        self.log_file = log_file
        self._process: Optional[subprocess.Popen] = None

    def start(self) -> "LoopbackServer":
        raise NotImplementedError

    def launch(self, command: list[str]) -> None:
        """Run ``command`` in a session of its own and return once it listens on :attr:`port`."""
        log = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not listening(self.port):
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self._process.returncode} (log: {self.log_file})")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not listen on port {self.port} within {_READY_TIMEOUT_S:.0f} s")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(10)
        self._process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0
