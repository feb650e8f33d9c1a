"""Chaos harness: the invariants of docs/design.md#invariants under kill -9, with real processes on this machine.

Runs several producer processes (``bench/chaos_producer.py``, each with its own SQLite
store and producer group), the real checker (``spark-submit jobs/checker.py``) and
table maintenance (``coordinator.ops.maintenance.maintain``) at once, then:

- SIGKILLs the checker's whole process group at random moments (mid-batch, as batches
  run back to back) and restarts it at once, as a supervisor would (the new run takes the
  lease over as soon as the killed run's process is gone); with ``--standby`` a second
  checker stands by with its Spark session up, each kill hits the active one, the standby
  takes over, and the killed one, restarted, stands by in its turn. Each kill's failover
  (the kill to the next checker's first finished batch) is reported;
- SIGKILLs producer processes in the middle of their sends and group commits, and
  restarts them at once (a restarted producer skips what it already attempted);
- appends hostile records to a forging group's own commit log: malformed ones, and forgeries (claiming
  another group, an operator's mark, a topic the group is not granted);
- commits by hand, as an operator would (``txcoord resolve --commit``), about half of the
  transactions the checker discards, the first of them twice at once (two operators racing).

Once every half is resolved (or the timeout passes), it stops everything gracefully and
checks, from the Delta tables and each producer's SQLite ground truth: every locally
committed transaction's messages are in their topics exactly once; nothing else is in
any topic; every half is resolved or pending with fewer than ``transaction_check_max``
checks, with the outcome its database dictates (a discarded one an operator committed:
delivered exactly once, a DISCARD then a COMMIT op row per half); no check before immunity,
none beyond the maximum; every hostile record is in ``system/rejected``; neither the checker nor a
producer failed on its own. Prints what it did and what it found, writes both as JSON,
and exits 1 on any violation.

    python bench/chaos.py                                   # the small default run
    python bench/chaos.py --transactions 2000 --checker-kills 5 --producer-kills 8
    python bench/chaos.py --standby                         # kills the active of two checkers
    python bench/chaos.py --object-store                    # the lakehouse on a loopback S3 server
    python bench/chaos.py --object-store --storage-faults   # ... reached through a proxy that injects faults
    python bench/chaos.py --tiny                            # 10 transactions, one kill of each: about a minute

With ``--object-store`` the lakehouse is a prefix of a bucket on a real S3-compatible server
(``scripts/s3_server.py``, started for the run); the run's directory keeps only the logs, the
producers' SQLite stores and the configuration (whose ``[storage]`` table reaches the server).
With ``--storage-faults`` too, every request (the producers', the checker's, its Spark checkpoint's,
maintenance's, the verification's) goes through ``bench/storage_faults.py``, which answers 503
SlowDown and 500, delays, resets connections and drops replies after making the write, at the
rates of ``STORAGE_FAULT_RATES`` until the kills are done; then the faults stop and everything must
settle without a restart. The report adds the faults injected by kind, and how many retries and
recognised own writes the processes logged; the verdict adds two counts: records committed twice
(a commit made again after its reply was lost) and sends that said "not stored" of a half that was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Optional

from deltalake.exceptions import DeltaError

import benchlib
from storage_faults import FaultProxyProcess
from chaos_producer import (
    AUDIT_TOPIC,
    COMMITTED,
    HALF_NOT_STORED,
    HALF_OUTCOME_UNKNOWN,
    INTERRUPTED,
    KIND_UNKNOWN_FOREVER,
    KINDS,
    ORDER_TOPIC,
    REVIEW,
    Store,
    group_of,
    plan_id_of,
)
from coordinator.spark import spark_submit
from coordinator.config import CoordinatorConfig
from coordinator.commit_logs import CommitLogs
from coordinator.lakehouse import Lakehouse, init_lakehouse, topic_names
from coordinator.ops.resolve import resolve_transaction
from coordinator.producer.commit_log import CommitLogWriter
from coordinator.protocol import LocalTransactionState
from coordinator.tables import CHECK_REQUESTS, DISCARDED, HALF, OP, REJECTED

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "scripts"))
from s3_server import S3Server  # noqa: E402  (scripts/s3_server.py)

#: The bucket of ``--object-store`` runs.
OBJECT_STORE_BUCKET = "chaos"
#: ``--storage-faults``: each request's chance of each fault (bench/storage_faults.py), about one in
#: twenty faulty in all, and a delayed request's wait.
STORAGE_FAULT_RATES = {"slowdown": 0.02, "error": 0.01, "delay": 0.005, "reset": 0.01, "drop_reply": 0.01}
STORAGE_FAULT_DELAY_S = 1.0
PRODUCER_SCRIPT = BENCH / "chaos_producer.py"
CONFIG_NAME = "chaos.toml"
#: Short timings, so unknown transactions are checked and discarded within the run.
SETTINGS = {
    "transaction_timeout_ms": 3000,
    "transaction_check_interval_ms": 3000,
    "transaction_check_max": 3,
    "trigger_interval_ms": 1000,
}
#: Relative frequency of each kind of planned transaction (every kind also appears at least once).
KIND_WEIGHTS = {"commit": 40, "rollback": 10, "unknown_then_commit": 10, "unknown_then_rollback": 10,
                "unknown_forever": 5, "listener_raises": 10, "multi_topic_commit": 15}
#: The group hostile records pretend to be: no process answers its checks.
FORGED_GROUP = "chaos_forged"
#: A checker run is killed once it has finished 0 to this many batches, then up to _MAX_KILL_DELAY_S later:
#: during its first batch, a later one, or between two (a batch takes seconds here, and the next starts at once).
_MAX_BATCHES_BEFORE_KILL = 2
_MAX_KILL_DELAY_S = 10.0
_POLL_S = 0.2
#: A producer kill waits up to this long for a send to be in flight.
_AIM_AT_SEND_S = 5.0
_SETTLE_POLL_S = 3.0
_STOP_TIMEOUT_S = 120.0
_EXAMPLES = 5
#: The op rows of each half of a discarded transaction an operator committed.
RECOVERED_OPS = ["COMMIT", "DISCARD"]
_RECOVERED = "COMMIT by an operator after DISCARD"
#: Run in a subprocess, so that delta-rs's exit-time abort over Spark-written tables (see
#: coordinator.lakehouse.read_table) cannot take the harness down with it.
_MAINTAIN = """
import dataclasses, json, sys
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse
from coordinator.ops.maintenance import maintain
lakehouse = Lakehouse.of(CoordinatorConfig.load(sys.argv[1], environ={}))
tables, retention_hours = json.loads(sys.argv[2]), int(sys.argv[3])
print(json.dumps([dataclasses.asdict(r) for r in maintain(lakehouse, tables=tables, retention_hours=retention_hours)]))
"""


#: ``--tiny``: a few transactions (every kind, and more than one of some) from two producers over 5 s, one
#: checker and one producer kill. Its seed plans two transactions held for review, and its operator commits
#: the first discard it sees (seed 1's passes it over): the run goes through a recovery even when the producer
#: kill cuts one of the two short.
TINY = {"transactions": 10, "producers": 2, "checker_kills": 1, "producer_kills": 1, "seed": 15, "send_seconds": 5.0,
        "maintenance_every": 5.0, "timeout": 300.0}


@dataclass(frozen=True)
class Options:
    transactions: int = 150
    producers: int = 3
    checker_kills: int = 2
    producer_kills: int = 3
    seed: int = 1
    lakehouse: str = "chaos-lakehouse"
    results: str = str(BENCH / "results" / "chaos.json")
    timeout: float = 600.0
    send_seconds: float = 45.0
    maintenance_every: float = 10.0
    retention_hours: int = 1
    standby: bool = False
    object_store: bool = False
    storage_faults: bool = False


def parse_options(argv: Optional[list[str]] = None) -> Options:
    defaults = Options()
    parser = argparse.ArgumentParser(description="Kill the checker and producers at random; verify docs/design.md#invariants.")
    parser.add_argument("--transactions", type=int, default=defaults.transactions, help="planned transactions in all")
    parser.add_argument("--producers", type=int, default=defaults.producers, help="producer processes")
    parser.add_argument("--checker-kills", type=int, default=defaults.checker_kills)
    parser.add_argument("--producer-kills", type=int, default=defaults.producer_kills)
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seeds the plan and every random moment")
    parser.add_argument("--lakehouse", default=defaults.lakehouse, help="wiped and recreated (must be empty or a chaos run's)")
    parser.add_argument("--results", default=defaults.results, help="where to write the JSON report")
    parser.add_argument("--timeout", type=float, default=defaults.timeout, help="give up this many seconds after the start")
    parser.add_argument("--send-seconds", type=float, default=defaults.send_seconds,
                        help="the producers spread their sends over this many seconds")
    parser.add_argument("--maintenance-every", type=float, default=defaults.maintenance_every,
                        help="seconds between two maintenance runs")
    parser.add_argument("--retention-hours", type=int, default=defaults.retention_hours,
                        help="vacuum retention passed to maintain(), at least 1 (hours) while producers write")
    parser.add_argument("--standby", action="store_true",
                        help="run a second checker standing by; each checker kill hits the active one")
    parser.add_argument("--object-store", action="store_true",
                        help="the lakehouse on a loopback S3 server (scripts/s3_server.py); --lakehouse keeps the logs")
    parser.add_argument("--storage-faults", action="store_true",
                        help="with --object-store: every request through bench/storage_faults.py, which answers "
                             "503 and 500, delays, resets connections and drops replies after the write, at random "
                             f"(seeded by --seed; rates {STORAGE_FAULT_RATES}) until the kills are done")
    args = benchlib.parse_args(parser, argv, "chaos", TINY)
    if args.storage_faults and not args.object_store:
        parser.error("--storage-faults needs --object-store: the faults are those of an S3 server's")
    if args.transactions < len(KINDS):
        parser.error(f"--transactions must be at least {len(KINDS)}, one of each kind")
    if args.producers < 1 or args.checker_kills < 0 or args.producer_kills < 0:
        parser.error("--producers must be at least 1, kill counts at least 0")
    return Options(**{name: value for name, value in vars(args).items() if name != "tiny"})


# --------------------------------------------------------------------------- processes


class Child:
    """A child process in its own process group (so a kill reaches everything it spawned), logging to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> None:
        self.argv, self.env, self.log_path, self.cwd = argv, env, log_path, cwd
        self.process: Optional[subprocess.Popen] = None
        self.started_at = 0.0

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.started_at = time.monotonic()

    def exit_code(self) -> Optional[int]:
        return None if self.process is None else self.process.poll()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (spark-submit's JVM runs the Python driver as its child)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def terminate(self) -> None:
        """Ask for a graceful stop (SIGTERM)."""
        if self.running:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        """Wait for the exit, SIGKILL after ``timeout_s``; return the exit code."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` without ``TXCOORD_*`` (the run's TOML decides every setting), unbuffered."""
    clean = {key: value for key, value in env.items() if not key.startswith("TXCOORD_")}
    clean.update(PYTHONUNBUFFERED="1")
    return clean


class Checker:
    """The real checker job, started, SIGKILLed and restarted; each run logs to its own file."""

    def __init__(self, root: Path, config_path: Path, name: str = "checker") -> None:
        self.root, self.name = root, name
        self.argv, env = spark_submit(BENCH.parent / "jobs" / "checker.py", "--config", str(config_path))
        self.env = child_environment(env)
        self.child: Optional[Child] = None
        self.log: Optional[benchlib.CheckerLog] = None  # the current run's
        self.starts = 0
        self.failures: list[str] = []
        self.last_batch_at = 0.0
        self.first_batch_at: Optional[float] = None  # this run's

    def start(self) -> None:
        self.starts += 1
        self.child = Child(self.argv, self.env, self.root / f"{self.name}-{self.starts}.log", self.root)
        self.child.start()
        self.log = benchlib.CheckerLog(str(self.child.log_path))
        self.last_batch_at = 0.0
        self.first_batch_at = None

    @property
    def active(self) -> bool:
        """Whether this run holds the lease: its streaming query started (a standby's has not)."""
        return self.child.running and self.log.query_started

    def follow_log(self) -> None:
        """Read this run's new log lines: has its query started, how many batches has it finished."""
        if self.log.follow():
            self.last_batch_at = time.monotonic()
            self.first_batch_at = self.first_batch_at or self.last_batch_at

    def kill(self) -> dict:
        self.follow_log()
        now = time.monotonic()
        self.child.kill()
        return {"after_start_s": round(now - self.child.started_at, 1), "batches_finished": self.log.batches,
                "since_last_batch_s": round(now - self.last_batch_at, 1) if self.log.batches else None}


class Producer:
    """One producer process: its plan, its SQLite store, and its successive runs."""

    def __init__(self, root: Path, index: int, config_path: Path, start_at: float, send_seconds: float) -> None:
        self.index = index
        self.db = root / f"producer-{index}.db"
        Store(str(self.db)).create()  # before the first run: a kill may look for sends in flight at once
        self.done_file = root / f"producer-{index}.done"
        self.plan_file = root / f"plan-{index}.json"
        argv = [sys.executable, str(PRODUCER_SCRIPT), "--config", str(config_path), "--index", str(index),
                "--plan", str(self.plan_file), "--db", str(self.db), "--start-at", repr(start_at),
                "--send-seconds", repr(send_seconds), "--done-file", str(self.done_file)]
        self.child = Child(argv, child_environment(dict(os.environ)),
                           root / f"producer-{index}.log", root)
        self.restarts = 0
        self.failures: list[str] = []

    @property
    def done(self) -> bool:
        return self.done_file.exists()


# --------------------------------------------------------------------------- the run


def make_plan(transactions: int, producers: int, rng: random.Random) -> list[list[tuple[str, str]]]:
    """Each producer's planned transactions ``(plan_id, kind)``; every kind at least once overall."""
    kinds = list(KINDS) + rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()),
                                      k=transactions - len(KINDS))
    rng.shuffle(kinds)
    plans: list[list[tuple[str, str]]] = [[] for _ in range(producers)]
    for position, kind in enumerate(kinds):
        index = position % producers
        plans[index].append((f"p{index}-{len(plans[index]):05d}", kind))
    return plans


