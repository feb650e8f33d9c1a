"""A benchmark's lakehouse on object storage at a chosen latency: the loopback S3 server behind one
storage-fault proxy per party of the run (``coordinator/conformance/faults.py``, no faults, ``latency_ms`` added
to every request), and what each party's requests would cost on S3.

Each party (``producer``, ``checker``) reaches the server through a proxy of its own, so each one's
requests are counted apart; the benchmark itself (making lakehouses, reading what was delivered, the
checker's lag) goes straight to the server (:attr:`LatencyStore.direct`): its reads are neither
slowed nor counted.

Example::

    with harness.LatencyStore(25, workdir) as store:
        lakehouse = store.new_lakehouse()                         # set up straight, no latency
        config = CoordinatorConfig(lakehouse=lakehouse.root, storage=store.storage("producer"))
        before = store.counts("producer")
        ...                                                       # send
        cost = request_cost(store.requests_since("producer", before), transactions=10_000)
        cost["usd_per_million_transactions"]
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Iterable, Mapping, Optional


__all__ = ["LATENCY_HELP", "LatencyStore", "S3_PRICES", "S3_PRICES_USD_PER_1000", "idle_cost_per_day",
           "request_cost", "requests_between"]

#: S3 Standard's request prices in us-east-1, USD per 1,000 requests (S3's price list; DELETE is free).
#: By request kind, every one the proxy counts (coordinator.conformance.faults.REQUEST_KINDS).
S3_PRICES_USD_PER_1000 = {"PUT": 0.005, "COPY": 0.005, "POST": 0.005, "LIST": 0.005,
                          "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0, "OTHER": 0.005}
S3_PRICES = "S3 Standard, us-east-1: PUT, COPY, POST, LIST $0.005 per 1,000; GET, HEAD $0.0004 per 1,000; DELETE free"
LATENCY_HELP = ("run on the loopback S3 server behind the storage-fault proxy with this many milliseconds added "
                "to every request, for every party of the run (one proxy each, its requests counted and priced "
                "at S3's list prices); 0 or absent: as without it")
BUCKET = "bench"
SECONDS_PER_DAY = 86_400


class LatencyStore:
    """The S3 server (data under ``workdir``) and one :class:`FaultProxyProcess` per party, each adding
    ``latency_ms`` to every request (and with ``bandwidth_mb_s``, passing the bodies through a link of that many
    megabytes a second, one per party); started by ``with``. A proxy of its own process: delta-rs holds
    the GIL while it waits, so a proxy thread beside it would never answer.

    :meth:`storage` is a party's storage options, :attr:`direct` the benchmark's own; :meth:`counts` a
    party's request counts so far (by method, by kind, by status). With ``request_logs`` (a directory),
    each proxy also logs every request there, one JSON line each (:meth:`request_log`)."""

    def __init__(self, latency_ms: float, workdir: str, parties: Iterable[str] = ("producer", "checker"),
                 request_logs: Optional[str] = None, bandwidth_mb_s: float = 0.0):
        self.latency_ms = latency_ms
        self.bandwidth_mb_s = bandwidth_mb_s
        self.request_logs = request_logs
        self.workdir = workdir
        self.bucket = BUCKET
        self.parties = tuple(parties)
        self.direct: dict[str, str] = {}
        self._proxies: dict[str, FaultProxyProcess] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "LatencyStore":
        from coordinator.conformance.faults import FaultProxyProcess
        from coordinator.conformance.versitygw import S3Server

        try:
            server = self._stack.enter_context(S3Server(os.path.join(self.workdir, "s3")))
            server.create_bucket(self.bucket)
            self.direct = server.storage_options
            for party in self.parties:
                self._proxies[party] = self._stack.enter_context(FaultProxyProcess(
                    server.endpoint, latency_s=self.latency_ms / 1000, bandwidth_bytes_s=self.bandwidth_mb_s * 1e6,
                    log_path=os.path.join(self.workdir, f"proxy-{party}.log"), request_log=self.request_log(party)))
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def request_log(self, party: str) -> Optional[str]:
        """The file ``party``'s proxy logs each request to (``coordinator.conformance.faults``), if ``request_logs`` was given."""
        return None if self.request_logs is None else os.path.join(self.request_logs, f"{party}-requests.jsonl")

    def storage(self, party: str) -> dict[str, str]:
        """The storage options that reach the server through ``party``'s proxy."""
        return self._proxies[party].storage_options(self.direct)

    def counts(self, party: str) -> dict:
        """``party``'s proxy's counts now (``coordinator.conformance.faults.FaultProxy.counts``)."""
        return self._proxies[party].counts()

    def requests_since(self, party: str, before: Mapping) -> dict[str, int]:
        """``party``'s requests by kind since its counts were ``before``."""
        return requests_between(before, self.counts(party))

    def new_root(self) -> str:
        """A new, empty prefix of the bucket: ``s3://bench/<hex>``."""
        return f"s3://{self.bucket}/{uuid.uuid4().hex}"

    def new_lakehouse(self, storage: Optional[Mapping[str, str]] = None):
        """A fresh, initialised lakehouse under a new prefix of the bucket, reached with ``storage``
        (default: straight, :attr:`direct`)."""
        from coordinator.lakehouse import Lakehouse, init_lakehouse

        lakehouse = Lakehouse(self.new_root(), dict(storage or self.direct))
        init_lakehouse(lakehouse)
        return lakehouse

    def settings(self) -> dict:
        """What a report says about this store."""
        return {"latency_ms": self.latency_ms, "server": "versitygw on loopback behind coordinator/conformance/faults.py",
                "proxies": list(self.parties), "prices": S3_PRICES}


