"""``python -m coordinator demo``: the order/credits story of docs/design.md#the-problem, end to end, on one machine.

An order service (SQLite) sends orders in transactions; the real checker
(``spark-submit`` of :mod:`coordinator.jobs.checker`) resolves them; the credits service
(:mod:`coordinator.demo.credits`, a consumer group with no Spark) grants loyalty points in its own SQLite
database, exactly once per order. Some orders commit, some roll back, some lose their second phase and are
repaired by check-back, some stay undecidable and are discarded; the credits service is killed (``kill -9``)
once mid-story and restarted. At the end the demo proves: confirmed orders in SQLite = messages in the topic
= credits granted.

This process runs the producer and reads tables with delta-rs: it starts no JVM
itself; the checker (the one Spark job) and the credits service are subprocesses.

Example::

    run_demo("demo-lakehouse", orders=40)   # prints progress and a summary; returns the exit code
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

from coordinator.spark import spark_job_environment, spark_submit
from coordinator.config import CoordinatorConfig
from coordinator.demo.services import (
    CONFIRMED,
    CREDITS_GROUP,
    DEFAULT_SEED,
    MANUAL_REVIEW,
    ORDER_GROUP,
    ORDER_TOPIC,
    Fate,
    CreditStore,
    Order,
    OrderListener,
    OrderStore,
    make_orders,
    order_id_of,
)
from coordinator.exceptions import CoordinatorError, HalfNotStoredError
from coordinator.lakehouse import Lakehouse, topic_names
from coordinator.logs import JsonFormatter
from coordinator.producer.message import TransactionSendResult
from coordinator.protocol import Outcome
from coordinator.tables import CHECK_REQUESTS, DISCARDED, HALF, OP, REJECTED, TableDef

DEFAULT_LAKEHOUSE = "demo-lakehouse"
DEFAULT_ORDERS = 40
DEFAULT_THREADS = 4
DEFAULT_TIMEOUT_S = 300.0

#: Short timings, so the stuck orders are checked out and discarded within about a minute.
DEMO_SETTINGS = {
    "transaction_timeout_ms": 3000,
    "transaction_check_interval_ms": 3000,
    "transaction_check_max": 3,
    "trigger_interval_ms": 100,
}
#: The demo's config file; a directory holding it was made by the demo and may be wiped.
CONFIG_NAME = "demo.toml"
_PROGRESS_EVERY_S = 10.0
_STOP_TIMEOUT_S = 120.0

Out = Callable[[str], None]


class DemoError(CoordinatorError):
    """The demo cannot go on (a job died, the directory is not the demo's); the message says why."""


@dataclass(frozen=True)
class DemoPaths:
    """Everything the demo writes, inside one directory (which is also the lakehouse)."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def orders_db(self) -> Path:
        return self.root / "orders.db"

    @property
    def checker_log(self) -> Path:
        return self.root / "checker.log"

    @property
    def credits_log(self) -> Path:
        return self.root / "credits.log"

    @property
    def credits_db(self) -> Path:
        return self.root / "credits.db"

    @property
    def producer_log(self) -> Path:
        return self.root / "producer.log"


def prepare_directory(lakehouse: str) -> DemoPaths:
    """Wipe and recreate the demo directory; refuse a non-empty directory the demo did not make.

    Example::

        prepare_directory("demo-lakehouse").config  # Path('/…/demo-lakehouse/demo.toml')
    """
    paths = DemoPaths(Path(lakehouse).resolve())
    if paths.root.exists():
        if not paths.root.is_dir():
            raise DemoError(f"{paths.root} is not a directory")
        if any(paths.root.iterdir()) and not paths.config.exists():
            raise DemoError(f"refusing to wipe {paths.root}: it is not empty and holds no {CONFIG_NAME}, "
                            "so the demo did not make it; choose another --lakehouse")
        shutil.rmtree(paths.root)
    paths.root.mkdir(parents=True)
    return paths


def write_demo_config(paths: DemoPaths, object_store: Optional[str] = None) -> CoordinatorConfig:
    """Write the demo's TOML (lakehouse = the demo directory, or ``object_store``; short timings) and load it back.

    Example::

        write_demo_config(paths).transaction_check_max  # 3
    """
    # A JSON string is a valid TOML basic string: quotes and backslashes in the path stay safe.
    lines = ["# Written by `python -m coordinator demo`; read by the checker and the credits service.",
             f"lakehouse = {json.dumps(object_store or str(paths.root))}"]
    lines += [f"{key} = {value}" for key, value in DEMO_SETTINGS.items()]
    paths.config.write_text("\n".join(lines) + "\n")
    # environ={}: the demo's settings are the file's, whatever TXCOORD_* the caller has set.
    return CoordinatorConfig.load(paths.config, environ={})


def require_empty_object_store(location: str) -> Lakehouse:
    """The lakehouse at ``location`` (settings from the ``AWS_*`` environment), if it holds no tables yet:
    the demo never wipes object storage.

    Example::

        require_empty_object_store("s3://bucket/demo")  # raises DemoError if a lakehouse is there
    """
    lakehouse = Lakehouse(location)
    if lakehouse.is_local:
        raise DemoError(f"--object-store takes an object-storage location (s3://BUCKET/PREFIX), got {location!r}")
    try:
        taken = lakehouse.exists(HALF) or topic_names(lakehouse)
    except OSError as error:
        raise DemoError(f"cannot reach {location}: {error} (the AWS_* environment variables say where and how)") from error
    if taken:
        raise DemoError(f"{location} already holds a lakehouse, and the demo never wipes object storage: "
                        "choose another prefix")
    return lakehouse


def job_environment() -> dict[str, str]:
    """The environment of the demo's Spark jobs: the project's (see ``spark_job_environment``),
    without ``TXCOORD_*``, which would override the demo's config."""
    env = {key: value for key, value in spark_job_environment().items() if not key.startswith("TXCOORD_")}
    env.update(PYTHONUNBUFFERED="1")
    return env


class Job:
    """A job (the checker on Spark, the credits service) in a subprocess, its output in a log file (appended to:
    a restarted job's follows its first run's).

    Example::

        checker = Job("checker", spark_submit("checker", "--config", cfg)[0], Path("checker.log")).start()
        checker.ensure_running()   # raises DemoError with the log's tail if it died
        checker.stop()             # SIGTERM; returns the exit code
    """

    def __init__(self, name: str, argv: list[str], log_path: Path, cwd: Optional[Path] = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.cwd = cwd
        self.process: Optional[subprocess.Popen] = None
        self._signalled = False

    def start(self) -> "Job":
        self._signalled = False
        with open(self.log_path, "ab") as log:
            # The child keeps its own copy of the descriptor; ours can close at once.
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                            env=job_environment(), stdin=subprocess.DEVNULL)
        return self

    def ensure_running(self) -> None:
        """Raise :class:`DemoError` with the end of the log if the job has exited."""
        code = self.process.poll()
        if code is not None:
            raise DemoError(f"the {self.name} job exited unexpectedly with code {code}; "
                            f"last lines of {self.log_path}:\n{self.tail()}")

    def terminate(self) -> None:
        """Send SIGTERM once (both jobs finish their batch in flight, then exit 0)."""
        if self.process.poll() is None and not self._signalled:
            self._signalled = True
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> int:
        """``kill -9``, as a crash: nothing finished, nothing saved; waits for it; its exit code (-9).

        Example::

            credits.kill(); credits.start()   # restarted, as a supervisor would
        """
        self.process.kill()
        return self.process.wait()

    def stop(self, timeout_s: float = _STOP_TIMEOUT_S) -> int:
        """Ask the job to stop (SIGTERM), wait for it, kill it after ``timeout_s``; return its exit code."""
        if self.process is None:
            return 0
        self.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise DemoError(f"the {self.name} job did not stop within {timeout_s:.0f} s of SIGTERM and was killed; "
                            f"last lines of {self.log_path}:\n{self.tail()}") from None

    def tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of the job's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join("    " + line for line in text.splitlines()[-lines:])


def checker_job(paths: DemoPaths) -> Job:
    """The real checker, exactly as deployed: ``spark-submit <the checker job> --config <demo toml>``."""
    argv, _ = spark_submit("checker", "--config", str(paths.config))
    if not Path(argv[0]).exists():
        raise DemoError(f"{argv[0]} not found: the demo needs pyspark beside txcoord (`pip install 'txcoord[spark]'`)")
    return Job("checker", argv, paths.checker_log, cwd=paths.root)


def credits_job(paths: DemoPaths) -> Job:
    """The credits service: ``python -m coordinator.demo.credits --config <demo toml> --db <credits.db>``, no
    Spark (graceful on SIGTERM)."""
    return Job("credits", [sys.executable, "-m", "coordinator.demo.credits", "--config", str(paths.config),
                           "--db", str(paths.credits_db)], paths.credits_log, cwd=paths.root)


def send_orders(producer, orders: list[Order], threads: int) -> tuple[dict[str, Order], list[Order]]:
    """Send every order in its own transaction from ``threads`` threads.

    Returns ``(order by transaction id, orders whose half could not be stored)``.

    Example::

        sent, not_sent = send_orders(producer, make_orders(12), threads=4)
    """

    def send(order: Order) -> tuple[Order, Optional[TransactionSendResult]]:
        try:
            return order, producer.send_message_in_transaction(order.message(), order)
        except HalfNotStoredError:
            return order, None  # the local transaction did not run: the order does not exist anywhere

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="order") as pool:
        results = list(pool.map(send, orders))
    sent = {result.transaction_id: order for order, result in results if result is not None}
    return sent, [order for order, result in results if result is None]


