"""The operators' web console: ``txcoord console`` and ``console-user`` (both need ``txcoord[console]``)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from coordinator.cli.options import EXIT_OK, at_least
from coordinator.config import EXIT_USAGE, CoordinatorConfig
from coordinator.exceptions import ConfigError, InvalidArgumentError
from coordinator.lakehouse import Lakehouse

__all__ = ["register", "run_console", "run_console_user"]


def register(commands) -> None:
    """``console`` and ``console-user``, on ``commands`` (the ``txcoord`` parser's sub-parsers)."""
    _add_console(commands)
    _add_console_user(commands)


def _add_console(commands) -> None:
    web = commands.add_parser("console", help="serve the operators' web console: pending, discarded, timelines, "
                                              "charts, ending a transaction by hand (needs txcoord[console])")
    web.add_argument("--port", type=_port, default=None, help="TCP port (default: 8470; 0: any free port)")
    web.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    web.add_argument("--refresh", type=_refresh, default=5, metavar="SECONDS",
                     help="how often live pages reload themselves (default: %(default)s)")
    _users_option(web)
    web.set_defaults(run=run_console)


def run_console(args: argparse.Namespace) -> int:
    """Serve the web console (:mod:`coordinator.web`) until interrupted; exit 2 if it has no user.

    Example::

        $ txcoord console --config conf/coordinator.toml --port 8470
    """
    import logging

    web = _console_extra()
    config = CoordinatorConfig.load(args.config)
    Lakehouse.of(config)  # a bad location fails now, not at the first page
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = web.console_server(config, _users_file(args), host=args.host,
                                port=web.DEFAULT_PORT if args.port is None else args.port, refresh_s=args.refresh)
    print(f"txcoord console: {server.url} (users from {_users_file(args)}; Ctrl-C to stop)", flush=True)

    def stop(signum, frame):  # SIGTERM (systemd's stop) ends it as cleanly as Ctrl-C, with status 0
        raise SystemExit(EXIT_OK)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.run()
    finally:
        server.close()
    return EXIT_OK


def _port(text: str) -> int:
    value = at_least(0, text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, got {value}")
    return value


def _refresh(text: str) -> int:
    return at_least(1, text)


def _add_console_user(commands) -> None:
    console_user = commands.add_parser("console-user", help="add, remove or list the console's users (needs txcoord[console])")
    console_user.add_argument("action", choices=("add", "remove", "list"))
    console_user.add_argument("name", nargs="?", metavar="NAME")
    console_user.add_argument("--role", choices=("viewer", "operator"), default=None,
                              help="add: a viewer reads; an operator may also end transactions by hand")
    console_user.add_argument("--password-stdin", action="store_true",
                              help="add: read the password from the first line of stdin instead of prompting")
    console_user.add_argument("--storage", action="append", default=[], metavar="KEY=VALUE",
                              help="add: a storage setting of this user's own (e.g. aws_access_key_id=...): the "
                                   "console then reads and writes as them; repeat for each")
    _users_option(console_user)
    console_user.set_defaults(run=run_console_user)


def run_console_user(args: argparse.Namespace) -> int:
    """Add, remove or list the console's users (:mod:`coordinator.web.users`).

    Example::

        $ txcoord console-user add alice --role operator --config conf/coordinator.toml
    """
    import getpass

    web = _console_extra()
    users = web.ConsoleUsers.load(_users_file(args))
    if args.action == "list":
        for name in users.names():
            print(f"{name}\t{users.get(name).role}" + ("\town storage credentials" if users.get(name).storage else ""))
        return EXIT_OK
    if not args.name:
        print(f"txcoord console-user {args.action}: name the user", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.action == "remove":
            users.remove(args.name)
        else:
            if args.role is None:
                print("txcoord console-user add: give the user a --role (viewer or operator)", file=sys.stderr)
                return EXIT_USAGE
            if args.password_stdin:
                password = sys.stdin.readline().rstrip("\n")
            else:
                password = getpass.getpass(f"password for {args.name}: ")
                if getpass.getpass("again: ") != password:
                    print("txcoord console-user add: the passwords differ", file=sys.stderr)
                    return EXIT_USAGE
            users.add(args.name, args.role, password, storage=_settings(args.storage))
    except InvalidArgumentError as error:
        print(f"txcoord console-user {args.action}: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{'removed' if args.action == 'remove' else 'saved'} console user {args.name} in {users.path}")
    return EXIT_OK


def _console_extra():
    try:
        import coordinator.web as web
    except ModuleNotFoundError as error:
        raise ConfigError(f"the console needs its extra ({error.name} is missing): `pip install 'txcoord[console]'`") from None
    return web


def _users_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", default=None, help="coordinator TOML file (default: conf/coordinator.toml)")
    command.add_argument("--users", default=None, metavar="FILE",
                         help="the console's users file (default: console-users.toml beside the config file)")


def _users_file(args: argparse.Namespace) -> Path:
    from coordinator.config import DEFAULT_CONFIG_PATH

    return Path(args.users) if args.users else Path(args.config or DEFAULT_CONFIG_PATH).parent / "console-users.toml"


def _settings(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise InvalidArgumentError(f"a storage setting is KEY=VALUE, got {pair!r}")
        settings[key.strip()] = value
    return settings