def prepare(root: Path, producers: int, lakehouse: Optional[str] = None, storage: Optional[dict[str, str]] = None) -> Path:
    """Wipe and recreate the run's directory (the lakehouse too, unless ``lakehouse`` names another
    place, reached with ``storage``); refuse a non-empty one a chaos run did not make. The producers'
    groups may publish to the chaos topics, the forging group to the order topic only."""
    if root.exists():
        if any(root.iterdir()) and not (root / CONFIG_NAME).exists():
            raise SystemExit(f"refusing to wipe {root}: not empty and no {CONFIG_NAME} in it; choose another --lakehouse")
        shutil.rmtree(root)
    root.mkdir(parents=True)
    config_path = root / CONFIG_NAME
    lines = ["# Written by bench/chaos.py.", f"lakehouse = {json.dumps(lakehouse or str(root))}"]
    lines += [f"{key} = {value}" for key, value in SETTINGS.items()]
    if storage:
        lines += ["", "[storage]", *(f"{key} = {json.dumps(value)}" for key, value in storage.items())]
    lines += ["", "[topic_grants]", *(f'{group_of(index)} = ["CHAOS_*"]' for index in range(producers)),
              f"{FORGED_GROUP} = [{json.dumps(ORDER_TOPIC)}]"]
    config_path.write_text("\n".join(lines) + "\n")
    init_lakehouse(Lakehouse.of(CoordinatorConfig.load(config_path, environ={})))
    return config_path


