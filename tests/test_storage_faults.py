"""The storage-fault proxy (``coordinator/conformance/faults.py``): transparent forwarding, each fault as an
S3 client sees it, and the seeded schedule. The client is obstore, configured as
``coordinator.storage.ObjectFileStore`` configures it, with its retries off so that each fault
reaches the test as it reached the client; the server is the loopback versitygw."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, GenericError, PreconditionError
from obstore.store import S3Store


from coordinator.conformance.faults import KINDS, FaultProxy, FaultSchedule, request_kind

DELAY_S = 0.5
#: Each fault reaches the test as the client got it: obstore tries once, gives up at the first error.
NO_RETRIES = {"max_retries": 0, "retry_timeout": dt.timedelta(seconds=5)}


def s3_store(options: dict[str, str], prefix: str) -> S3Store:
    """obstore's client of bucket ``lakehouse`` under ``prefix``, as ``ObjectFileStore`` builds it."""
    config = {key: value for key, value in options.items() if key != "aws_allow_http"}
    return S3Store("lakehouse", prefix=prefix, config=config,
                   client_options={"allow_http": options["aws_allow_http"] == "true"}, retry_config=NO_RETRIES)


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server.endpoint, delay_s=DELAY_S) as running:
        yield running


@pytest.fixture
def stores(s3_server, proxy):
    """``(through the proxy, straight to the server)``, both under the same fresh prefix."""
    prefix = uuid.uuid4().hex
    return s3_store(proxy.storage_options(s3_server.storage_options), prefix), s3_store(s3_server.storage_options, prefix)


def written(store: S3Store, key: str) -> bytes | None:
    try:
        return bytes(obstore.get(store, key).bytes())
    except FileNotFoundError:
        return None


