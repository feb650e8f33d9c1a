"""A fault-injecting HTTP proxy between an S3 client (obstore, delta-rs, the client under test) and the loopback
S3 server: the storage faults of ``txcoord conformance --object-store``, and of the tests, the benchmarks (their
latency) and the chaos harness. Its HTTP server and client are aiohttp's (txcoord's ``conformance`` extra).

mitmproxy, the well-kept tool for this, does not fit (mitmproxy 10 requires flask<3.1 while the
console pins flask 3.1.3; mitmproxy 11+ requires Python 3.12, we are on 3.11), and Toxiproxy works
at TCP level, so it cannot answer an HTTP 503 or drop one request's reply: the HTTP handling here
is aiohttp's, and this module is only the fault schedule and the forwarding.

Each request, in arrival order, draws once from a seeded ``random.Random`` (:class:`FaultSchedule`;
only those of the methods it is limited to, and only while it is enabled) and gets one of these,
or none:

- ``slowdown``: answered 503 with S3's ``SlowDown`` error, not forwarded;
- ``error``: answered 500 with S3's ``InternalError``, not forwarded;
- ``delay``: forwarded after ``delay_s`` seconds;
- ``reset``: the client's connection reset (TCP RST), no byte of reply, not forwarded;
- ``drop_reply``: forwarded, the server's whole reply awaited, then the client's connection
  closed (FIN) without a byte of it: the write happened and the client never learns it.

Forwarding is transparent to SigV4: the client's headers (its ``Host`` too) and body go to the
server unchanged, the path and query byte for byte, and nothing is added but a ``Content-Length:
0`` to a bodiless DELETE or POST that had none (aiohttp's client always sends one there; it means
the same, and no signature covers it); only the hop-by-hop headers (``Connection``,
``Transfer-Encoding``...) are each hop's own. The server's status, headers and body come back the
same way.

Apart from the faults, ``latency_s`` (``--latency-ms``) holds every request that long before it
is forwarded: an object store's round trip (S3 answers a small PUT in tens of milliseconds), where
the loopback server answers in well under one. Every request is counted by HTTP method and by
:func:`request_kind` (a listing is a GET of its own kind, a copy a PUT of its own), as an object
store bills them, and replies by status (a lost conditional write is a 412). With ``request_log``
(``--request-log``) each request is also written, as it ends, as one JSON line of that file: its
method, kind, percent-decoded path and query, status (or the fault that cut it short) and wall-clock
start and end, which tells where a client's time goes request by request (``bench/trigger_requests.py``).

``/_faults`` (no S3 request's path: a bucket name cannot start with ``_``) is the proxy's own:
``GET /_faults`` the counts, ``POST /_faults/disable`` and ``/_faults/enable`` the random
schedule off and on, ``POST /_faults/next`` with ``{"kind": "drop_reply", "method": "PUT",
"path_contains": "_delta_log/"}`` that fault for the next matching request, whatever the schedule.

Example::

    with FaultProxy(server.endpoint, seed=1, rates={"slowdown": 0.02, "drop_reply": 0.01}) as proxy:
        options = proxy.storage_options(server.storage_options)   # aws_endpoint: the proxy
        proxy.inject_next("drop_reply", method="PUT", path_contains="_delta_log/")
        ...
        proxy.counts()  # {"requests": 120, "forwarded": 118, "injected": {"slowdown": 2, ...},
                        #  "by_kind": {"GET": 40, "LIST": 12, "PUT": 60, ...}, ...}

    python -m coordinator.conformance.faults --upstream http://127.0.0.1:9000 --seed 1 \\
        --rates slowdown=0.02,error=0.01,delay=0.01,reset=0.01,drop_reply=0.01 --methods PUT
    python -m coordinator.conformance.faults --upstream http://127.0.0.1:9000 --latency-ms 25   # no faults, 25 ms a request
    # storage-faults: listening on http://127.0.0.1:41235      (the counts as JSON on SIGTERM)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import concurrent.futures
import json
import logging
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from typing import Iterable, Mapping, NamedTuple, Optional

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict
from yarl import URL

from coordinator.exceptions import ConformanceKitError, InvalidArgumentError

__all__ = ["KINDS", "REQUEST_KINDS", "FaultProxy", "FaultProxyProcess", "FaultSchedule", "main", "request_kind"]

_log = logging.getLogger("storage_faults")

#: The faults, in the order a draw of the schedule tries them.
KINDS = ("slowdown", "error", "delay", "reset", "drop_reply")
#: What an object store bills, by kind of request (:func:`request_kind`).
REQUEST_KINDS = ("GET", "HEAD", "LIST", "PUT", "COPY", "POST", "DELETE", "OTHER")
#: The faults after which the request still reaches the server.
_FORWARDED = (None, "delay", "drop_reply")
CONTROL_PATH = "/_faults"
#: Headers that concern one connection only (RFC 9110 7.6.1), never passed on.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                         "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"})
#: What aiohttp's client adds on its own unless told not to; a header the client did not sign, or
#: did not send, must not reach the server.
_NOT_ADDED = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
#: S3's own limit for one PUT; aiohttp's default (1 MiB) would refuse a Parquet file.
_MAX_BODY = 5 * 1024 ** 3
_SHUTDOWN_TIMEOUT_S = 5.0


def request_kind(method: str, query: Mapping[str, str], headers: Mapping[str, str]) -> str:
    """What an S3 request is, as S3 bills it: ``LIST`` for a GET of a bucket listing (``list-type``,
    ``prefix`` or ``delimiter`` in its query), ``COPY`` for a PUT with ``x-amz-copy-source``, otherwise its
    method (``GET``, ``HEAD``, ``PUT``, ``POST``, ``DELETE``), ``OTHER`` for any other.

    Example::

        request_kind("GET", {"list-type": "2", "prefix": "lh/_delta_log/"}, {})  # 'LIST'
        request_kind("PUT", {}, {"x-amz-copy-source": "/lakehouse/a"})          # 'COPY'
    """
    method = method.upper()
    if method == "GET" and any(key in query for key in ("list-type", "prefix", "delimiter")):
        return "LIST"
    if method == "PUT" and "x-amz-copy-source" in headers:
        return "COPY"
    return method if method in REQUEST_KINDS else "OTHER"


class FaultSchedule:
    """Which fault, if any, each request gets: one draw of ``random.Random(seed)`` per request
    whose method ``methods`` includes (all when ``None``), in the order they come; a request of
    another method gets none and draws nothing, so the n-th PUT's fate does not depend on the reads
    in between. ``rates`` are probabilities by kind (:data:`KINDS`), at most 1 in all.

    Example::

        schedule = FaultSchedule(seed=3, rates={"slowdown": 0.5}, methods=["PUT"])
        [schedule.draw("PUT") for _ in range(4)]  # ['slowdown', None, 'slowdown', None]
        schedule.draw("GET")                      # None
    """

    def __init__(self, seed: int = 0, rates: Optional[Mapping[str, float]] = None,
                 methods: Optional[Iterable[str]] = None):
        rates = dict(rates or {})
        unknown = set(rates) - set(KINDS)
        if unknown:
            raise InvalidArgumentError(f"unknown fault kind(s) {sorted(unknown)}: the kinds are {', '.join(KINDS)}")
        if any(not 0.0 <= rate <= 1.0 for rate in rates.values()) or sum(rates.values()) > 1.0:
            raise InvalidArgumentError(f"fault rates are probabilities, at most 1 in all: got {rates}")
        self.seed = seed
        self.rates = {kind: float(rates.get(kind, 0.0)) for kind in KINDS}
        self.methods = None if methods is None else frozenset(method.upper() for method in methods)
        self._random = random.Random(seed)

    def draw(self, method: str) -> Optional[str]:
        """The fault of the next request, of HTTP method ``method``, or ``None``."""
        if self.methods is not None and method.upper() not in self.methods:
            return None
        point, bound = self._random.random(), 0.0
        for kind in KINDS:
            bound += self.rates[kind]
            if point < bound:
                return kind
        return None


class _Queued(NamedTuple):
    kind: str
    method: Optional[str]
    path_contains: Optional[str]

    def matches(self, method: str, target: str) -> bool:
        return ((self.method is None or self.method == method.upper())
                and (self.path_contains is None or self.path_contains in target))


class FaultProxy:
    """The proxy, serving on its own thread and event loop while the ``with`` block runs, at
    ``.url`` (``port=0``: a free port). Forwards to ``upstream_url`` (``http://HOST:PORT``).
    In this process: for clients that release the GIL while they wait (obstore, HTTP libraries);
    beside delta-rs, use :class:`FaultProxyProcess`.

    ``seed``, ``rates`` and ``methods`` make its :class:`FaultSchedule` (no random faults by
    default); ``delay_s`` is a ``delay`` fault's wait; ``latency_s`` is added to every request, faults
    or not (an object store's round trip). ``request_log``: a file each request is appended to, one
    JSON line as it ends (see the module's documentation). Every method may be called from any thread.

    Example::

        with FaultProxy("http://127.0.0.1:9000", seed=1, rates={"error": 0.1}, methods=["PUT"]) as proxy:
            store = S3Store("lakehouse", config=proxy.storage_options(server.storage_options), ...)
            proxy.disable()                  # the random schedule off: does the product recover?
            proxy.inject_next("reset", method="GET")
            proxy.counts()["injected"]       # {"slowdown": 0, "error": 3, "delay": 0, "reset": 1, ...}
    """

    def __init__(self, upstream_url: str, seed: int = 0, rates: Optional[Mapping[str, float]] = None,
                 delay_s: float = 2.0, methods: Optional[Iterable[str]] = None, host: str = "127.0.0.1",
                 port: int = 0, latency_s: float = 0.0, request_log: Optional[str] = None,
                 bandwidth_bytes_s: float = 0.0):
        if latency_s < 0:
            raise InvalidArgumentError(f"a latency is at least 0 s, got {latency_s}")
        if bandwidth_bytes_s < 0:
            raise InvalidArgumentError(f"a bandwidth is at least 0 (none: no limit), got {bandwidth_bytes_s}")
        self.bandwidth_bytes_s = bandwidth_bytes_s
        self._link = _Link(bandwidth_bytes_s) if bandwidth_bytes_s else None
        self._body_bytes = 0
        self.upstream_url = upstream_url.rstrip("/")
        self.request_log = request_log
        self._request_log = None
        self.delay_s = delay_s
        self.latency_s = latency_s
        self.host, self.port = host, port
        self.url: Optional[str] = None
        self._schedule = FaultSchedule(seed, rates, methods)
        self._lock = threading.Lock()
        self._enabled = True
        self._queued: list[_Queued] = []
        self._requests = self._forwarded = 0
        self._injected: Counter = Counter()
        self._by_method: Counter = Counter()
        self._by_kind: Counter = Counter()
        self._by_status: Counter = Counter()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._session: Optional[aiohttp.ClientSession] = None

    def counts(self) -> dict:
        """What ``GET /_faults`` answers: requests proxied (``/_faults`` aside), those forwarded to
        the server (``delay`` and ``drop_reply`` among them), faults injected by kind, requests by
        HTTP method and by :func:`request_kind`, the server's replies by status, the bytes of the bodies forwarded
        both ways (``body_bytes``), the schedule, the added latency and bandwidth, and the faults :meth:`inject_next` queued that no request has had yet, in all and by
        their ``path_contains`` (``""`` for any path)."""
        with self._lock:
            return {"requests": self._requests, "forwarded": self._forwarded,
                    "injected": {kind: self._injected[kind] for kind in KINDS},
                    "by_method": dict(self._by_method), "by_kind": {kind: self._by_kind[kind] for kind in REQUEST_KINDS},
                    "by_status": {str(status): count for status, count in sorted(self._by_status.items())},
                    "body_bytes": self._body_bytes, "latency_s": self.latency_s,
                    "bandwidth_bytes_s": self.bandwidth_bytes_s, "enabled": self._enabled,
                    "seed": self._schedule.seed, "rates": dict(self._schedule.rates),
                    "methods": None if self._schedule.methods is None else sorted(self._schedule.methods),
                    "queued": len(self._queued),
                    "queued_by_path": dict(Counter(queued.path_contains or "" for queued in self._queued))}

    def enable(self) -> None:
        """Turn the random schedule back on."""
        with self._lock:
            self._enabled = True

    def disable(self) -> None:
        """Turn the random schedule off: requests go through, except those :meth:`inject_next` names."""
        with self._lock:
            self._enabled = False

    def inject_next(self, kind: str, method: Optional[str] = None, path_contains: Optional[str] = None) -> None:
        """Give fault ``kind`` to the next request of ``method`` (any if ``None``) whose path and
        query, percent-decoded (``/lakehouse/lh/_delta_log/00000000000000000003.json``, a listing's
        ``/lakehouse?list-type=2&prefix=lh/_delta_log/``), contain ``path_contains`` (any if ``None``),
        whatever the schedule says and whether or not it is enabled. Queued ones are served in order."""
        if kind not in KINDS:
            raise InvalidArgumentError(f"unknown fault kind {kind!r}: the kinds are {', '.join(KINDS)}")
        with self._lock:
            self._queued.append(_Queued(kind, None if method is None else method.upper(), path_contains))

    def storage_options(self, direct: Mapping[str, str]) -> dict[str, str]:
        """The storage options ``direct`` (an S3 server's, e.g. ``S3Server.storage_options``) with
        ``aws_endpoint`` this proxy."""
        if self.url is None:
            raise ConformanceKitError("the proxy is not running: use it as a context manager")
        return dict(direct, aws_endpoint=self.url)

    def __enter__(self) -> "FaultProxy":
        if self.request_log is not None:
            self._request_log = open(self.request_log, "a", buffering=1)  # a line each: readable while it runs
        started: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="storage-faults", daemon=True)
        self._thread.start()
        self.url = started.result()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        if self._request_log is not None:
            self._request_log.close()

    def _serve(self, started: concurrent.futures.Future) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            runner = loop.run_until_complete(self._start())
        except BaseException as error:
            if self._session is not None:
                loop.run_until_complete(self._session.close())
            loop.close()
            started.set_exception(error)
            return
        host, port = runner.addresses[0][:2]
        started.set_result(f"http://{host}:{port}")
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.run_until_complete(self._session.close())
        loop.close()

    async def _start(self) -> web.AppRunner:
        # No cookie jar: a Set-Cookie of the server must not become a Cookie the client never sent.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            skip_auto_headers=_NOT_ADDED, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_get(CONTROL_PATH, self._get_counts)
        app.router.add_post(f"{CONTROL_PATH}/enable", self._post_enable)
        app.router.add_post(f"{CONTROL_PATH}/disable", self._post_disable)
        app.router.add_post(f"{CONTROL_PATH}/next", self._post_next)
        app.router.add_route("*", "/{path:.*}", self._proxy)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        return runner

    async def _get_counts(self, request: web.Request) -> web.Response:
        return web.json_response(self.counts())

    async def _post_enable(self, request: web.Request) -> web.Response:
        self.enable()
        return web.json_response(self.counts())

    async def _post_disable(self, request: web.Request) -> web.Response:
        self.disable()
        return web.json_response(self.counts())

    async def _post_next(self, request: web.Request) -> web.Response:
        try:
            asked = await request.json()
            self.inject_next(asked["kind"], asked.get("method"), asked.get("path_contains"))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return web.json_response({"error": f"expected {{\"kind\": ...}} with kind one of {list(KINDS)}, "
                                               f"optionally \"method\" and \"path_contains\": {error!r}"}, status=400)
        return web.json_response(self.counts())

    def _fault_for(self, method: str, target: str, kind_of_request: str) -> Optional[str]:
        """This request's fault, counted with the request; the schedule is drawn even when a queued
        fault wins, so that queueing one does not shift the schedule's later draws."""
        with self._lock:
            self._by_method[method.upper()] += 1
            self._by_kind[kind_of_request] += 1
            kind = self._schedule.draw(method) if self._enabled else None
            for index, queued in enumerate(self._queued):
                if queued.matches(method, target):
                    kind = queued.kind
                    del self._queued[index]
                    break
            self._requests += 1
            if kind in _FORWARDED:
                self._forwarded += 1
            if kind is not None:
                self._injected[kind] += 1
        return kind

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        if self._request_log is None:
            return await self._forward(request)
        started = time.time()
        response = await self._forward(request)
        target = urllib.parse.unquote(request.path + (f"?{request.query_string}" if request.query_string else ""))
        self._request_log.write(json.dumps({
            "start": started, "end": time.time(), "method": request.method,
            "kind": request_kind(request.method, request.query, request.headers), "path": target,
            "status": response.status if response.status != 599 else "aborted"}) + "\n")
        return response

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        kind = self._fault_for(request.method, request.path + (f"?{request.query_string}" if request.query_string else ""),
                               request_kind(request.method, request.query, request.headers))
        # The whole request is read first: a fault then hits a request fully sent, awaiting its reply.
        body = await request.read()
        if kind is not None:
            _log.info("%s %s: %s", request.method, request.raw_path, kind)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if kind == "slowdown":
            return _s3_error(503, "SlowDown", "Please reduce your request rate.")
        if kind == "error":
            return _s3_error(500, "InternalError", "We encountered an internal error. Please try again.")
        if kind == "reset":
            return _abort(request, reset=True)
        if kind == "delay":
            await asyncio.sleep(self.delay_s)
        assert self._session is not None
        # encoded=True: the path and query go on byte for byte, as the client signed them.
        upstream = URL(self.upstream_url + request.raw_path, encoded=True)
        try:
            async with self._session.request(request.method, upstream, headers=_end_to_end(request.headers),
                                             data=body or None, allow_redirects=False) as reply:
                data = await reply.read()
                status, reason, headers = reply.status, reply.reason, _end_to_end(reply.headers)
        except aiohttp.ClientError as error:
            _log.warning("%s %s: the server did not answer: %r", request.method, request.raw_path, error)
            return web.Response(status=502, text=f"{error!r}\n")
        carried = len(body) + len(data)
        with self._lock:
            self._by_status[status] += 1
            self._body_bytes += carried
        if self._link is not None:
            await self._link.carry(carried)
        if kind == "drop_reply":
            return _abort(request, reset=False)
        if hdrs.CONTENT_LENGTH not in headers and request.method != hdrs.METH_HEAD:
            headers[hdrs.CONTENT_LENGTH] = str(len(data))  # the server's reply was chunked
        # A StreamResponse keeps the server's Content-Length as it is, a HEAD's (the object's size) too,
        # where a web.Response would set it to its own body's length.
        response = web.StreamResponse(status=status, reason=reason, headers=headers)
        await response.prepare(request)
        await response.write_eof(data)
        return response


class _Link:
    """A link of ``bytes_s`` bytes a second shared evenly by the transfers on it at each moment, as TCP flows share
    a machine's network: a small request beside a large read waits for its own bytes, not for the read's."""

    def __init__(self, bytes_s: float):
        self.bytes_s = bytes_s
        self._left: dict[asyncio.Future, float] = {}  # each transfer under way: its bytes not carried yet
        self._changed: Optional[asyncio.Event] = None
        self._carrier: Optional[asyncio.Task] = None

    async def carry(self, size: int) -> None:
        """Return once ``size`` bytes have crossed the link beside whatever else crosses it."""
        if size <= 0:
            return
        if self._changed is None:
            self._changed = asyncio.Event()
        done = asyncio.get_running_loop().create_future()
        self._left[done] = float(size)
        self._changed.set()
        if self._carrier is None or self._carrier.done():
            self._carrier = asyncio.ensure_future(self._carry_all())
        await done

    async def _carry_all(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._changed is not None
        while self._left:
            self._changed.clear()
            sharing = list(self._left)  # one arriving while they share it has carried nothing yet
            share = self.bytes_s / len(sharing)  # each transfer's rate while this many share the link
            started = loop.time()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(self._left.values()) / share)
            carried = (loop.time() - started) * share
            for done in sharing:
                self._left[done] -= carried
                if self._left[done] <= 1e-6:
                    del self._left[done]
                    if not done.done():
                        done.set_result(None)


class FaultProxyProcess:
    """:class:`FaultProxy` in a process of its own (this module's command line), steered over
    ``/_faults``: the same ``url``, ``counts``, ``enable``, ``disable``, ``inject_next`` and
    ``storage_options``.

    The one to use beside delta-rs: its Rust calls hold the GIL while they wait for a reply, so an
    in-process proxy, a Python thread of the same process, could never answer them (each request
    then times out after 30 s).

    Example::

        with FaultProxyProcess(server.endpoint, seed=3, rates={"drop_reply": 0.01}) as proxy:
            lakehouse = Lakehouse(root, proxy.storage_options(server.storage_options))
    """

    def __init__(self, upstream_url: str, seed: int = 0, rates: Optional[Mapping[str, float]] = None,
                 delay_s: float = 2.0, methods: Optional[Iterable[str]] = None, log_path: Optional[str] = None,
                 latency_s: float = 0.0, request_log: Optional[str] = None, bandwidth_bytes_s: float = 0.0):
        FaultSchedule(seed, rates, methods)  # a bad rate or kind is refused here, not in the child
        if latency_s < 0:
            raise InvalidArgumentError(f"a latency is at least 0 s, got {latency_s}")
        if bandwidth_bytes_s < 0:
            raise InvalidArgumentError(f"a bandwidth is at least 0 (none: no limit), got {bandwidth_bytes_s}")
        self._argv = [sys.executable, "-m", __name__, "--upstream", upstream_url, "--seed", str(seed),
                      "--delay-s", str(delay_s), "--latency-ms", repr(latency_s * 1000),
                      "--bandwidth-mb-s", repr(bandwidth_bytes_s / 1e6)]
        if rates:
            self._argv += ["--rates", ",".join(f"{kind}={rate}" for kind, rate in rates.items())]
        if methods:
            self._argv += ["--methods", ",".join(methods)]
        if request_log:
            self._argv += ["--request-log", request_log]
        self._log_path = log_path
        self._process: Optional[subprocess.Popen] = None
        self.url: Optional[str] = None
        #: The counts the child printed as it stopped (after the ``with`` block).
        self.final_counts: Optional[dict] = None

    def __enter__(self) -> "FaultProxyProcess":
        log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL
        self._process = subprocess.Popen(self._argv, stdout=subprocess.PIPE, stderr=log, text=True)
        line = self._process.stdout.readline()
        if not line.startswith("storage-faults: listening on "):
            self._process.kill()
            raise ConformanceKitError(f"the storage-fault proxy did not start: {line!r}")
        self.url = line.split("listening on ", 1)[1].strip()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGTERM)
        out, _ = self._process.communicate(timeout=30)
        self.final_counts = json.loads(out.strip().splitlines()[-1]) if out.strip() else None

    def counts(self) -> dict:
        return self._control("GET", "")

    def enable(self) -> None:
        self._control("POST", "/enable")

    def disable(self) -> None:
        self._control("POST", "/disable")

    def inject_next(self, kind: str, method: Optional[str] = None, path_contains: Optional[str] = None) -> None:
        if kind not in KINDS:
            raise InvalidArgumentError(f"unknown fault kind {kind!r}: the kinds are {', '.join(KINDS)}")
        self._control("POST", "/next", {"kind": kind, "method": method, "path_contains": path_contains})

    def storage_options(self, direct: Mapping[str, str]) -> dict[str, str]:
        if self.url is None:
            raise ConformanceKitError("the proxy is not running: use it as a context manager")
        return dict(direct, aws_endpoint=self.url)

    def _control(self, method: str, path: str, payload: Optional[dict] = None) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.url}{CONTROL_PATH}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())


def _end_to_end(headers: Mapping[str, str]) -> CIMultiDict:
    """``headers`` (every value of each, in order) less the hop-by-hop ones, and those ``Connection`` names."""
    named = {token.strip().lower() for value in headers.getall(hdrs.CONNECTION, ()) for token in value.split(",")}
    return CIMultiDict((name, value) for name, value in headers.items()
                       if name.lower() not in _HOP_BY_HOP and name.lower() not in named)


def _s3_error(status: int, code: str, message: str) -> web.Response:
    return web.Response(status=status, content_type="application/xml",
                        text=f'<?xml version="1.0" encoding="UTF-8"?>\n'
                             f"<Error><Code>{code}</Code><Message>{message}</Message></Error>")


def _abort(request: web.Request, reset: bool) -> web.Response:
    """Close the client's connection at once, no byte of a reply sent: with ``reset``, by a TCP RST
    (linger on, for 0 s), else by a FIN. The two reach the client as different errors (a connection
    reset, an incomplete message), and a real network gives both. The response returned is never
    written; aiohttp only needs one."""
    transport = request.transport
    if transport is not None:
        if reset:
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return web.Response(status=599)


def _rates(text: str) -> dict[str, float]:
    """``slowdown=0.02,error=0.01`` as ``{"slowdown": 0.02, "error": 0.01}``."""
    try:
        return {kind.strip(): float(rate) for kind, rate in (pair.split("=") for pair in text.split(",") if pair)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KIND=RATE,... (kinds: {', '.join(KINDS)}), got {text!r}") from None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the S3 server, e.g. http://127.0.0.1:9000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 (the default): a free port")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rates", type=_rates, default={},
                        help=f"KIND=PROBABILITY,... of {', '.join(KINDS)} (default: no random faults)")
    parser.add_argument("--delay-s", type=float, default=2.0, help="a delay fault's wait (default 2)")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="milliseconds added to every request, faults or not: an object store's round trip "
                             "(default 0)")
    parser.add_argument("--bandwidth-mb-s", type=float, default=0.0,
                        help="megabytes (10^6 bytes) a second the request and reply bodies share: a client's link "
                             "(default 0: no limit)")
    parser.add_argument("--methods", type=lambda text: [m for m in text.split(",") if m],
                        help="only these HTTP methods get random faults, e.g. PUT,POST (default: all)")
    parser.add_argument("--request-log", default=None,
                        help="append each request to this file as it ends, one JSON line: method, kind, path, "
                             "status, wall-clock start and end")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        proxy = FaultProxy(args.upstream, seed=args.seed, rates=args.rates, delay_s=args.delay_s,
                           methods=args.methods, host=args.host, port=args.port, latency_s=args.latency_ms / 1000,
                           request_log=args.request_log, bandwidth_bytes_s=args.bandwidth_mb_s * 1e6)
    except ValueError as error:
        parser.error(str(error))
    stop = {signal.SIGTERM, signal.SIGINT}
    # Blocked before the server's thread starts, which inherits the mask: only sigwait below takes them.
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    with proxy:
        print(f"storage-faults: listening on {proxy.url}", flush=True)
        signal.sigwait(stop)
    print(json.dumps(proxy.counts()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