class Maintenance:
    """Runs ``coordinator.ops.maintenance.maintain`` over the commit log and the topics, over and over, in a thread."""

    def __init__(self, config_path: Path, every_s: float, retention_hours: int) -> None:
        self.config_path, self.every_s, self.retention_hours = config_path, every_s, retention_hours
        self.runs = 0
        self.files_compacted = 0
        self.files_vacuumed = 0
        self.skipped: Counter = Counter()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="maintenance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            tables = [*(ref.key for ref in CommitLogs(Lakehouse.of(CoordinatorConfig.load(self.config_path, environ={})))
                        .discover()), f"topics/{ORDER_TOPIC}", f"topics/{AUDIT_TOPIC}"]
            result = subprocess.run([sys.executable, "-c", _MAINTAIN, str(self.config_path), json.dumps(tables),
                                     str(self.retention_hours)],
                                    capture_output=True, text=True, env=child_environment(dict(os.environ)))
            self.runs += 1
            if result.returncode != 0:
                self.errors.append(f"exit {result.returncode}: {result.stderr.strip()[-1500:]}")
                continue
            for table in json.loads(result.stdout.strip().splitlines()[-1]):
                self.files_compacted += table["files_compacted"]
                self.files_vacuumed += table["files_vacuumed"]
                # The first line names the step; what follows (versions, error details) varies run to run.
                self.skipped.update(f"{table['table']}: {reason.split(':')[0]}" for reason in table["skipped"])


@dataclass
class BadInput:
    """A hostile record appended straight to the commit log, and what became of it."""

    what: str
    record_id: str
    reason: Optional[str] = None
    forgery: bool = False  # claims what its writer may not: another group, an operator's mark, an ungranted topic


