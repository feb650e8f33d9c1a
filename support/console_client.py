"""The web console as a script reaches it over HTTP: a real server (waitress, port 0) and a session
that signs in and posts forms with the CSRF token their page carries."""

from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import requests

from coordinator.config import CoordinatorConfig
from coordinator.web import console_server

_CSRF = re.compile(r'name="csrf_token" type="hidden" value="([^"]+)"')


@contextmanager
def running_console(config: CoordinatorConfig, users_file: Path) -> Iterator[str]:
    """A console on a free port of this machine for the whole block; yields its URL."""
    server = console_server(config, users_file, port=0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield server.url.rstrip("/")
    finally:
        server.close()
        thread.join(10)


class ConsoleSession:
    """One browser-like session: cookies kept, redirects not followed unless asked."""

    def __init__(self, url: str):
        self.url = url
        self.http = requests.Session()

    def get(self, path: str, **params) -> requests.Response:
        return self.http.get(self.url + path, params=params, allow_redirects=False, timeout=30)

    def csrf_token(self, path: str) -> str:
        """The token of the form on the page at ``path``."""
        page = self.get(path)
        assert page.status_code == 200, (path, page.status_code)
        return _CSRF.search(page.text).group(1)

    def post(self, path: str, data: dict, token: Optional[str] = None) -> requests.Response:
        """Post ``data`` with ``token`` (none: the form's own, read from the page at ``path``; "": no token)."""
        token = self.csrf_token(path) if token is None else token
        fields = data | ({"csrf_token": token} if token else {})
        return self.http.post(self.url + path, data=fields, allow_redirects=False, timeout=30)

    def sign_in(self, name: str, password: str) -> requests.Response:
        return self.post("/login", {"username": name, "password": password})


def signed_in(url: str, name: str, password: str) -> ConsoleSession:
    session = ConsoleSession(url)
    assert session.sign_in(name, password).status_code == 302
    return session
