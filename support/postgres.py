"""A real PostgreSQL server (Debian's ``postgresql`` package) on loopback, in a directory of its own, for a test
session: what the exactly-once listener's tests run against.

Example::

    with PostgresServer() as server:
        psycopg.connect(server.dsn)
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from support.processes import free_port
from support.waiting import wait_until

__all__ = ["PostgresServer", "postgres_bin"]

#: Where Debian puts a PostgreSQL server's programs (off the PATH; ``pg_ctlcluster`` wraps them).
_DEBIAN_BINS = "/usr/lib/postgresql/*/bin"


def postgres_bin() -> Optional[Path]:
    """The directory holding ``initdb`` and ``postgres`` (the PATH's, else Debian's newest), or ``None``.

    Example::

        postgres_bin()   # PosixPath('/usr/lib/postgresql/15/bin')
    """
    found = shutil.which("initdb")
    if found and shutil.which("postgres", path=str(Path(found).resolve().parent)):
        return Path(found).resolve().parent
    candidates = sorted(glob.glob(_DEBIAN_BINS), key=lambda path: int(Path(path).parent.name))
    for directory in reversed(candidates):
        if (Path(directory) / "initdb").exists() and (Path(directory) / "postgres").exists():
            return Path(directory)
    return None


class PostgresServer:
    """``initdb`` in a fresh directory, then ``postgres`` listening on a free loopback port, trusting local
    connections; stopped (immediately: nothing of it is kept) and removed on exit. PostgreSQL refuses to run
    as root: as root, the server runs as the ``postgres`` user Debian's package creates.

    Example::

        with PostgresServer() as server:
            server.dsn       # 'host=127.0.0.1 port=… user=postgres dbname=postgres'
    """

    def __init__(self, bin_dir: Optional[Path] = None):
        self.bin_dir = bin_dir or postgres_bin()
        if self.bin_dir is None:
            raise FileNotFoundError("no PostgreSQL server (initdb, postgres): sudo apt-get install postgresql")
        self.port = free_port()
        self.user = None if os.getuid() else "postgres"
        # Not under pytest's directories: they are private to root, and the server may run as another user.
        self.root = Path(tempfile.mkdtemp(prefix="txcoord-postgres-"))
        self.process: Optional[subprocess.Popen] = None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def __enter__(self) -> "PostgresServer":
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        data = self.root / "data"
        subprocess.run([str(self.bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                        "--no-sync"], check=True, capture_output=True, user=self.user)
        log = open(self.root / "server.log", "ab")
        # fsync off: a test's server is thrown away, never recovered; durability is not what is tested of it.
        self.process = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(data), "-p", str(self.port), "-h", "127.0.0.1",
             "-k", str(self.root), "-c", "fsync=off", "-c", "max_connections=50"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, user=self.user, start_new_session=True)
        log.close()
        wait_until(self._ready, 60, "PostgreSQL accepting connections")
        return self

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"postgres exited ({self.process.returncode}): "
                               f"{(self.root / 'server.log').read_text()[-2000:]}")
        return subprocess.run([str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                              capture_output=True).returncode == 0

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown: SIGTERM would wait for every client to leave
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