@dataclass(frozen=True)
class Resolution:
    """How the coordinator ended one order's transaction."""

    outcome: str  # COMMIT, ROLLBACK or DISCARD (several distinct ones would be a checker bug: "CONFLICT")
    by_check: bool  # decided by a check-back answer rather than the producer's own END


@dataclass
class Tally:
    """What the tables and the order database say, at one moment."""

    resolutions: dict[int, Resolution] = field(default_factory=dict)
    topic_order_ids: list[int] = field(default_factory=list)
    credit_order_ids: list[int] = field(default_factory=list)
    points: int = 0
    checks: int = 0
    most_checks_of_one: int = 0
    discarded_rows: int = 0
    refusals: Counter = field(default_factory=Counter)
    confirmed: list[int] = field(default_factory=list)
    held_for_review: list[int] = field(default_factory=list)

    def count(self, outcome: str, by_check: Optional[bool] = None) -> int:
        """Orders resolved with ``outcome`` (and, if given, by a check-back or not)."""
        return sum(1 for r in self.resolutions.values() if r.outcome == outcome and by_check in (None, r.by_check))


def read_rows(lakehouse: Lakehouse, table: Union[TableDef, str], columns: list[str]) -> list[dict]:
    """``columns`` of every row of ``table`` in ``lakehouse``; ``[]`` if it does not exist yet.

    Example::

        read_rows(Lakehouse("lh"), OP, ["transaction_id", "outcome"])
    """
    if not lakehouse.exists(table):
        return []
    return lakehouse.read(table, columns).to_pylist()