class HostileWriter:
    """Appends records no well-behaved producer sends to the commit log of :data:`FORGED_GROUP`, a group
    whose principal may write only that log."""

    def __init__(self, lakehouse: Lakehouse, rng: random.Random) -> None:
        self.lakehouse, self.rng = lakehouse, rng
        self.injected: list[BadInput] = []

    def inject_blind(self) -> None:
        """Records that are refused whatever the lakehouse holds."""
        early_txn = uuid.uuid4().hex
        self._write([
            ("unknown kind", _end(kind="BOGUS")),
            ("null kind", _end(kind=None)),
            ("half without transaction_id", _half(transaction_id=None)),
            ("half with an empty body", _half(body=b"")),
            ("half with an invalid topic", _half(topic="no spaces allowed!")),
            ("half of an incomplete transaction", _half(message_count=2)),
            ("end with an unknown state", _end(state="MAYBE")),
            ("end of an unknown transaction", _end()),
            ("end without transaction_id", _end(transaction_id=None)),
            ("end before its half", _end(transaction_id=early_txn)),
        ])
        # The half the early END named, in a later commit: valid, but nobody answers its checks.
        with CommitLogWriter(self.lakehouse, FORGED_GROUP) as writer:
            writer.submit([_half(transaction_id=early_txn)]).result()

    def inject_targeted(self, plans: list[list[tuple[str, str]]], require_every_target: bool) -> bool:
        """Records aimed at real transactions: a pending one, a rolled-back one, a committed one.

        Returns ``False``, writing nothing, if ``require_every_target`` and one of them does not exist yet.
        """
        kind_of = {plan_id: kind for plan in plans for plan_id, kind in plan}
        halves = _rows(self.lakehouse, HALF, ["transaction_id", "producer_group", "body", "message_index"])
        outcomes = {row["transaction_id"]: row["outcome"] for row in _rows(self.lakehouse, OP, ["transaction_id", "outcome"])}
        ours = [row for row in halves if row["producer_group"] != FORGED_GROUP and row["message_index"] == 0]

        def pick(condition) -> Optional[dict]:
            candidates = [row for row in ours if condition(row)]
            return self.rng.choice(candidates) if candidates else None

        pending_forever = pick(lambda row: kind_of.get(plan_id_of(row["body"])) == KIND_UNKNOWN_FOREVER
                               and row["transaction_id"] not in outcomes)
        rolled_back = pick(lambda row: outcomes.get(row["transaction_id"]) == "ROLLBACK")
        committed = pick(lambda row: outcomes.get(row["transaction_id"]) == "COMMIT")
        if require_every_target and None in (pending_forever, rolled_back, committed):
            return False
        records, forgeries = [], []
        if pending_forever:
            records.append(("forged group commits a pending transaction",
                            _end(transaction_id=pending_forever["transaction_id"])))
            records.append(("null group commits a pending transaction",
                            _end(transaction_id=pending_forever["transaction_id"], producer_group=None)))
            forgeries = [
                ("claims the owner's group to commit a pending transaction",
                 _end(transaction_id=pending_forever["transaction_id"], producer_group=pending_forever["producer_group"])),
                ("an operator's mark from a group commits a pending transaction",
                 _end(transaction_id=pending_forever["transaction_id"], check_id=f"operator-{uuid.uuid4().hex}")),
                ("the owner's group and an operator's mark",
                 _end(transaction_id=pending_forever["transaction_id"], producer_group=pending_forever["producer_group"],
                      check_id=f"operator-{uuid.uuid4().hex}")),
                ("a half for a topic the group is not granted", _half(topic=AUDIT_TOPIC)),
                ("a half claiming another group", _half(producer_group=pending_forever["producer_group"])),
            ]
        if rolled_back:
            records.append(("owner commits a rolled-back transaction",
                            _end(transaction_id=rolled_back["transaction_id"], producer_group=rolled_back["producer_group"])))
        if committed:
            records.append(("second half for a committed transaction id",
                            _half(transaction_id=committed["transaction_id"], producer_group=committed["producer_group"])))
        if records:
            self._write(records, forgeries)
        return True

    def _write(self, records: list[tuple[str, dict]], forgeries: list[tuple[str, dict]] = ()) -> None:
        """Append ``records`` and ``forgeries`` (records claiming what their writer may not) as one commit."""
        with CommitLogWriter(self.lakehouse, FORGED_GROUP) as writer:
            writer.submit([record for _, record in [*records, *forgeries]]).result()
        self.injected += [BadInput(what, record["record_id"]) for what, record in records]
        self.injected += [BadInput(what, record["record_id"], forgery=True) for what, record in forgeries]


class Operator:
    """Commits by hand, as ``txcoord resolve --commit`` does, about half of the transactions the checker
    discards; the first one twice at once, as two operators racing would."""

    def __init__(self, config: CoordinatorConfig, groups: set[str], rng: random.Random) -> None:
        self.config, self.groups, self.rng = config, groups, rng
        self.recovered: set[str] = set()
        self.sent = 0
        self._looked_at: set[str] = set()
        self._next_at = 0.0

    def act(self, now: bool = False) -> int:
        """Look for new discards (every few seconds, or ``now``) and recover some of them; return how many."""
        if not now and time.monotonic() < self._next_at:
            return 0
        self._next_at = time.monotonic() + _SETTLE_POLL_S
        try:
            rows = _rows(Lakehouse.of(self.config), DISCARDED, ["transaction_id", "producer_group"])
        except (OSError, DeltaError):  # a file vacuumed between snapshot and read: look again next time
            return 0
        discarded = {row["transaction_id"]: row["producer_group"] for row in rows}
        recovered_before = len(self.recovered)
        for transaction_id in sorted(set(discarded) - self._looked_at):
            self._looked_at.add(transaction_id)
            if discarded[transaction_id] not in self.groups or self.rng.random() < 0.5:
                continue
            for _ in range(1 if self.recovered else 2):
                resolve_transaction(self.config, transaction_id, LocalTransactionState.COMMIT_MESSAGE,
                                    "chaos: recovered by hand", operator="chaos-operator")
                self.sent += 1
            self.recovered.add(transaction_id)
        return len(self.recovered) - recovered_before


def _half(**overrides) -> dict:
    record = dict(record_id=uuid.uuid4().hex, kind="HALF", transaction_id=uuid.uuid4().hex, producer_group=FORGED_GROUP,
                  msg_id=uuid.uuid4().hex, message_index=0, message_count=1, topic=ORDER_TOPIC, keys="forged",
                  tags=None, properties={}, body=b"forged", born_timestamp=datetime.now(timezone.utc))
    record.update(overrides)
    return record


def _end(**overrides) -> dict:
    record = dict(record_id=uuid.uuid4().hex, kind="END", transaction_id=uuid.uuid4().hex, producer_group=FORGED_GROUP,
                  state="COMMIT_MESSAGE", check_id=None, born_timestamp=datetime.now(timezone.utc))
    record.update(overrides)
    return record


def _rows(lakehouse: Lakehouse, table, columns: list[str]) -> list[dict]:
    if not lakehouse.exists(table):
        return []
    return lakehouse.read(table, columns).to_pylist()


@dataclass
class Activity:
    """What the harness did."""

    transactions_by_kind: dict[str, int] = field(default_factory=dict)
    checker_kills: list[dict] = field(default_factory=list)
    #: Per checker kill: seconds from the kill to the first batch finished by the checker that took over.
    failovers: list[dict] = field(default_factory=list)
    checker_starts: int = 0
    producer_kills: list[dict] = field(default_factory=list)
    producer_restarts: int = 0
    maintenance_runs: int = 0
    maintenance_errors: list[str] = field(default_factory=list)
    maintenance_files_compacted: int = 0
    maintenance_files_vacuumed: int = 0
    maintenance_steps_skipped: dict[str, int] = field(default_factory=dict)
    bad_inputs: list[dict] = field(default_factory=list)
    operator_recoveries: int = 0
    operator_commits_sent: int = 0
    settled: bool = False
    duration_s: float = 0.0
    #: --storage-faults: the proxy's counts when the faults stopped (requests, forwarded, injected by kind).
    storage_faults: Optional[dict] = None


