"""A storage server run as a process on a free loopback port: the conformance kit's S3 server
(:mod:`.versitygw`), and the tests' Azurite (``scripts/azurite.py``). Started, awaited until it listens,
stopped with its whole process group (a server's children go with it); where such a server is installed
(:func:`tool_cache`), how it is installed once per machine (:func:`install_once`), and the command line of each
server's module (:func:`server_command`). Python's standard library only (and txcoord's errors): a checkout's
``make test`` installs these servers before its virtual environment exists (tests/test_layering.py).

Example::

    class MyServer(LoopbackServer):
        name = "my server"

        def start(self) -> "MyServer":
            self.launch(["my-server", "--port", str(self.port)])
            return self
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

from coordinator.exceptions import ConformanceKitError

__all__ = ["LoopbackServer", "free_port", "install_once", "listening", "required_tool", "server_command", "tool_cache"]

_READY_TIMEOUT_S = 30.0


def tool_cache(tool: str, version: str) -> Path:
    """Where ``version`` of a loopback server ``tool`` is installed: under txcoord's cache (``TXCOORD_CACHE_DIR``,
    else the user's cache directory, as for the Spark jars), so that every checkout and install of this machine,
    each fresh CI clone included, builds it once. Python's standard library only (installs run before a
    checkout's virtual environment exists), so this is platformdirs' Linux rule, not platformdirs.

    Example::

        tool_cache("s3", "versitygw-v1.8.0")  # PosixPath('/home/me/.cache/txcoord/s3/versitygw-v1.8.0')
    """
    root = os.environ.get("TXCOORD_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "txcoord"
    return Path(root) / tool / version


def required_tool(tool: str, doing: str) -> str:
    """The path of ``tool``; else exit saying that ``doing`` needs it (``doing`` names the tool and where to get
    it, as in "building the S3 server needs Go (https://go.dev/dl/)")."""
    path = shutil.which(tool)
    if path is None:
        raise SystemExit(f"{doing}; none is on PATH")
    return path


def install_once(lock: Path, done: Callable[[], bool], install: Callable[[], None]) -> None:
    """Run ``install`` unless ``done()`` says it has been: an install already under way in another process
    (``make test`` starts one early) holds ``lock``, and is waited for, not repeated."""
    if done():
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not done():
            install()


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
                raise ConformanceKitError(f"{self.name} exited with code {self._process.returncode} (log: {self.log_file})")
            if time.monotonic() > deadline:
                self.stop()
                raise ConformanceKitError(f"{self.name} did not listen on port {self.port} within {_READY_TIMEOUT_S:.0f} s")
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


def server_command(argv: Optional[list[str]], description: str, server: Callable[..., "LoopbackServer"], *,
                   install: tuple[str, str, Callable[[], Path]], data_help: str, port: int,
                   made: tuple[str, str], make: Callable[["LoopbackServer", str], None],
                   describe: Callable[["LoopbackServer", Path, list[str]], list[str]]) -> int:
    """A server script's command line: ``install`` (its command, its help, the function returning the
    installed binary), and ``run``, which serves a directory (``--data``) on ``--port`` until interrupted,
    having made each of ``made``'s option (a bucket, a container: repeatable) with ``make``, and printed
    ``describe``'s lines.

    Example::

        sys.exit(server_command(None, "My server.", MyServer, install=("install", "install it", install),
                                data_help="its directory", port=9000, made=("--bucket", "a bucket to create"),
                                make=MyServer.create_bucket, describe=lambda server, data, made: [server.endpoint]))
    """
    parser = argparse.ArgumentParser(description=description)
    commands = parser.add_subparsers(dest="command", required=True)
    install_command, install_help, installed = install
    commands.add_parser(install_command, help=install_help)
    run = commands.add_parser("run", help="serve a directory until interrupted")
    run.add_argument("--data", required=True, help=data_help)
    run.add_argument("--port", type=int, default=port)
    run.add_argument(made[0], action="append", default=[], dest="made", help=made[1])
    args = parser.parse_args(argv)
    if args.command == install_command:
        print(installed())
        return 0
    with server(args.data, port=args.port) as running:
        for name in args.made:
            make(running, name)
        for line in describe(running, Path(args.data).resolve(), args.made):
            print(line)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


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