def read_tally(config: CoordinatorConfig, store: OrderStore, sent: dict[str, Order],
               credit_store: Optional[CreditStore] = None) -> Tally:
    """Read the coordinator's tables, the topic, the credits and SQLite (no JVM: delta-rs and sqlite3)."""
    lakehouse = Lakehouse.of(config)
    tally = Tally()
    outcomes: dict[int, set[tuple[str, bool]]] = {}
    for row in read_rows(lakehouse, OP, ["transaction_id", "outcome", "check_id"]):
        order = sent.get(row["transaction_id"])
        if order is not None:
            outcomes.setdefault(order.order_id, set()).add((row["outcome"], row["check_id"] is not None))
    for order_id, found in outcomes.items():
        [(outcome, by_check)] = found if len(found) == 1 else [("CONFLICT", False)]
        tally.resolutions[order_id] = Resolution(outcome, by_check)
    tally.topic_order_ids = [order_id_of(row["body"]) for row in read_rows(lakehouse, f"topics/{ORDER_TOPIC}", ["body"])]
    credits = credit_store.credits() if credit_store is not None else []
    tally.credit_order_ids = [row["order_id"] for row in credits]
    tally.points = sum(row["points"] for row in credits)
    checks = Counter(row["transaction_id"] for row in read_rows(lakehouse, CHECK_REQUESTS, ["transaction_id"]))
    tally.checks, tally.most_checks_of_one = sum(checks.values()), max(checks.values(), default=0)
    tally.discarded_rows = len(read_rows(lakehouse, DISCARDED, ["transaction_id"]))
    tally.refusals = Counter(row["reason"] for row in read_rows(lakehouse, REJECTED, ["reason"]))
    tally.confirmed = store.order_ids(CONFIRMED)
    tally.held_for_review = store.order_ids(MANUAL_REVIEW)
    return tally


