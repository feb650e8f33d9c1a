"""Watching the checker as operators do: its Prometheus endpoint scraped, the web console open in a browser
(``txcoord console`` run as a process of its own).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from support.environment import REPO_ROOT
from support.processes import Job

__all__ = ["ConsoleBrowser", "ConsoleJob", "MetricsScraper"]

#: What ``txcoord console`` prints once it listens (coordinator/cli/console.py).
CONSOLE_LINE = re.compile(rb"txcoord console: (http://\S+/) ")
_CSRF_INPUT = re.compile(r'<input[^>]*\bname="csrf_token"[^>]*>')
_VALUE = re.compile(r'\bvalue="([^"]*)"')
_META_REFRESH = re.compile(r'<meta[^>]*http-equiv="refresh"[^>]*content="(\d+(?:\.\d+)?)', re.IGNORECASE)
_IMG_SRC = re.compile(r'<img[^>]*\bsrc="([^"]+)"')


class ConsoleJob(Job):
    """``txcoord console`` (the operators' web console) on a coordinator TOML, as a process of its own on
    any free loopback port, with a viewer created for it (a random password) in ``console-users.toml``
    beside the TOML; its output goes to ``log_path``. Stopped as systemd stops it (SIGTERM: the server closes,
    exit 0), SIGKILL after a timeout.

    Example::

        with ConsoleJob(checker.config_path, "/tmp/console.log") as console:
            console.wait_ready(60)   # console.url: 'http://127.0.0.1:41234/'
            ConsoleBrowser(console.url, console.username, console.password).sign_in()
    """

    USERNAME = "bench-viewer"

    def __init__(self, config_path: str, log_path: str, refresh_s: int = 5):
        import secrets

        txcoord = [sys.executable, "-m", "coordinator"]  # the txcoord command line of this interpreter
        self.users_path = os.path.join(os.path.dirname(config_path), "console-users.toml")
        self.username, self.password = self.USERNAME, secrets.token_urlsafe(18)
        added = subprocess.run([*txcoord, "console-user", "add", self.username, "--role", "viewer", "--password-stdin",
                                "--config", config_path, "--users", self.users_path],
                               input=self.password + "\n", text=True, capture_output=True, cwd=REPO_ROOT)
        if added.returncode != 0:
            raise RuntimeError(f"txcoord console-user add exited with {added.returncode}: {added.stderr.strip()}")
        super().__init__([*txcoord, "console", "--config", config_path, "--users", self.users_path, "--port", "0",
                          "--refresh", str(refresh_s)], log_path)
        self.url: Optional[str] = None
        self.start()

    def wait_ready(self, timeout_s: float) -> str:
        """Wait for the console to say where it listens; return that URL."""
        found = self.wait_for(lambda: CONSOLE_LINE.search(Path(self.log_path).read_bytes()), "listening", timeout_s,
                              poll_s=0.2)
        self.url = found.group(1).decode()
        return self.url

    def cpu_seconds(self) -> Optional[float]:
        """User and system CPU seconds the console process has used so far (``/proc``), None once it is gone."""
        try:
            with open(f"/proc/{self.process.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, as systemd stops it (the console closes its server and exits 0); SIGKILL after ``timeout_s``."""
        return super().stop(timeout_s)


class _Observer(threading.Thread):
    """A thread that repeats :meth:`observe` until :meth:`stop`, counting the attempts and the failed
    ones (the first few errors kept) and keeping each successful one's duration in seconds and each
    attempt's span. An attempt is tried again at once up to ``retries`` times before it counts as failed
    (``retried`` counts those tries)."""

    #: Errors kept for the report (the count has them all).
    KEPT_ERRORS = 5

    def __init__(self, name: str, timeout_s: float, retries: int = 0):
        super().__init__(name=name, daemon=True)
        import requests

        self.session = requests.Session()
        self.timeout_s, self.retries = timeout_s, retries
        self.attempts = 0
        self.failures = 0
        self.retried = 0
        self.seconds: list[float] = []  # of the try that succeeded
        self.spans: list[tuple[float, float]] = []  # time.monotonic() at each attempt's start and end, tries included
        self.errors: list[str] = []
        self._halt = threading.Event()

    def observe(self) -> None:
        raise NotImplementedError

    def attempt(self) -> bool:
        """One :meth:`observe` (tried up to ``retries`` more times while it fails), timed and counted;
        whether it succeeded."""
        began, succeeded = time.monotonic(), False
        for tries_left in range(self.retries, -1, -1):
            started = time.perf_counter()
            try:
                self.observe()
            except Exception as error:  # a failure to count once no try is left, not to stop on
                if tries_left:
                    self.retried += 1
                    continue
                self.failures += 1
                if len(self.errors) < self.KEPT_ERRORS:
                    self.errors.append(f"{type(error).__name__}: {error}")
            else:
                self.seconds.append(time.perf_counter() - started)
                succeeded = True
            break
        self.attempts += 1
        self.spans.append((began, time.monotonic()))
        return succeeded

    def stop(self) -> None:
        """Stop repeating (:meth:`attempt` may still be called)."""
        self._halt.set()
        if self.is_alive():
            self.join()


class MetricsScraper(_Observer):
    """Scrapes a Prometheus endpoint every ``interval_s`` on a fixed schedule, as Prometheus does (a scrape
    that overruns is followed at once by the next), keeping the last successful scrape's text. A scrape
    that fails is tried again up to ``retries`` times first: one lost to a busy moment is not the
    endpoint failing.

    Example::

        scraper = MetricsScraper("http://127.0.0.1:9464/metrics")
        scraper.start(); ...; scraper.stop()
        scraper.attempts, scraper.failures, scraper.value("txcoord_messages_delivered_total")
    """

    def __init__(self, url: str, interval_s: float = 1.0, timeout_s: float = 5.0, retries: int = 2):
        super().__init__("metrics-scraper", timeout_s, retries)
        self.url, self.interval_s = url, interval_s
        self.last_text: Optional[str] = None

    def observe(self) -> None:
        response = self.session.get(self.url, timeout=self.timeout_s)
        response.raise_for_status()
        self.last_text = response.text

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._halt.is_set():
            self.attempt()
            next_at = max(next_at + self.interval_s, time.monotonic())
            self._halt.wait(next_at - time.monotonic())

    def value(self, sample: str) -> Optional[float]:
        """The sum of the last successful scrape's samples named ``sample`` over their labels (``None``: no
        such sample, or no scrape yet)."""
        from prometheus_client.parser import text_string_to_metric_families

        if self.last_text is None:
            return None
        values = [s.value for family in text_string_to_metric_families(self.last_text) for s in family.samples
                  if s.name == sample]
        return sum(values) if values else None


class ConsoleBrowser(_Observer):
    """A browser with the console's overview open: signed in once (:meth:`sign_in`: the form's hidden
    ``csrf_token`` posted back with the session cookie), it loads ``url`` and every image the page embeds
    (its charts), one after the other, then loads them again when the page's meta refresh says, counted
    from the end of the load as a browser counts it, until stopped. A load fails on an error, a status
    other than 200, being sent back to the sign-in page, a page with no image or an image that is not SVG;
    a successful load's duration is the page's and its images'.

    Example::

        browser = ConsoleBrowser("http://127.0.0.1:8470/", "viewer", "a long password")
        browser.sign_in(); browser.start(); ...; browser.stop()
        browser.attempts, browser.failures, browser.refresh_s, browser.images, browser.by_path["/"]
    """

    def __init__(self, url: str, username: str, password: str, refresh_s: float = 5.0, timeout_s: float = 30.0):
        super().__init__("console-browser", timeout_s)
        self.url, self.username, self.password = url, username, password
        self.refresh_s = refresh_s  # until the page says otherwise
        self.images: Optional[int] = None  # images the last successful load fetched
        self.by_path: dict[str, list[float]] = {}  # path → seconds of each successful request of a load

    def sign_in(self) -> None:
        """Sign in through ``/login``'s form; raises ``RuntimeError`` if refused."""
        import html
        from urllib.parse import urljoin, urlparse

        login = urljoin(self.url, "login")
        page = self._get(login, "text/html", allow_login=True)
        field = _CSRF_INPUT.search(page.text)
        token = _VALUE.search(field.group(0)) if field else None
        if token is None:
            raise RuntimeError(f"no csrf_token input on {login}")
        signed = self.session.post(login, timeout=self.timeout_s, data={
            "username": self.username, "password": self.password, "csrf_token": html.unescape(token.group(1))})
        if signed.status_code != 200 or urlparse(signed.url).path == "/login":
            raise RuntimeError(f"the console refused the sign-in of {self.username}: HTTP {signed.status_code} "
                               f"at {signed.url}")

    def _get(self, url: str, content_type: str, allow_login: bool = False):
        from urllib.parse import urlparse

        started = time.perf_counter()
        response = self.session.get(url, timeout=self.timeout_s)
        seconds = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code} for {url}")
        if not allow_login and urlparse(response.url).path == "/login":
            raise RuntimeError(f"{url} led to the sign-in page: signed out")
        if not response.headers.get("Content-Type", "").startswith(content_type):
            raise RuntimeError(f"{url} is {response.headers.get('Content-Type')!r}, not {content_type}")
        if not allow_login:
            self.by_path.setdefault(urlparse(url).path, []).append(seconds)
        return response

    def observe(self) -> None:
        import html
        from urllib.parse import urljoin

        page = self._get(self.url, "text/html")
        refresh = _META_REFRESH.search(page.text)
        if refresh:
            self.refresh_s = float(refresh.group(1))
        images = [urljoin(page.url, html.unescape(src)) for src in _IMG_SRC.findall(page.text)]
        if not images:
            raise RuntimeError(f"{self.url} embeds no chart")
        for image in images:
            self._get(image, "image/svg+xml")
        self.images = len(images)

    def run(self) -> None:
        while not self._halt.is_set():
            self.attempt()
            self._halt.wait(self.refresh_s)