class Run:
    """One chaos run, from an empty lakehouse to the verdict."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        self.root = Path(options.lakehouse).resolve()
        self.activity = Activity()
        self.faults: Optional[FaultProxyProcess] = None

    def execute(self) -> dict:
        with contextlib.ExitStack() as stack:
            lakehouse, storage = None, None
            if self.options.object_store:
                server = stack.enter_context(S3Server(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-s3-"))))
                server.create_bucket(OBJECT_STORE_BUCKET)
                lakehouse, storage = f"s3://{OBJECT_STORE_BUCKET}/{uuid.uuid4().hex}", server.storage_options
                print(f"lakehouse on a loopback S3 server ({server.endpoint}): {lakehouse}", flush=True)
                if self.options.storage_faults:
                    log = self.root.with_name(f"{self.root.name}.storage-faults.log")  # beside: the run wipes its directory
                    self.faults = stack.enter_context(FaultProxyProcess(
                        server.endpoint, seed=self.options.seed, rates=STORAGE_FAULT_RATES, delay_s=STORAGE_FAULT_DELAY_S,
                        log_path=str(log)))
                    storage = self.faults.storage_options(storage)
                    print(f"  every request through the storage-fault proxy at {self.faults.url}", flush=True)
            return self._execute(prepare(self.root, self.options.producers, lakehouse, storage))

    def _execute(self, config_path: Path) -> dict:
        options, rng = self.options, self.rng
        self.started = started = time.monotonic()
        self.config = CoordinatorConfig.load(config_path, environ={})
        self.plans = make_plan(options.transactions, options.producers, rng)
        self.activity.transactions_by_kind = dict(Counter(kind for plan in self.plans for _, kind in plan))
        start_at = time.time() + 2.0  # the producers' sending window opens once all have started
        self.producers = [Producer(self.root, index, config_path, start_at, options.send_seconds)
                          for index in range(options.producers)]
        for producer, plan in zip(self.producers, self.plans):
            producer.plan_file.write_text(json.dumps(plan))
        self.checkers = [Checker(self.root, config_path)]
        if options.standby:
            self.checkers.append(Checker(self.root, config_path, name="standby"))
        self.maintenance = Maintenance(config_path, options.maintenance_every, options.retention_hours)
        self.operator = Operator(self.config, {group_of(p.index) for p in self.producers}, random.Random(options.seed))
        self.hostile = HostileWriter(Lakehouse.of(self.config), random.Random(options.seed))
        window_end = started + 2.0 + options.send_seconds
        producer_kill_at = sorted(rng.uniform(started + 2.0, window_end) for _ in range(options.producer_kills))
        checker_kill_after = sorted(rng.uniform(started, window_end) for _ in range(options.checker_kills))
        blind_injection_at = started + 2.0 + options.send_seconds * 0.3
        deadline = started + options.timeout
        try:
            for checker in self.checkers:
                checker.start()
            for producer in self.producers:
                producer.child.start()
            self.maintenance.start()
            self._chaos(producer_kill_at, checker_kill_after, blind_injection_at, deadline)
            if self.faults is not None:  # the storage heals: everything must go on, with no restart
                self.faults.disable()
                self.activity.storage_faults = self.faults.counts() | {"seen_in_logs": self._storage_log_lines()}
            self.activity.settled = self._settle(deadline)
        finally:
            stop_codes = self._stop_all()
        self.activity.duration_s = round(time.monotonic() - started, 1)
        return self._report(stop_codes)

    def _chaos(self, producer_kill_at: list[float], checker_kill_after: list[float], blind_injection_at: float,
               deadline: float) -> None:
        """Kill, restart and inject until every planned kill is done and every producer has sent its plan."""
        kill_after_batches: Optional[int] = None
        kill_checker_at: Optional[float] = None
        blind_injected = targeted_injected = False
        killed_at: Optional[float] = None  # the last checker kill whose failover is not measured yet
        next_target_search = 0.0
        while time.monotonic() < deadline:
            now = time.monotonic()
            self._restart_failed_producers()
            self.operator.act()
            if producer_kill_at and now >= producer_kill_at[0]:
                producer_kill_at.pop(0)
                self._kill_a_producer()
            if not blind_injected and now >= blind_injection_at:
                self.hostile.inject_blind()
                blind_injected = True
            elif blind_injected and not targeted_injected and now >= next_target_search:
                targeted_injected = self.hostile.inject_targeted(self.plans, require_every_target=True)
                next_target_search = now + _SETTLE_POLL_S
            self._supervise_checkers()
            checker = self._active_checker()
            if killed_at is not None and checker is not None and checker.first_batch_at is not None:
                self.activity.failovers.append({"taken_over_by": checker.name,
                                                "failover_s": round(checker.first_batch_at - killed_at, 1)})
                killed_at = None
            if checker is not None and killed_at is None:
                if checker_kill_after and kill_after_batches is None and now >= checker_kill_after[0]:
                    kill_after_batches = self.rng.randint(0, _MAX_BATCHES_BEFORE_KILL)
                if kill_after_batches is not None and kill_checker_at is None and checker.log.batches >= kill_after_batches:
                    kill_checker_at = now + self.rng.uniform(0, _MAX_KILL_DELAY_S)
                if kill_checker_at is not None and now >= kill_checker_at:
                    checker_kill_after.pop(0)
                    kill_after_batches = kill_checker_at = None
                    self.activity.checker_kills.append({"at_s": round(now - self.started, 1), "checker": checker.name,
                                                        **checker.kill()})
                    killed_at = time.monotonic()
                    # Restarted at once, as a supervisor would: it takes the lease over as soon as it finds the
                    # killed run's process gone, or, with a standby already waiting, stands by in its turn.
                    checker.start()
            # Done once a checker is up again (it has finished a batch since its start) and a standby, if
            # any, stands by: a checker still starting when stopped would die of the SIGTERM (exit 143).
            if (not producer_kill_at and not checker_kill_after and blind_injected and checker is not None
                    and checker.log.batches and killed_at is None and all(p.done for p in self.producers)
                    and all(c.active or c.log.standing_by for c in self.checkers)):
                if not targeted_injected:
                    self.hostile.inject_targeted(self.plans, require_every_target=False)
                return
            time.sleep(_POLL_S)

    def _supervise_checkers(self) -> None:
        """Start a checker again at once if it exited on its own (a failure); read every running one's log."""
        for checker in self.checkers:
            if not checker.child.running:
                checker.failures.append(f"run {checker.starts} exited with code {checker.child.exit_code()}:\n"
                                        f"{checker.child.tail()}")
                checker.start()
            else:
                checker.follow_log()

    def _active_checker(self) -> Optional[Checker]:
        """The checker whose streaming query runs (it holds the lease); ``None`` between two holders."""
        return next((checker for checker in self.checkers if checker.active), None)

    def _kill_a_producer(self) -> None:
        sending = [p for p in self.producers if p.child.running and not p.done]
        if not sending:
            return
        producer = self.rng.choice(sending)
        store = Store(str(producer.db))
        # Aim at a send in flight (its half, local transaction or END not yet through), at a random point of it.
        aim_until = time.monotonic() + _AIM_AT_SEND_S
        while time.monotonic() < aim_until and store.sends_in_flight() == 0:
            time.sleep(0.005)
        time.sleep(self.rng.uniform(0, 0.01))  # a send lasts tens of milliseconds
        in_flight = store.sends_in_flight()
        producer.child.kill()
        self.activity.producer_kills.append({"producer": producer.index, "sends_in_flight": in_flight,
                                            "after_start_s": round(time.monotonic() - producer.child.started_at, 1)})
        producer.restarts += 1
        producer.child.start()

    def _restart_failed_producers(self) -> None:
        for producer in self.producers:
            if not producer.child.running:
                producer.failures.append(f"exited with code {producer.child.exit_code()}:\n{producer.child.tail()}")
                producer.restarts += 1
                producer.child.start()

    def _storage_log_lines(self) -> dict[str, int]:
        """How often the processes' logs say they retried a storage request, or found a write whose
        reply was lost already made (coordinator.retries), so far."""
        lines = [line for log in self.root.glob("*.log") for line in log.read_text(errors="replace").splitlines()]
        return {"retries": sum(" retried (attempt " in line for line in lines),
                "own_writes_recognised": sum("found already made by this writer" in line for line in lines),
                "requests_failed": sum(" time(s) in " in line and "the bound is" in line for line in lines)}

    def _settle(self, deadline: float) -> bool:
        """Wait until the tables agree with the ground truth and nothing is left to resolve."""
        while time.monotonic() < deadline:
            self._restart_failed_producers()
            self._supervise_checkers()
            self.operator.act()
            try:
                findings = verify(self.config, self.producers, self.hostile.injected, self.plans,
                                  self.operator.recovered)
            except (OSError, ValueError, DeltaError) as error:  # a file vacuumed between snapshot and read: read again
                print(f"  (reading the tables failed, retrying: {error})", flush=True)
                time.sleep(_SETTLE_POLL_S)
                continue
            if findings["pending_halves"] == 0 and findings["found"]["lost"] == 0:
                if self.operator.act(now=True):  # discards it had not seen yet: their recoveries must land too
                    continue
                return True
            time.sleep(_SETTLE_POLL_S)
        return False

    def _stop_all(self) -> dict:
        """SIGTERM whatever runs; return the exit codes (a process that was down already was reported then)."""
        self.maintenance.stop()
        children = {f"producer-{p.index}": p.child for p in self.producers}
        children.update({checker.name: checker.child for checker in self.checkers})
        running = {name: child for name, child in children.items() if child is not None and child.running}
        for child in running.values():
            child.terminate()
        return {name: child.wait(_STOP_TIMEOUT_S) for name, child in running.items()}

    def _report(self, stop_codes: dict) -> dict:
        activity = self.activity
        activity.checker_starts = sum(checker.starts for checker in self.checkers)
        activity.producer_restarts = sum(p.restarts for p in self.producers)
        activity.maintenance_runs = self.maintenance.runs
        activity.maintenance_errors = self.maintenance.errors
        activity.maintenance_files_compacted = self.maintenance.files_compacted
        activity.maintenance_files_vacuumed = self.maintenance.files_vacuumed
        activity.maintenance_steps_skipped = dict(self.maintenance.skipped)
        findings = verify(self.config, self.producers, self.hostile.injected, self.plans,
                          self.operator.recovered)
        activity.operator_recoveries = len(self.operator.recovered)
        activity.operator_commits_sent = self.operator.sent
        activity.bad_inputs = [asdict(bad) for bad in self.hostile.injected]
        failures = [f"{checker.name}: {f}" for checker in self.checkers for f in checker.failures]
        failures += [f"producer-{p.index}: {f}" for p in self.producers for f in p.failures]
        failures += [f"{name} exited with code {code} on SIGTERM" for name, code in stop_codes.items() if code != 0]
        failures += [f"maintenance: {error}" for error in self.maintenance.errors]
        found = findings["found"]
        found["process_failures"] = len(failures)
        found["not_settled"] = 0 if activity.settled else 1
        return {
            "run": {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
                    "options": asdict(self.options), "settings": SETTINGS},
            "did": asdict(activity),
            "outcomes_by_kind": findings["outcomes_by_kind"],
            "found": found,
            "violations": sum(found.values()),
            "examples": {**findings["examples"], "process_failures": failures[:_EXAMPLES]},
            "rejected_reasons": findings["rejected_reasons"],
        }