def is_settled(tally: Tally, expected: int) -> bool:
    """Every order resolved, every commit delivered, every delivered order credited."""
    committed = tally.count(Outcome.COMMIT)
    return (
        len(tally.resolutions) >= expected
        and len(tally.topic_order_ids) >= committed
        and len(set(tally.credit_order_ids)) >= len(set(tally.topic_order_ids))
    )


def progress_line(elapsed_s: float, tally: Tally, expected: int) -> str:
    """One line of progress.

    Example::

        progress_line(12.0, tally, 40)  # '[  12 s] resolved 10/40: committed 8, rolled back 2, ...'
    """
    return (f"[{elapsed_s:4.0f} s] resolved {len(tally.resolutions)}/{expected}: committed {tally.count(Outcome.COMMIT)}, "
            f"rolled back {tally.count(Outcome.ROLLBACK)}, discarded {tally.count(Outcome.DISCARD)}; checks sent {tally.checks}; "
            f"in topic {len(tally.topic_order_ids)}; credited {len(tally.credit_order_ids)}")


def wait_until_settled(read: Callable[[], Tally], jobs: list[Job], expected: int, started: float,
                       timeout_s: float, out: Out) -> bool:
    """Poll the tables until :func:`is_settled`, printing progress; ``False`` on timeout.

    Raises :class:`DemoError` as soon as a job dies.
    """
    deadline = time.monotonic() + timeout_s
    last_line, last_print = "", 0.0
    while True:
        for job in jobs:
            job.ensure_running()
        tally = read()
        if is_settled(tally, expected):
            out(progress_line(time.monotonic() - started, tally, expected))
            return True
        line = progress_line(time.monotonic() - started, tally, expected)
        # Print on change, or every few seconds as a heartbeat.
        if line.split("]", 1)[1] != last_line.split("]", 1)[-1] or time.monotonic() - last_print >= _PROGRESS_EVERY_S:
            out(line)
            last_line, last_print = line, time.monotonic()
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)


def invariant_failures(tally: Tally, sent: dict[str, Order]) -> list[str]:
    """Why "orders in SQLite = messages in topic = credits granted" does not hold; ``[]`` when it does.

    Compared as multisets of order ids, so a duplicate delivery or credit is caught
    even when the counts happen to match.
    """
    failures = []
    confirmed, topic, credits = Counter(tally.confirmed), Counter(tally.topic_order_ids), Counter(tally.credit_order_ids)
    for name, other in (("messages in topic", topic), ("credits granted", credits)):
        if other != confirmed:
            missing, extra = sorted((confirmed - other).elements()), sorted((other - confirmed).elements())
            failures.append(f"{name} differ from confirmed orders in SQLite: missing {missing}, extra {extra}")
    committed = sorted(o for o, r in tally.resolutions.items() if r.outcome == Outcome.COMMIT)
    if committed != sorted(confirmed):
        failures.append(f"committed transactions {committed} are not the confirmed orders {sorted(confirmed)}")
    unresolved = sorted({o.order_id for o in sent.values()} - set(tally.resolutions))
    if unresolved:
        failures.append(f"orders never resolved: {unresolved}")
    conflicts = sorted(o for o, r in tally.resolutions.items() if r.outcome == "CONFLICT")
    if conflicts:
        failures.append(f"orders with more than one outcome in system/op: {conflicts}")
    return failures


