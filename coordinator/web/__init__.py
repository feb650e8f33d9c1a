"""The operators' web console, ``txcoord console`` (needs ``pip install 'txcoord[console]'``).

Pages: the checker's health and charts, pending transactions, discarded ones, each transaction's
timeline, and ending a transaction by hand (operators only); consumer groups, their lag and dead letters,
and redriving or discarding those (operators only). See docs/operations.md#web-console.

Example::

    from coordinator.web import console_server
    console_server(config, "conf/console-users.toml").run()
"""

from coordinator.web.app import create_app
from coordinator.web.server import DEFAULT_PORT, ConsoleServer, console_server
from coordinator.web.users import OPERATOR, ROLES, VIEWER, ConsoleUser, ConsoleUsers

__all__ = ["DEFAULT_PORT", "OPERATOR", "ROLES", "VIEWER", "ConsoleServer", "ConsoleUser", "ConsoleUsers",
           "console_server", "create_app"]