def machine() -> dict:
    return {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


# --------------------------------------------------------------------------- verification


@dataclass
class GroundTruth:
    """What the producers' SQLite databases say."""

    status: dict[str, str] = field(default_factory=dict)  # transaction_id -> committed | review
    messages: dict[str, dict] = field(default_factory=dict)  # msg_id -> transaction_id, topic, body
    returned: dict[str, str] = field(default_factory=dict)  # transaction_id -> state its send returned
    interrupted: list[str] = field(default_factory=list)  # plan ids whose send never returned
    not_stored: list[str] = field(default_factory=list)  # plan ids whose half could not be stored
    outcome_unknown: list[str] = field(default_factory=list)  # plan ids whose half the storage never confirmed

    @classmethod
    def read(cls, producers: list[Producer]) -> "GroundTruth":
        truth = cls()
        for producer in producers:
            if not producer.db.exists():
                continue
            with Store(str(producer.db)).snapshot() as db:
                truth.status.update(db.execute("SELECT transaction_id, status FROM orders"))
                for msg_id, transaction_id, topic, body in db.execute(
                        "SELECT msg_id, transaction_id, topic, body FROM order_messages"):
                    truth.messages[msg_id] = {"transaction_id": transaction_id, "topic": topic, "body": bytes(body)}
                for plan_id, transaction_id, state in db.execute(
                        "SELECT plan_id, transaction_id, returned_state FROM attempts"):
                    if state in (None, INTERRUPTED):
                        truth.interrupted.append(plan_id)
                    elif state == HALF_NOT_STORED:
                        truth.not_stored.append(plan_id)
                    elif state == HALF_OUTCOME_UNKNOWN:
                        truth.outcome_unknown.append(plan_id)
                    else:
                        truth.returned[transaction_id] = state
        return truth


def verify(config: CoordinatorConfig, producers: list[Producer], bad_inputs: list[BadInput],
           plans: list[list[tuple[str, str]]], recovered: set[str]) -> dict:
    """Compare the lakehouse with the ground truth; every count under ``found`` must be 0.

    ``recovered`` are the discarded transactions an operator committed: they must be delivered too.
    """
    lakehouse = Lakehouse.of(config)
    truth = GroundTruth.read(producers)
    truth.status.update({transaction_id: COMMITTED for transaction_id in recovered})
    kind_of = {plan_id: kind for plan in plans for plan_id, kind in plan}
    groups = {group_of(p.index) for p in producers}
    bad_ids = {bad.record_id for bad in bad_inputs}
    log = [row for ref in CommitLogs(lakehouse).discover()
           for row in _rows(lakehouse, ref.key, ["record_id", "kind", "transaction_id", "producer_group", "msg_id",
                                                 "state"])]
    halves = _rows(lakehouse, HALF, ["transaction_id", "producer_group", "queue_offset", "msg_id", "message_index",
                                          "body", "stored_timestamp", "immunity_ms"])
    ops = _rows(lakehouse, OP, ["half_offset", "transaction_id", "outcome", "end_record_id"])
    checks = _rows(lakehouse, CHECK_REQUESTS, ["check_id", "transaction_id", "check_times", "requested_at"])
    rejected = _rows(lakehouse, REJECTED, ["record_id", "reason", "producer_group"])
    topic_rows = []
    for topic in topic_names(lakehouse):
        topic_rows += _rows(lakehouse, f"topics/{topic}", ["transaction_id", "msg_id", "topic", "body"])

    examples: dict[str, list[str]] = defaultdict(list)
    found: Counter = Counter()

    def violation(name: str, example: str) -> None:
        found[name] += 1
        if len(examples[name]) < _EXAMPLES:
            examples[name].append(example)

    # Invariant 1: every locally committed transaction's messages, each exactly once, intact.
    delivered = Counter(row["msg_id"] for row in topic_rows)
    for msg_id, count in delivered.items():
        if count > 1:
            violation("duplicated", f"msg_id {msg_id} is {count} times in the topics")
    missing_by_txn = Counter(message["transaction_id"] for msg_id, message in truth.messages.items()
                             if truth.status.get(message["transaction_id"]) == COMMITTED and msg_id not in delivered)
    for transaction_id, missing in missing_by_txn.items():
        violation("lost", f"transaction {transaction_id} committed locally; {missing} of its messages not in any topic")
    # Invariant 2: nothing else in any topic.
    for row in topic_rows:
        expected = truth.messages.get(row["msg_id"])
        if expected is None or truth.status.get(expected["transaction_id"]) != COMMITTED:
            violation("leaked", f"{row['topic']} holds msg_id {row['msg_id']} of transaction {row['transaction_id']}, "
                                f"which did not commit locally")
        elif (row["transaction_id"], row["topic"], bytes(row["body"])) != (
                expected["transaction_id"], expected["topic"], expected["body"]):
            violation("leaked", f"{row['topic']} holds msg_id {row['msg_id']} altered: {row['transaction_id']}, "
                                f"{bytes(row['body'])[:40]!r}")

    # Invariant 3: no half lost; each resolved as its producer's database says, or still legitimately pending.
    # No record committed twice (a commit whose reply was lost, made again), and no send that said
    # "not stored" of a half that was.
    for record_id, count in Counter(row["record_id"] for row in log if row["record_id"] not in bad_ids).items():
        if count > 1:
            violation("committed_twice", f"record {record_id} is {count} times in the commit logs")
    stored_plans = {plan_id_of(row["body"]) for row in halves if row["producer_group"] in groups}
    for plan_id in set(truth.not_stored) & stored_plans:
        violation("false_send_result", f"the send of plan {plan_id} said its half was not stored; it was")
    half_msg_ids = Counter(row["msg_id"] for row in halves)
    for msg_id, count in half_msg_ids.items():
        if count > 1:
            violation("duplicated", f"msg_id {msg_id} is {count} times in system/half")
    logged_halves = [row for row in log if row["kind"] == "HALF" and row["producer_group"] in groups
                     and row["record_id"] not in bad_ids]
    for row in logged_halves:
        if row["msg_id"] not in half_msg_ids:
            violation("lost", f"half {row['msg_id']} of transaction {row['transaction_id']} is in the commit log, "
                              f"not in system/half")
    logged_txns = {row["transaction_id"] for row in logged_halves}
    for transaction_id, state in truth.returned.items():
        if transaction_id not in logged_txns:
            violation("lost", f"send of {transaction_id} returned {state} but its half is not in the commit log")
    outcomes: dict[str, set[str]] = defaultdict(set)
    ops_of_half: dict[int, list[dict]] = defaultdict(list)
    for row in ops:
        ops_of_half[row["half_offset"]].append(row)
    for offset, rows in ops_of_half.items():
        found_ops = sorted(row["outcome"] for row in rows)
        if len(found_ops) > 1 and not (rows[0]["transaction_id"] in recovered and found_ops == RECOVERED_OPS):
            violation("duplicated", f"half offset {offset} has op rows {found_ops}")
    for row in ops:
        outcomes[row["transaction_id"]].add(row["outcome"])
    checks_of = defaultdict(list)
    for row in checks:
        checks_of[row["transaction_id"]].append(row)
    for check_id, count in Counter(row["check_id"] for row in checks).items():
        if count > 1:
            violation("duplicated", f"check {check_id} was requested {count} times")
    pending = 0
    outcomes_by_kind: dict[str, Counter] = defaultdict(Counter)
    first_halves = [row for row in halves if row["message_index"] == 0]
    for half in first_halves:
        transaction_id = half["transaction_id"]
        found_outcomes = outcomes.get(transaction_id, set())
        was_recovered = transaction_id in recovered and found_outcomes == set(RECOVERED_OPS)
        if len(found_outcomes) > 1 and not was_recovered:
            violation("duplicated", f"transaction {transaction_id} resolved as {sorted(found_outcomes)}")
        outcome = "COMMIT" if was_recovered else next(iter(found_outcomes)) if len(found_outcomes) == 1 else None
        times_checked = len(checks_of.get(transaction_id, ()))
        if outcome is None:
            pending += 1
            if times_checked >= config.transaction_check_max:
                violation("unresolved", f"transaction {transaction_id} pending after {times_checked} checks")
        if half["producer_group"] not in groups:
            continue  # hostile traffic: its outcome is checked through the topics and system/rejected
        kind = kind_of.get(plan_id_of(half["body"]), "unplanned")
        outcomes_by_kind[kind][_RECOVERED if was_recovered else outcome or "pending"] += 1
        status = truth.status.get(transaction_id)
        expected = {COMMITTED: "COMMIT", REVIEW: "DISCARD", None: "ROLLBACK"}[status]
        if outcome is not None and outcome != expected and status != COMMITTED:  # committed ones count as lost above
            violation("wrong_outcome", f"transaction {transaction_id} ({kind}, local status {status}) ended {outcome}")
    # Invariant 4: no check before immunity, none beyond the maximum.
    half_of = {row["transaction_id"]: row for row in first_halves}
    for transaction_id, requests in checks_of.items():
        half = half_of.get(transaction_id)
        if len(requests) > config.transaction_check_max or max(r["check_times"] for r in requests) > config.transaction_check_max:
            violation("over_checked", f"transaction {transaction_id} checked {len(requests)} times")
        if half is None:
            violation("early_checks", f"transaction {transaction_id} checked but not in system/half")
            continue
        immune_until = half["stored_timestamp"] + timedelta(milliseconds=half["immunity_ms"])
        for request in requests:
            if request["requested_at"] < immune_until:
                violation("early_checks", f"check {request['check_id']} at {request['requested_at']}, "
                                          f"immune until {immune_until}")
    # Invariant 6: every hostile record refused, with its reason.
    reasons = {row["record_id"]: row["reason"] for row in rejected}
    for bad in bad_inputs:
        bad.reason = reasons.get(bad.record_id)
        if bad.reason is None:
            violation("forged_accepted" if bad.forgery else "bad_input_unrecorded",
                      f"{bad.what} (record {bad.record_id}) is not in system/rejected")
    # Decisions not yet looked at: a COMMIT or ROLLBACK in the log that is neither an op nor a refusal.
    looked_at = {row["end_record_id"] for row in ops} | set(reasons)
    undecided_ends = sum(1 for row in log if row["kind"] == "END" and row["state"] in ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE")
                         and row["record_id"] not in looked_at)
    valid_reasons = Counter(row["reason"] for row in rejected if row["producer_group"] in groups
                            and row["record_id"] not in bad_ids)
    return {
        "found": {name: found[name] for name in ("lost", "duplicated", "leaked", "wrong_outcome", "early_checks",
                                                   "over_checked", "unresolved", "bad_input_unrecorded",
                                                   "forged_accepted", "committed_twice", "false_send_result")},
        "forgeries_refused": sum(1 for bad in bad_inputs if bad.forgery and bad.reason is not None),
        "violations": sum(found.values()),
        "examples": {name: list(values) for name, values in examples.items()},
        "pending_halves": pending + undecided_ends
                          + sum(1 for bad in bad_inputs if bad.reason is None),
        "outcomes_by_kind": {kind: dict(counts) for kind, counts in sorted(outcomes_by_kind.items())}
                            | {"send interrupted by a kill": len(truth.interrupted),
                               "half not stored": len(truth.not_stored),
                               "half outcome unknown (its half stored: rolled back by check)":
                                   len(set(truth.outcome_unknown) & stored_plans),
                               "half outcome unknown (not stored)": len(set(truth.outcome_unknown) - stored_plans)},
        "rejected_reasons": {"valid producers' records": dict(valid_reasons)},
    }


# --------------------------------------------------------------------------- output


def print_report(report: dict) -> None:
    did, found = report["did"], report["found"]
    print()
    print("did")
    rows = [(f"transactions: {kind}", count) for kind, count in sorted(did["transactions_by_kind"].items())]
    rows += [("checker kills (SIGKILL, process group)", len(did["checker_kills"])),
             ("checker starts", did["checker_starts"]),
             ("failover after each checker kill (s)", ", ".join(str(f["failover_s"]) for f in did["failovers"]) or "-"),
             ("producer kills (SIGKILL)", len(did["producer_kills"])),
             ("producer restarts", did["producer_restarts"]),
             ("maintenance runs", did["maintenance_runs"]),
             ("maintenance errors", len(did["maintenance_errors"])),
             ("maintenance: files compacted away / vacuumed",
              f"{did['maintenance_files_compacted']} / {did['maintenance_files_vacuumed']}"),
             ("bad inputs", len(did["bad_inputs"])),
             ("discarded, then committed by an operator (COMMITs sent)",
              f"{did['operator_recoveries']} ({did['operator_commits_sent']})"),
             ("settled", did["settled"]),
             ("duration (s)", did["duration_s"])]
    if did["storage_faults"] is not None:
        faults = did["storage_faults"]
        rows += [("storage requests (through the fault proxy, until the faults stopped)", faults["requests"])]
        rows += [(f"storage faults: {kind}", count) for kind, count in faults["injected"].items()]
        rows += [(f"storage, in the processes' logs: {what}", count) for what, count in faults["seen_in_logs"].items()]
    _print_rows(rows)
    print("outcomes by kind")
    _print_rows([(kind, json.dumps(counts) if isinstance(counts, dict) else counts)
                 for kind, counts in report["outcomes_by_kind"].items()])
    print("bad inputs → system/rejected")
    _print_rows([(bad["what"], bad["reason"] or "NOT RECORDED") for bad in did["bad_inputs"]])
    print("found (all must be 0)")
    _print_rows(list(found.items()))
    for name, examples in report["examples"].items():
        for example in examples:
            print(f"  {name}: {example}")
    print(f"violations: {report['violations']}")


def _print_rows(rows: list[tuple[str, object]]) -> None:
    width = max((len(name) for name, _ in rows), default=0)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


def main(argv: Optional[list[str]] = None) -> int:
    options = parse_options(argv)
    print(f"chaos run: {options.transactions} transactions from {options.producers} producer processes, "
          f"{options.checker_kills} checker kills, {options.producer_kills} producer kills, seed {options.seed}, "
          f"in {Path(options.lakehouse).resolve()}" + (" (logs; the lakehouse on S3)" if options.object_store else ""),
          flush=True)
    report = Run(options).execute()
    print_report(report)
    results = Path(options.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"report: {results}")
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