def crash_credits_mid_story(credits: Job, read: Callable[[], Tally], jobs: list[Job], started: float,
                            timeout_s: float, out: Out) -> bool:
    """Once the credits service has granted its first credit, ``kill -9`` it and start it again, as a
    supervisor would: what it handled and had not saved is delivered again, and granted nothing twice.

    Raises :class:`DemoError` as soon as a job dies; ``False`` (no crash) if no credit comes in time.
    """
    deadline = time.monotonic() + timeout_s
    while not read().credit_order_ids:
        for job in jobs:
            job.ensure_running()
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    granted = len(read().credit_order_ids)
    code = credits.kill()
    credits.start()
    out(f"[{time.monotonic() - started:4.0f} s] killed the credits service (exit {code}) after {granted} credit(s); "
        f"restarted it (pid {credits.process.pid}): what it had not saved is delivered again, granted once")
    return True


def fate_mismatches(tally: Tally, orders: list[Order]) -> list[str]:
    """Orders that ended otherwise than their fate requires (e.g. a stuck order rolled back)."""
    return [
        f"order {o.order_id} ({o.fate.value}) ended {tally.resolutions[o.order_id].outcome}, expected {o.fate.expected_outcome}"
        for o in orders
        if o.order_id in tally.resolutions and tally.resolutions[o.order_id].outcome != o.fate.expected_outcome
    ]


def summary_lines(tally: Tally, orders: list[Order], not_sent: list[Order], config: CoordinatorConfig) -> list[str]:
    """The summary table: what was sent, how it ended, and what each service holds."""
    def row(label: str, value: object, note: str = "") -> str:
        return f"  {label:<40}{value:>6}" + (f"   {note}" if note else "")

    refused = ", ".join(f"{n} {reason!r}" for reason, n in tally.refusals.most_common()) or ""
    lines = [
        "summary",
        row("orders sent", len(orders) - len(not_sent), f"({len(not_sent)} not sent: half not stored)" if not_sent else ""),
        row("committed (first phase)", tally.count(Outcome.COMMIT, by_check=False)),
        row("committed by check-back", tally.count(Outcome.COMMIT, by_check=True)),
        row("rolled back", tally.count(Outcome.ROLLBACK),
            f"(first phase {tally.count(Outcome.ROLLBACK, False)}, by check-back {tally.count(Outcome.ROLLBACK, True)})"),
        row(f"discarded after {config.transaction_check_max} checks", tally.count(Outcome.DISCARD),
            f"({tally.discarded_rows} row(s) in system/discarded)"),
        row("unresolved", len(orders) - len(not_sent) - len(tally.resolutions)),
        row("check-backs sent", tally.checks, f"(at most {tally.most_checks_of_one} for one order)"),
        row("records refused by the checker", sum(tally.refusals.values()), refused),
        row("confirmed orders in SQLite", len(tally.confirmed),
            f"(+{len(tally.held_for_review)} held for manual review, never announced)" if tally.held_for_review else ""),
        row(f"messages in topics/{ORDER_TOPIC}", len(tally.topic_order_ids)),
        row("credits granted", len(tally.credit_order_ids), f"({tally.points} loyalty points)"),
        "",
        "  by planned fate        orders  committed  rolled back  discarded",
    ]
    for fate in Fate:
        ids = [o.order_id for o in orders if o.fate is fate]
        ended = Counter(tally.resolutions[i].outcome for i in ids if i in tally.resolutions)
        lines.append(f"  {fate.value:<22}{len(ids):>7}{ended[Outcome.COMMIT]:>11}{ended[Outcome.ROLLBACK]:>13}{ended[Outcome.DISCARD]:>11}")
    return lines