class Recorder(BaseHTTPRequestHandler):
    """An HTTP server that keeps each request exactly as it arrived (request line, headers in order,
    body) and answers 200 with a duplicated header, ``Content-Length: 5`` and, unless HEAD, ``hello``."""

    protocol_version = "HTTP/1.1"
    received: list[tuple[str, str, list[tuple[str, str]], bytes]] = []

    def do_any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.received.append((self.command, self.path, list(self.headers.items()), body))
        self.send_response(200)
        self.send_header("ETag", '"e1"')
        self.send_header("x-amz-meta-twice", "one")
        self.send_header("x-amz-meta-twice", "two")
        self.send_header("Content-Length", "5")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b"hello")

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_any

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def recorder():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def send(url: str, method: str, target: str, headers: list[tuple[str, str]], body: bytes = b"") -> http.client.HTTPResponse:
    """One request with exactly ``headers`` (http.client adds no Host, Accept-Encoding or anything else)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
    for name, value in headers:
        connection.putheader(name, value)
    connection.endheaders(body or None)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_the_schedule_draws_the_same_faults_for_the_same_seed():
    rates = {"slowdown": 0.1, "error": 0.05, "delay": 0.05, "reset": 0.1, "drop_reply": 0.2}
    methods = ["PUT", "GET", "HEAD", "PUT", "POST", "DELETE", "GET"] * 300

    def drawn(seed: int, **options) -> list:
        schedule = FaultSchedule(seed, rates, **options)
        return [schedule.draw(method) for method in methods]

    assert drawn(7) == drawn(7)
    assert drawn(7) != drawn(8)
    frequencies = Counter(drawn(7))
    for kind, rate in rates.items():
        assert abs(frequencies[kind] / len(methods) - rate) < 0.03, (kind, frequencies)
    assert abs(frequencies[None] / len(methods) - 0.5) < 0.03

    # Only PUTs faulted, and only they draw: the n-th PUT's fate is the n-th draw, whatever came between.
    only_puts = drawn(7, methods=["put"])
    assert {fault for method, fault in zip(methods, only_puts) if method != "PUT"} == {None}
    puts = FaultSchedule(7, rates)
    assert [fault for method, fault in zip(methods, only_puts) if method == "PUT"] == \
           [puts.draw("PUT") for method in methods if method == "PUT"]

    with pytest.raises(ValueError, match="unknown fault kind"):
        FaultSchedule(0, {"slow": 0.1})
    with pytest.raises(ValueError, match="at most 1"):
        FaultSchedule(0, {"slowdown": 0.6, "error": 0.6})


def test_requests_and_replies_pass_unchanged(recorder):
    with FaultProxy(recorder) as proxy:
        host = proxy.url.removeprefix("http://")
        # Percent-encodings as the client wrote them (a lowercase %2f, an escaped '=', '+' for a
        # space in a query), a continuation token: all signed, all to arrive byte for byte.
        target = "/lakehouse/a%20b/c%25d%3De%2f.json?list-type=2&prefix=a%2Fb+c&continuation-token=x%2By%3D%3D"
        headers = [("Host", host), ("x-amz-date", "20261124T120000Z"), ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
                   ("Authorization", "AWS4-HMAC-SHA256 Credential=k/20261124/us-east-1/s3/aws4_request"),
                   ("x-amz-meta-twice", "one"), ("x-amz-meta-twice", "two"), ("Content-Length", "6"),
                   ("Connection", "keep-alive, x-hop"), ("x-hop", "this hop only"), ("Keep-Alive", "timeout=5")]
        Recorder.received.clear()
        reply = send(proxy.url, "PUT", target, headers, b"\x00body\xff")
        head = send(proxy.url, "HEAD", "/lakehouse/k", [("Host", host)])

    [(method, path, received, body), (_, _, head_received, _)] = Recorder.received
    assert (method, path, body) == ("PUT", target, b"\x00body\xff")
    # Nothing added (no User-Agent, Accept, Accept-Encoding or Content-Type of aiohttp's), the
    # duplicate kept in order, the hop-by-hop ones (and the one Connection names) dropped.
    assert [(name.lower(), value) for name, value in received] == \
           [(name.lower(), value) for name, value in headers[:7]]
    assert [(name.lower(), value) for name, value in head_received] == [("host", host)]
    assert (reply.status, reply.headers.get_all("x-amz-meta-twice"), reply.headers["ETag"]) == (200, ["one", "two"], '"e1"')
    # A HEAD's Content-Length is the object's size, though no body comes with it.
    assert (head.status, head.headers["Content-Length"]) == (200, "5")


def test_s3_requests_through_the_proxy_get_what_they_get_directly(stores, proxy):
    via, direct = stores
    keys = ["a b/c%d=e.json", "a b/plain.json", "a b/sub/deeper.json", "other/x+y.json"]
    for key in keys:
        obstore.put(via, key, f"content of {key}".encode())

    for key in keys:
        assert written(via, key) == written(direct, key) == f"content of {key}".encode()
        through, straight = obstore.head(via, key), obstore.head(direct, key)
        assert through == straight and through["size"] == len(f"content of {key}")
    assert sorted(m["path"] for batch in obstore.list(via, "a b/") for m in batch) == sorted(keys[:3])
    through, straight = obstore.list_with_delimiter(via, "a b/"), obstore.list_with_delimiter(direct, "a b/")
    assert through == straight
    assert sorted(m["path"] for m in through["objects"]) == ["a b/c%d=e.json", "a b/plain.json"]
    assert through["common_prefixes"] == ["a b/sub"]

    created = obstore.put(via, "once.json", b"first", mode="create")
    with pytest.raises((AlreadyExistsError, PreconditionError)):
        obstore.put(via, "once.json", b"second", mode="create")
    assert written(direct, "once.json") == b"first" and obstore.head(direct, "once.json")["e_tag"] == created["e_tag"]

    counts = proxy.counts()
    assert counts["requests"] == counts["forwarded"] > 0 and set(counts["injected"].values()) == {0}


@pytest.mark.parametrize("kind, status, code", [("slowdown", "503", "SlowDown"), ("error", "500", "InternalError")])
def test_an_error_reply_is_all_the_client_gets_and_nothing_is_written(stores, proxy, kind, status, code):
    via, direct = stores
    proxy.inject_next(kind)
    with pytest.raises(GenericError, match=status) as refused:
        obstore.put(via, "k.json", b"data")
    assert code in str(refused.value)
    assert written(direct, "k.json") is None


def test_a_reset_connection_is_an_error_and_nothing_is_written(stores, proxy):
    via, direct = stores
    proxy.inject_next("reset")
    with pytest.raises(GenericError, match="error sending request") as reset:
        obstore.put(via, "k.json", b"data")
    assert "Connection reset by peer" in str(reset.value)
    assert written(direct, "k.json") is None


def test_a_dropped_reply_is_an_error_though_the_write_was_made(stores, proxy):
    via, direct = stores
    proxy.inject_next("drop_reply")
    with pytest.raises(GenericError, match="error sending request") as dropped:
        obstore.put(via, "k.json", b"data")
    assert "IncompleteMessage" in str(dropped.value)
    assert written(direct, "k.json") == b"data"

    # A conditional create whose reply is lost: trying it again, the writer is refused as if another had won.
    proxy.inject_next("drop_reply", method="PUT")
    with pytest.raises(GenericError):
        obstore.put(via, "once.json", b"mine", mode="create")
    with pytest.raises((AlreadyExistsError, PreconditionError)):
        obstore.put(via, "once.json", b"mine", mode="create")
    assert written(direct, "once.json") == b"mine"


def test_a_delayed_request_is_made_late(stores, proxy):
    via, direct = stores
    proxy.inject_next("delay")
    started = time.monotonic()
    obstore.put(via, "k.json", b"data")
    assert time.monotonic() - started >= DELAY_S
    assert written(direct, "k.json") == b"data"
    counts = proxy.counts()
    assert (counts["requests"], counts["forwarded"], counts["injected"]["delay"], counts["queued"]) == (1, 1, 1, 0)
    obstore.put(via, "k.json", b"again")
    counts = proxy.counts()  # the next request went through undelayed
    assert (counts["requests"], counts["forwarded"], counts["injected"]["delay"]) == (2, 2, 1)
    assert written(direct, "k.json") == b"again"


def test_every_request_is_held_for_the_latency_and_counted_by_kind_as_s3_bills_it(s3_server):
    latency_s = 0.2
    with FaultProxy(s3_server.endpoint, latency_s=latency_s) as proxy:
        via = s3_store(proxy.storage_options(s3_server.storage_options), uuid.uuid4().hex)
        started = time.monotonic()
        obstore.put(via, "a.json", b"data")
        assert time.monotonic() - started >= latency_s
        with pytest.raises(AlreadyExistsError):
            obstore.put(via, "a.json", b"again", mode="create")  # a conditional write that lost: 412
        obstore.get(via, "a.json").bytes()
        obstore.head(via, "a.json")
        obstore.copy(via, "a.json", "b.json")
        obstore.list_with_delimiter(via, "")
        obstore.delete(via, "b.json")  # obstore deletes by a multi-object delete: POST ?delete
        # Requests in parallel wait out the latency side by side, not one after another.
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: obstore.head(via, "a.json"), range(8)))
        assert time.monotonic() - started < 4 * latency_s
        counts = proxy.counts()
    assert counts["latency_s"] == latency_s
    assert counts["by_kind"] == {"GET": 1, "HEAD": 9, "LIST": 1, "PUT": 2, "COPY": 1, "POST": 1, "DELETE": 0, "OTHER": 0}
    assert counts["by_method"] == {"PUT": 3, "GET": 2, "HEAD": 9, "POST": 1}
    assert counts["by_status"]["412"] == 1 and sum(counts["by_status"].values()) == counts["requests"] == 15


def test_a_bandwidth_is_shared_by_the_transfers_on_the_link_and_the_bodies_are_counted(s3_server):
    bandwidth = 1_000_000
    with FaultProxy(s3_server.endpoint, bandwidth_bytes_s=bandwidth) as proxy:
        prefix = uuid.uuid4().hex
        obstore.put(s3_store(s3_server.storage_options, prefix), "large", b"x" * bandwidth)
        via = s3_store(proxy.storage_options(s3_server.storage_options), prefix)
        finished = {}

        def read(key):
            started = time.monotonic()
            obstore.get(via, key).bytes() if key == "large" else obstore.head(via, "large")
            finished[key] = time.monotonic() - started

        with ThreadPoolExecutor(2) as pool:
            large = pool.submit(read, "large")
            time.sleep(0.2)  # the large read under way: a small request beside it waits for its own bytes only
            pool.submit(read, "small").result()
            large.result()
        counts = proxy.counts()
    assert finished["large"] >= 1.0  # a megabyte at a megabyte a second, at the least
    assert finished["small"] < finished["large"] / 2
    assert counts["body_bytes"] == bandwidth and counts["bandwidth_bytes_s"] == bandwidth


def test_request_kind_tells_a_listing_from_a_read_and_a_copy_from_a_write():
    assert request_kind("GET", {"list-type": "2", "prefix": "lh/_delta_log/"}, {}) == "LIST"
    assert request_kind("GET", {}, {}) == "GET"
    assert request_kind("PUT", {}, {"x-amz-copy-source": "/lakehouse/a"}) == "COPY"
    assert request_kind("put", {}, {}) == "PUT"
    assert request_kind("PATCH", {}, {}) == "OTHER"


def test_the_counts_add_up_and_follow_the_schedule(s3_server):
    rates = {"slowdown": 0.15, "error": 0.15, "delay": 0.1, "reset": 0.15, "drop_reply": 0.15}
    with FaultProxy(s3_server.endpoint, seed=11, rates=rates, delay_s=0.01) as proxy:
        prefix = uuid.uuid4().hex
        via = s3_store(proxy.storage_options(s3_server.storage_options), prefix)
        obstore.put(s3_store(s3_server.storage_options, prefix), "k.json", b"data")
        outcomes = []
        for i in range(40):
            try:
                if i % 2:
                    obstore.head(via, "k.json")
                else:
                    obstore.put(via, "k.json", b"data")
                outcomes.append("ok")
            except GenericError:
                outcomes.append("failed")
        counts = proxy.counts()
        with urllib.request.urlopen(f"{proxy.url}/_faults") as reply:
            assert json.loads(reply.read()) == counts

    schedule = FaultSchedule(11, rates)
    drawn = [schedule.draw("PUT" if i % 2 == 0 else "HEAD") for i in range(40)]
    assert outcomes == ["ok" if kind in (None, "delay") else "failed" for kind in drawn]
    expected = Counter(drawn)
    assert counts["injected"] == {kind: expected[kind] for kind in KINDS}
    assert counts["requests"] == 40 == counts["forwarded"] + sum(counts["injected"][k] for k in ("slowdown", "error", "reset"))
    assert counts["forwarded"] == expected[None] + expected["delay"] + expected["drop_reply"]
    assert (counts["seed"], counts["rates"], counts["enabled"]) == (11, rates, True)


def test_faults_turned_off_and_on_and_injected_on_demand(s3_server):
    with FaultProxy(s3_server.endpoint, rates={"slowdown": 1.0}) as proxy:
        via = s3_store(proxy.storage_options(s3_server.storage_options), uuid.uuid4().hex)
        with pytest.raises(GenericError, match="503"):
            obstore.put(via, "k.json", b"data")

        def post(path: str, payload: dict | None = None) -> dict:
            request = urllib.request.Request(f"{proxy.url}/_faults{path}", data=json.dumps(payload or {}).encode(),
                                             method="POST")
            with urllib.request.urlopen(request) as reply:
                return json.loads(reply.read())

        assert post("/disable")["enabled"] is False
        for _ in range(3):
            obstore.put(via, "k.json", b"data")
        # Queued faults are served in order, each to the first request it matches.
        assert post("/next", {"kind": "error", "method": "PUT", "path_contains": "_delta_log/"})["queued"] == 1
        proxy.inject_next("reset", method="GET", path_contains="_delta_log/")
        proxy.inject_next("slowdown", method="HEAD")
        assert proxy.counts()["queued_by_path"] == {"_delta_log/": 2, "": 1}
        with pytest.raises(GenericError, match="503"):
            obstore.head(via, "k.json")
        obstore.put(via, "k.json", b"data")
        assert written(via, "k.json") == b"data"
        obstore.list_with_delimiter(via, "t/")
        with pytest.raises(GenericError, match="error sending request"):
            obstore.list_with_delimiter(via, "t/_delta_log/")
        with pytest.raises(GenericError, match="500"):
            obstore.put(via, "t/_delta_log/00000000000000000000.json", b"{}")
        obstore.put(via, "t/_delta_log/00000000000000000001.json", b"{}")
        with pytest.raises(urllib.error.HTTPError, match="400"):
            post("/next", {"kind": "meteor"})
        with pytest.raises(ValueError, match="unknown fault kind"):
            proxy.inject_next("meteor")

        assert post("/enable")["enabled"] is True
        with pytest.raises(GenericError, match="503"):
            obstore.put(via, "k.json", b"data")
        counts = proxy.counts()
    assert counts["injected"] == {"slowdown": 3, "error": 1, "delay": 0, "reset": 1, "drop_reply": 0}
    assert (counts["requests"], counts["forwarded"], counts["queued"], counts["queued_by_path"]) == (12, 7, 0, {})


def test_the_command_line_proxies_and_prints_its_counts_on_sigterm(recorder):
    process = subprocess.Popen(
        [sys.executable, "-m", "coordinator.conformance.faults", "--upstream", recorder, "--seed", "5",
         "--rates", "slowdown=0.25,drop_reply=0.5", "--methods", "PUT"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert select.select([process.stdout], [], [], 30)[0], "no line from the proxy in 30 s"
        line = process.stdout.readline()
        assert line.startswith("storage-faults: listening on http://127.0.0.1:")
        url = line.split()[-1]
        reply = send(url, "GET", "/lakehouse/k", [("Host", url.removeprefix("http://"))])
        assert reply.status == 200
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    counts = json.loads(out)
    assert (counts["requests"], counts["forwarded"], counts["seed"], counts["methods"]) == (1, 1, 5, ["PUT"])
    assert counts["rates"] == {"slowdown": 0.25, "error": 0.0, "delay": 0.0, "reset": 0.0, "drop_reply": 0.5}


def test_each_request_is_logged_as_it_ends_with_its_kind_path_status_and_times(s3_server, tmp_path):
    log = tmp_path / "requests.jsonl"
    with FaultProxy(s3_server.endpoint, request_log=str(log)) as proxy:
        prefix = uuid.uuid4().hex
        via = s3_store(proxy.storage_options(s3_server.storage_options), prefix)
        before = time.time()
        obstore.put(via, "dir/a b.json", b"data")
        obstore.list_with_delimiter(via, "dir")
        proxy.inject_next("slowdown", method="GET")
        with pytest.raises(GenericError):
            obstore.get(via, "dir/a b.json").bytes()
        proxy.inject_next("reset", method="HEAD")
        with pytest.raises(GenericError):
            obstore.head(via, "dir/a b.json")
        after = time.time()
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["method"], r["kind"], r["status"]) for r in logged] == [
        ("PUT", "PUT", 200), ("GET", "LIST", 200), ("GET", "GET", 503), ("HEAD", "HEAD", "aborted")]
    assert logged[0]["path"] == f"/lakehouse/{prefix}/dir/a b.json"  # percent-decoded
    assert f"prefix={prefix}/dir/" in logged[1]["path"]
    assert all(before <= r["start"] <= r["end"] <= after for r in logged)
