"""The hand-written commit against delta-rs's: one writer's small appends to a fresh Delta table, by each way of committing.

Issue 46 asks for delta-rs's transaction API (``CommitProperties(app_transactions=...)``,
``DeltaTable.create_write_transaction``) to be measured against :class:`~coordinator.appender.DeltaAppender`
in the same run. Each method appends the same commit-log tables (``--rows``: HALF records as producers
write them, ``coordinator.tables.COMMIT_LOG``'s schema) ``--appends`` times, after ``--warmup`` untimed
appends, to a fresh table of its own; the methods take turns append by append, in a new random order
each turn, so that the machine's load and the order hit them alike. The methods:

- ``appender``: ``DeltaAppender.append(data)``, the hand-written commit (a data-file PUT, then a
  conditional PUT of the next ``_delta_log`` file);
- ``appender+txn``: the same with ``app_transaction=(app_id, n)``: idempotent by itself;
- ``write_deltalake``: delta-rs's ``write_deltalake(table, data, mode="append")`` on a ``DeltaTable``
  opened once and kept;
- ``write_deltalake+txn``: the same with ``commit_properties=CommitProperties(app_transactions=[Transaction(app_id, n)])``,
  after checking ``table.transaction_version(app_id)``: delta-rs records the transaction but never
  skips a commit for it, so the caller must check;
- ``write_transaction``: the data file written as the appender writes it (Parquet encoded by pyarrow,
  one PUT), then its ``AddAction`` committed with ``DeltaTable.create_write_transaction(..., "append")``
  and the table brought up to date (``update_incremental``: ``create_write_transaction`` leaves the
  ``DeltaTable`` at its old version: its next commit would cost more, and its ``transaction_version`` be stale);
- ``write_transaction+txn``: the same with ``CommitProperties(app_transactions=...)`` and the caller's check.

After the timed appends, each method's last append is replayed by a new writer (a new appender, a
freshly opened ``DeltaTable``): ``idempotent_on_replay`` says whether the table was left as it was; for
delta-rs's methods with a transaction, ``api_alone_skips_replay`` says whether delta-rs itself skipped
it without the caller's check (it does not: it commits the data again and records the transaction twice).

With ``--storage-latency-ms N`` the tables are prefixes of a bucket on the loopback S3 server, each
method's requests through a storage-fault proxy of its own adding N ms to every request
(``support.LatencyStore``), which counts them by kind: ``requests_per_append`` (the timed
appends' requests over their number) and ``round_trips_per_append`` (the median append's time over N:
the requests an append waits for one after the other).

    python -m bench.commit_api                              # local disk
    python -m bench.commit_api --storage-latency-ms 25      # the S3 server, 25 ms a request
    python -m bench.commit_api --appends 40 --rows 1 10 200
    python -m bench.commit_api --tiny                       # a few appends of each, for the tests

Prints a table and writes ``bench/results/commit-api.json`` (``commit-api-s3-<N>ms.json`` with
``--storage-latency-ms N``; ``--results`` to change), with the load average at start and end.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

import deltalake
import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake
from deltalake.transaction import AddAction

from bench import harness

import support
from coordinator.appender import DeltaAppender, file_stats
from coordinator.lakehouse import create_table, open_table
from coordinator.lakehouse.slots import parquet_file
from coordinator.producer.commit_log import records_to_arrow
from coordinator.storage import FileStore
from coordinator.tables import COMMIT_LOG

RESULTS = harness.RESULTS
APP_ID = "bench-commit-api"
#: The methods, in the order of the report (each turn takes them in a random order).
METHODS = ("appender", "appender+txn", "write_deltalake", "write_deltalake+txn", "write_transaction",
           "write_transaction+txn")
#: The hand-written commit every ratio is quoted against.
BASELINE = "appender"
#: ``--tiny``: three appends of one row by each method, one warm-up, on a local disk (seconds in all).
TINY = {"appends": 3, "warmup": 1, "rows": [1]}


def commit_log_rows(rows: int) -> pa.Table:
    """``rows`` HALF records of single-message transactions, as a producer writes them to its commit log."""
    ids = [uuid.uuid4().hex for _ in range(rows)]
    return records_to_arrow(support.half_rows(ids, "bench", "BENCH"))


class Writer:
    """One way of appending to the table at ``path``: ``append(data, n)`` makes the ``n``-th append
    (``n`` its application transaction's version where the method records one), ``close()`` ends it."""

    transactional = False

    def __init__(self, path: str, storage: dict[str, str]):
        self.path, self.storage = path, storage

    def append(self, data: pa.Table, n: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Appender(Writer):
    def __init__(self, path: str, storage: dict[str, str], transactional: bool):
        super().__init__(path, storage)
        self.transactional = transactional
        self.appender = DeltaAppender(path, storage=storage or None)

    def append(self, data: pa.Table, n: int) -> None:
        self.appender.append(data, app_transaction=(APP_ID, n) if self.transactional else None)

    def close(self) -> None:
        self.appender.close()


class DeltaRsWriter(Writer):
    """A delta-rs writer on a ``DeltaTable`` opened once; with a transaction, the caller's check first."""

    def __init__(self, path: str, storage: dict[str, str], transactional: bool, check: bool = True):
        super().__init__(path, storage)
        self.transactional, self.check = transactional, check
        self.table = open_table(path, storage=storage or None)

    def commit_properties(self, n: int) -> Optional[CommitProperties]:
        return CommitProperties(app_transactions=[Transaction(APP_ID, n)]) if self.transactional else None

    def recorded(self, n: int) -> bool:
        """Whether the table (as this writer last saw it) records the ``n``-th append's transaction."""
        recorded = self.table.transaction_version(APP_ID)
        return self.transactional and self.check and recorded is not None and recorded >= n


class WriteDeltalake(DeltaRsWriter):
    def append(self, data: pa.Table, n: int) -> None:
        if not self.recorded(n):
            write_deltalake(self.table, data, mode="append", commit_properties=self.commit_properties(n))


class WriteTransaction(DeltaRsWriter):
    """The data file written as :class:`DeltaAppender` writes it, its add action committed by delta-rs."""

    def __init__(self, path: str, storage: dict[str, str], transactional: bool, check: bool = True):
        super().__init__(path, storage, transactional, check)
        self.files = FileStore.at(path, storage)

    def append(self, data: pa.Table, n: int) -> None:
        if self.recorded(n):
            return
        name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        content = parquet_file(data)
        written_ms = self.files.put(name, content)
        add = AddAction(name, len(content), {}, written_ms, True, file_stats(data))
        self.table.create_write_transaction([add], "append", data.schema, commit_properties=self.commit_properties(n))
        self.table.update_incremental()


WRITERS: dict[str, Callable[..., Writer]] = {
    "appender": lambda path, storage, **kw: Appender(path, storage, False),
    "appender+txn": lambda path, storage, **kw: Appender(path, storage, True),
    "write_deltalake": lambda path, storage, **kw: WriteDeltalake(path, storage, False, **kw),
    "write_deltalake+txn": lambda path, storage, **kw: WriteDeltalake(path, storage, True, **kw),
    "write_transaction": lambda path, storage, **kw: WriteTransaction(path, storage, False, **kw),
    "write_transaction+txn": lambda path, storage, **kw: WriteTransaction(path, storage, True, **kw),
}


def party(method: str) -> str:
    """The name of ``method``'s proxy."""
    return method.replace("+", "-")


class Places:
    """A fresh table per method and size: in a temporary directory, or (``latency_ms``) a prefix of the S3
    server's bucket, made straight and written through the method's own proxy."""

    def __init__(self, latency_ms: float):
        self._stack = contextlib.ExitStack()
        self.store: Optional[support.LatencyStore] = None
        if latency_ms:
            self.store = self._stack.enter_context(support.LatencyStore(
                latency_ms, self._stack.enter_context(tempfile.TemporaryDirectory()), [party(m) for m in METHODS]))
        else:
            self.directory = self._stack.enter_context(tempfile.TemporaryDirectory())

    def new_table(self, method: str) -> tuple[str, dict[str, str], dict[str, str]]:
        """A fresh, empty commit-log table: its path, the method's storage options, and the straight ones."""
        if self.store is None:
            path = f"{self.directory}/{uuid.uuid4().hex}"
            create_table(COMMIT_LOG, path)
            return path, {}, {}
        path = f"{self.store.new_root()}/commit_log"
        create_table(COMMIT_LOG, path, self.store.direct)
        return path, self.store.storage(party(method)), dict(self.store.direct)

    def counts(self, method: str) -> Optional[dict]:
        return None if self.store is None else self.store.counts(party(method))

    def requests_since(self, method: str, before: Optional[dict]) -> Optional[dict]:
        return None if before is None else self.store.requests_since(party(method), before)

    def close(self) -> None:
        self._stack.close()


def replay(method: str, path: str, storage: dict[str, str], direct: dict[str, str], data: pa.Table, n: int,
           check: bool = True) -> bool:
    """Replay the ``n``-th append with a new writer; whether the table was left as it was."""
    before = open_table(path, storage=direct or None).version()
    writer = WRITERS[method](path, storage, **({} if method.startswith("appender") else {"check": check}))
    try:
        writer.append(data, n)
    finally:
        writer.close()
    return open_table(path, storage=direct or None).version() == before


def measure(places: Places, rows: int, appends: int, warmup: int) -> dict:
    """Every method's ``appends`` timed appends of ``rows`` rows (after ``warmup``), taking turns; figures by method."""
    data = commit_log_rows(rows)
    tables = {method: places.new_table(method) for method in METHODS}
    writers = {method: WRITERS[method](path, storage) for method, (path, storage, _) in tables.items()}
    times: dict[str, list[float]] = {method: [] for method in METHODS}
    counts: dict[str, Optional[dict]] = {}
    order = random.Random(rows)
    try:
        for n in range(warmup + appends):
            if n == warmup:
                counts = {method: places.counts(method) for method in METHODS}
            # In a new order each turn: a method is quicker right after its own kind (its code and data warm).
            for method in order.sample(METHODS, len(METHODS)):
                writer = writers[method]
                started = time.perf_counter()
                writer.append(data, n)
                if n >= warmup:
                    times[method].append((time.perf_counter() - started) * 1000)
        requests = {method: places.requests_since(method, counts[method]) for method in METHODS}
    finally:
        for writer in writers.values():
            writer.close()
    figures = {}
    for method in METHODS:
        path, storage, direct = tables[method]
        version = open_table(path, storage=direct or None).version()
        median, p90 = harness.median(times[method]), harness.percentile(times[method], 0.9)
        figure = {"ms_median": round(median, 2), "ms_p90": round(p90, 2), "ms_min": round(min(times[method]), 2),
                  "versions": version, "idempotent_on_replay": replay(method, path, storage, direct, data,
                                                                      warmup + appends - 1)}
        if method.endswith("+txn") and not method.startswith("appender"):
            figure["api_alone_skips_replay"] = replay(method, path, storage, direct, data, warmup + appends - 1,
                                                      check=False)
        if requests[method] is not None:
            spent = requests[method]
            figure["requests"] = spent
            figure["requests_per_append"] = {kind: round(count / appends, 2) for kind, count in spent.items() if count}
            figure["round_trips_per_append"] = round(median / places.store.latency_ms, 1)
        figures[method] = figure
    for method, figure in figures.items():
        figure["median_vs_appender"] = round(figure["ms_median"] / figures[BASELINE]["ms_median"], 2)
        figure["p90_vs_appender"] = round(figure["ms_p90"] / figures[BASELINE]["ms_p90"], 2)
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=40, help="timed appends per method and size")
    parser.add_argument("--warmup", type=int, default=3, help="untimed appends before them")
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 10, 200], help="rows per append, one run each")
    parser.add_argument("--storage-latency-ms", type=float, default=0, help=support.LATENCY_HELP)
    parser.add_argument("--results", default=None,
                        help="default: bench/results/commit-api.json (commit-api-s3-<N>ms.json)")
    args = harness.parse_args(parser, argv, "commit-api", TINY)
    args.results = args.results or str(RESULTS / (
        f"commit-api-s3-{args.storage_latency_ms:g}ms.json" if args.storage_latency_ms else "commit-api.json"))
    report = harness.start_report("commit_api", vars(args))
    report["deltalake"] = deltalake.__version__
    report["pyarrow"] = pa.__version__
    places = Places(args.storage_latency_ms)
    if places.store is not None:
        report["storage"] = places.store.settings()
    try:
        report["runs"] = {}
        for rows in args.rows:
            print(f"{args.appends} appends of {rows} row(s) by each method...", flush=True)
            report["runs"][str(rows)] = measure(places, rows, args.appends, args.warmup)
    finally:
        places.close()
    latency = args.storage_latency_ms
    print(f"\n{'rows':>4} {'method':>22} {'median ms':>9} {'p90 ms':>8} {'x appender':>10} {'p90 x':>6} "
          f"{'idempotent':>10}" + (f" {'req/append':>10} {'GET/HEAD/LIST/PUT':>17} {'round trips':>11}" if latency else ""))
    for rows, figures in report["runs"].items():
        for method, f in figures.items():
            line = (f"{rows:>4} {method:>22} {f['ms_median']:>9} {f['ms_p90']:>8} {f['median_vs_appender']:>10} "
                    f"{f['p90_vs_appender']:>6} {str(f['idempotent_on_replay']):>10}")
            if latency:
                per = f["requests_per_append"]
                kinds = "/".join(f"{per.get(kind, 0):g}" for kind in ("GET", "HEAD", "LIST", "PUT"))
                line += f" {per.get('total', 0):>10} {kinds:>17} {f['round_trips_per_append']:>11}"
            print(line)
    return harness.finish_report(report, Path(args.results))


if __name__ == "__main__":
    main()
