"""Who may use the web console, and as what: a TOML file of users, their role and a password hash.

Two roles: a **viewer** reads every page; an **operator** may also end a transaction by hand
(commit or roll back a pending one, commit a discarded one). A user may carry storage
credentials of their own (``[users.NAME.storage]``, keys as the coordinator TOML's ``[storage]``):
the console then reads and writes the lakehouse as that principal, so what they see and do is what
the storage grants them, not only what the role allows.

The file is written by ``txcoord console-user`` (readable by its owner only); passwords are kept
as salted scrypt hashes (Werkzeug's), never in clear::

    [users.alice]
    role = "operator"
    password_hash = "scrypt:32768:8:1$…"

    [users.alice.storage]              # optional: alice's own S3 account
    aws_access_key_id = "…"
    aws_secret_access_key = "…"

Example::

    users = ConsoleUsers.load("conf/console-users.toml")
    users.add("alice", OPERATOR, "correct horse battery staple")
    users.authenticate("alice", "correct horse battery staple").role  # 'operator'
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Union

import tomli_w
from werkzeug.security import check_password_hash, generate_password_hash

from coordinator.exceptions import ConfigError, InvalidArgumentError

__all__ = ["MIN_PASSWORD_LENGTH", "OPERATOR", "ROLES", "VIEWER", "ConsoleUser", "ConsoleUsers"]

VIEWER, OPERATOR = "viewer", "operator"
ROLES = (VIEWER, OPERATOR)
MIN_PASSWORD_LENGTH = 12
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
# Checked against when the name is unknown, so that an unknown name takes as long to refuse as a wrong password.
_UNKNOWN_USER_HASH = generate_password_hash("no such user")


@dataclass(frozen=True)
class ConsoleUser:
    """One user of the console: a name, a role, and optionally storage credentials of their own."""

    name: str
    role: str
    password_hash: str = field(repr=False)
    storage: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def is_operator(self) -> bool:
        """Whether the role allows ending transactions by hand."""
        return self.role == OPERATOR


class ConsoleUsers:
    """The users file at ``path`` (missing: no users).

    Example::

        ConsoleUsers.load("conf/console-users.toml").names()  # ['alice', 'bob']
    """

    def __init__(self, path: Union[str, os.PathLike], users: Optional[Mapping[str, ConsoleUser]] = None):
        self.path = Path(path)
        self._users = dict(users or {})

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "ConsoleUsers":
        """Read the users file at ``path``; raise :class:`~coordinator.exceptions.ConfigError` if it is malformed."""
        path = Path(path)
        if not path.exists():
            return cls(path)
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{path}: not valid TOML: {error}") from None
        users = {}
        for name, entry in (raw.get("users") or {}).items():
            if not isinstance(entry, dict) or entry.get("role") not in ROLES or not isinstance(entry.get("password_hash"), str):
                raise ConfigError(f"{path}: user {name!r} needs a role ({' or '.join(ROLES)}) and a password_hash")
            storage = entry.get("storage") or {}
            if not isinstance(storage, dict) or not all(isinstance(v, str) for v in storage.values()):
                raise ConfigError(f"{path}: user {name!r}: storage is a table of strings")
            users[name] = ConsoleUser(name, entry["role"], entry["password_hash"], storage)
        return cls(path, users)

    def names(self) -> list[str]:
        """Every user's name, sorted."""
        return sorted(self._users)

    def get(self, name: str) -> Optional[ConsoleUser]:
        """The user called ``name``, or ``None``."""
        return self._users.get(name)

    def authenticate(self, name: str, password: str) -> Optional[ConsoleUser]:
        """The user called ``name`` if ``password`` is theirs, else ``None``.

        Example::

            users.authenticate("alice", "wrong")  # None
        """
        user = self._users.get(name)
        if not check_password_hash(user.password_hash if user else _UNKNOWN_USER_HASH, password or ""):
            return None
        return user

    def add(self, name: str, role: str, password: str, storage: Optional[Mapping[str, str]] = None) -> ConsoleUser:
        """Add ``name`` (or replace them) with ``role`` and ``password``, and save the file.

        Raises :class:`~coordinator.exceptions.InvalidArgumentError` for a bad name or role, or a
        password shorter than :data:`MIN_PASSWORD_LENGTH`.
        """
        if not _NAME.match(name or ""):
            raise InvalidArgumentError(f"a user name is 1 to 64 letters, digits, '.', '_', '@' or '-', got {name!r}")
        if role not in ROLES:
            raise InvalidArgumentError(f"a role is {' or '.join(ROLES)}, got {role!r}")
        if len(password or "") < MIN_PASSWORD_LENGTH:
            raise InvalidArgumentError(f"a password has at least {MIN_PASSWORD_LENGTH} characters")
        user = ConsoleUser(name, role, generate_password_hash(password), dict(storage or {}))
        self._users[name] = user
        self._save()
        return user

    def remove(self, name: str) -> None:
        """Remove ``name`` and save the file; raise :class:`~coordinator.exceptions.InvalidArgumentError` if unknown."""
        if self._users.pop(name, None) is None:
            raise InvalidArgumentError(f"no console user {name!r} in {self.path}")
        self._save()

    def _save(self) -> None:
        users = {}
        for user in self._users.values():
            users[user.name] = {"role": user.role, "password_hash": user.password_hash}
            if user.storage:
                users[user.name]["storage"] = dict(user.storage)
        text = "# The txcoord console's users: `txcoord console-user add NAME --role viewer|operator`.\n"
        text += tomli_w.dumps({"users": users})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Readable by its owner only, from the start: it holds password hashes and maybe storage credentials.
        handle, staged = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(staged, self.path)