def run_demo(lakehouse: str = DEFAULT_LAKEHOUSE, orders: int = DEFAULT_ORDERS, threads: int = DEFAULT_THREADS,
             seed: int = DEFAULT_SEED, timeout_s: float = DEFAULT_TIMEOUT_S, out: Out = print,
             on_outcome: Optional[Callable[[dict], None]] = None, object_store: Optional[str] = None) -> int:
    """Run the whole story; return the exit code (0: the invariant holds, 1: it does not or a job failed).

    Progress and the summary go to ``out``, and the outcome's figures (:func:`outcome`)
    to ``on_outcome`` if given; the producer side's log goes to
    ``producer.log`` in the demo directory (this sets up the ``coordinator`` logger).
    With ``object_store`` (``s3://BUCKET/PREFIX``, reached with the ``AWS_*`` environment variables,
    which the jobs inherit) the tables live there; the directory keeps the config, SQLite and logs.
    Raises :class:`DemoError` before anything starts if ``lakehouse`` is not the demo's to wipe,
    or ``object_store`` already holds a lakehouse.

    Example::

        sys.exit(run_demo("demo-lakehouse", orders=12))
        sys.exit(run_demo("demo-run", orders=12, object_store="s3://bucket/demo-1"))
    """
    from coordinator.ops.consumer_groups import add_consumer_group
    from coordinator.producer.transaction_producer import TransactionProducer

    started = time.monotonic()
    if object_store is not None:
        require_empty_object_store(object_store)
    paths = prepare_directory(lakehouse)
    config = write_demo_config(paths, object_store)
    store = OrderStore(str(paths.orders_db))
    store.create()
    credit_store = CreditStore(str(paths.credits_db))
    plan = make_orders(orders, seed)
    _log_producer_to(paths.producer_log)
    out(f"demo lakehouse: {config.lakehouse}" + (f" (config, SQLite and logs in {paths.root})" if object_store else ""))
    out("settings: " + ", ".join(f"{k}={v}" for k, v in DEMO_SETTINGS.items()))
    out("planned fates: " + ", ".join(f"{fate.value} {n}" for fate, n in Counter(o.fate for o in plan).items()))

    jobs: list[Job] = []
    producer = None
    failures: list[str] = []
    credits_killed = 0
    try:
        add_consumer_group(config, CREDITS_GROUP, [ORDER_TOPIC], operator="demo")
        jobs = [checker_job(paths).start(), credits_job(paths).start()]
        out(f"started the checker (spark-submit, pid {jobs[0].process.pid}, log {paths.checker_log.name}) "
            f"and the credits service (consumer group {CREDITS_GROUP}, no Spark, pid {jobs[1].process.pid}, "
            f"log {paths.credits_log.name})")
        producer = TransactionProducer(ORDER_GROUP, OrderListener(store), config).start()
        sent, not_sent = send_orders(producer, plan, threads)
        out(f"[{time.monotonic() - started:4.0f} s] sent {len(sent)} orders from {threads} threads"
            + (f"; {len(not_sent)} could not be sent" if not_sent else ""))
        out("their messages stay invisible until the checker (a Spark job, still starting) resolves them")
        read = functools.partial(read_tally, config, store, sent, credit_store)
        credits_killed = int(crash_credits_mid_story(jobs[1], read, jobs, started, timeout_s, out))
        if not wait_until_settled(read, jobs, len(sent), started, timeout_s, out):
            failures.append(f"timed out after {timeout_s:.0f} s waiting for every order to be resolved and credited")
        producer.shutdown()  # no more check-back answers: nothing is left to ask about
        failures += _stop_jobs(jobs, out)
    except DemoError as error:
        out(f"demo failed: {error}")
        return 1
    finally:
        if producer is not None:
            producer.shutdown()
        _stop_quietly(jobs)

    out("")
    tally = read_tally(config, store, sent, credit_store)
    if on_outcome is not None:
        on_outcome(outcome(tally, sent, not_sent, failures, credits_killed))
    return report(tally, plan, sent, not_sent, config, failures, out,
                  f"logs: {paths.checker_log}, {paths.credits_log}, {paths.producer_log}; "
                  f"finished in {time.monotonic() - started:.0f} s")


