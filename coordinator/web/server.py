"""Serving the console: its users file, its WSGI server (waitress), where it listens.

Example::

    server = console_server(config, "conf/console-users.toml", port=8470)
    print(server.url)
    server.run()   # until interrupted; server.close() from another thread
"""

from __future__ import annotations

import ipaddress
import logging
import os
from typing import Union

import waitress

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import ConfigError
from coordinator.web.app import create_app
from coordinator.web.users import ConsoleUsers

__all__ = ["DEFAULT_PORT", "ConsoleServer", "console_server"]

log = logging.getLogger("coordinator.web")

DEFAULT_PORT = 8470


class ConsoleServer:
    """The console listening on ``url``, until :meth:`close`."""

    def __init__(self, server, host: str):
        self._server = server
        self._closed = False
        self.port = server.effective_port
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/"

    def run(self) -> None:
        """Serve requests until :meth:`close` (or Ctrl-C)."""
        try:
            self._server.run()
        except OSError:
            # Closed from another thread while the loop waited on the sockets: the wait fails on the closed socket.
            if not self._closed:
                raise

    def close(self) -> None:
        """Stop listening, and let :meth:`run` return (from any thread)."""
        self._closed = True
        self._server.close()


def console_server(config: CoordinatorConfig, users_file: Union[str, os.PathLike], host: str = "127.0.0.1",
                   port: int = DEFAULT_PORT, refresh_s: int = 5, threads: int = 4) -> ConsoleServer:
    """The console of ``config``'s lakehouse for the users of ``users_file``, bound to ``host``:``port``
    (0: any free port).

    Raises :class:`~coordinator.exceptions.ConfigError` if ``users_file`` names no user: without
    credentials the console serves nothing, so it does not start.
    """
    users = ConsoleUsers.load(users_file)
    if not users.names():
        raise ConfigError(f"no console user in {users_file}: add one first, "
                          "`txcoord console-user add NAME --role operator` (or --role viewer)")
    if not _loopback(host):
        log.warning("the console listens on %s over plain HTTP: put it behind a TLS proxy before anyone signs in "
                    "from another machine", host)
    app = create_app(config, users, refresh_s=refresh_s)
    return ConsoleServer(waitress.create_server(app, host=host, port=port, threads=threads, ident="txcoord-console"), host)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