def requests_between(before: Mapping, after: Mapping) -> dict[str, int]:
    """Requests by kind (:data:`REQUEST_KINDS`) between two of a proxy's counts, and ``total``; also
    ``conditional_put_refused``: replies 412, each a conditional write that lost its race."""
    from coordinator.conformance.faults import REQUEST_KINDS

    by_kind = {kind: after["by_kind"].get(kind, 0) - before["by_kind"].get(kind, 0) for kind in REQUEST_KINDS}
    refused = after["by_status"].get("412", 0) - before["by_status"].get("412", 0)
    return {**by_kind, "total": sum(by_kind.values()), "conditional_put_refused": refused}


def _usd(requests: Mapping[str, float]) -> float:
    return sum(requests.get(kind, 0) * price / 1000 for kind, price in S3_PRICES_USD_PER_1000.items())


def request_cost(requests: Mapping[str, int], transactions: int) -> dict:
    """``requests`` (:func:`requests_between`) made for ``transactions``: per million transactions, by
    kind and in all, and their cost at :data:`S3_PRICES_USD_PER_1000` (``None`` for no transactions).

    Example::

        request_cost({"PUT": 300, "GET": 100, ..., "total": 400}, transactions=100)
        # {"requests": {...}, "per_million_transactions": {"PUT": 3000000.0, ...}, "usd_per_million_transactions": 15.04}
    """
    if not transactions:
        return {"requests": dict(requests), "transactions": transactions, "per_million_transactions": None,
                "usd_per_million_transactions": None}
    scale = 1_000_000 / transactions
    per_million = {kind: round(count * scale, 1) for kind, count in requests.items()}
    return {"requests": dict(requests), "transactions": transactions, "per_million_transactions": per_million,
            "usd_per_million_transactions": round(_usd(requests) * scale, 4)}


def idle_cost_per_day(requests: Mapping[str, int], seconds: float) -> dict:
    """``requests`` made in ``seconds`` of idling, per second and per day, and a day's cost."""
    per_day = {kind: round(count * SECONDS_PER_DAY / seconds) for kind, count in requests.items()}
    return {"requests": dict(requests), "seconds": round(seconds, 1),
            "requests_per_s": round(requests["total"] / seconds, 2), "per_day": per_day,
            "usd_per_day": round(_usd(requests) * SECONDS_PER_DAY / seconds, 4)}