def outcome(tally: Tally, sent: dict[str, Order], not_sent: list[Order], failures: list[str],
            credits_killed: int = 0) -> dict:
    """The demo's result as figures, for ``txcoord demo --json``.

    Example::

        outcome(tally, sent, [], [])["invariant_holds"]  # True
    """
    broken = invariant_failures(tally, sent)
    return {
        "orders_sent": len(sent),
        "orders_not_sent": len(not_sent),
        "committed_first_phase": tally.count(Outcome.COMMIT, by_check=False),
        "committed_by_check_back": tally.count(Outcome.COMMIT, by_check=True),
        "rolled_back": tally.count(Outcome.ROLLBACK),
        "discarded": tally.count(Outcome.DISCARD),
        "unresolved": len(sent) - len(tally.resolutions),
        "check_backs_sent": tally.checks,
        "records_refused": sum(tally.refusals.values()),
        "confirmed_orders": len(tally.confirmed),
        "messages_in_topic": len(tally.topic_order_ids),
        "credits_granted": len(tally.credit_order_ids),
        "credits_service_killed": credits_killed,
        "invariant_holds": not broken,
        "failures": broken + failures,
    }


def report(tally: Tally, plan: list[Order], sent: dict[str, Order], not_sent: list[Order], config: CoordinatorConfig,
           failures: list[str], out: Out, footer: str) -> int:
    """Print the summary and the verdict; return the exit code (1 on any failure, 0 otherwise).

    Example::

        report(read_tally(config, store, sent), plan, sent, [], config, [], print, "")  # 0 when all is well
    """
    for line in summary_lines(tally, plan, not_sent, config):
        out(line)
    for mismatch in fate_mismatches(tally, plan):
        out(f"  note: {mismatch}")
    out("")
    out(footer)
    broken = invariant_failures(tally, sent)
    for failure in broken + failures:
        out(f"FAILED: {failure}")
    counts = (len(tally.confirmed), len(tally.topic_order_ids), len(tally.credit_order_ids))
    if broken:
        out("INVARIANT FAILED: orders in SQLite {}, messages in topic {}, credits granted {}".format(*counts))
        return 1
    out(f"invariant holds: orders in SQLite = messages in topic = credits granted = {counts[0]}")
    return 1 if failures else 0


def _stop_jobs(jobs: list[Job], out: Out) -> list[str]:
    """SIGTERM every job at once, then wait for each; a non-zero exit is a failure."""
    for job in jobs:
        job.ensure_running()
    for job in jobs:
        job.terminate()
    failures = []
    for job in jobs:
        code = job.stop()
        out(f"the {job.name} job exited with code {code} after SIGTERM")
        if code != 0:
            failures.append(f"the {job.name} job exited with code {code}; last lines of {job.log_path}:\n{job.tail()}")
    return failures


def _stop_quietly(jobs: list[Job]) -> None:
    """On the way out after a failure or Ctrl-C: no job may outlive the demo."""
    for job in jobs:
        job.terminate()
    for job in jobs:
        try:
            job.stop(timeout_s=30)
        except DemoError:
            pass  # killed; the failure being reported already says what went wrong


def _log_producer_to(path: Path) -> None:
    """Send the producer side's log to a file, as JSON lines: the console is for the story."""
    logger = logging.getLogger("coordinator")
    for handler in list(logger.handlers):
        if getattr(handler, "_txcoord_demo", False):
            logger.removeHandler(handler)
            handler.close()
    handler = logging.FileHandler(path)
    handler._txcoord_demo = True
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
