"""The processes and people of a chaos run: the checker job (killed and restarted as a supervisor would),
the producer processes, table maintenance, and an operator committing discarded transactions by hand."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

from deltalake.exceptions import DeltaError

import support
from bench.chaos.options import CONFIG_NAME, FORGED_GROUP, KIND_WEIGHTS, POISON_GROUP, SETTINGS
from bench.chaos.producer import AUDIT_TOPIC, KINDS, ORDER_TOPIC, Store, group_of
from coordinator.commit_logs import CommitLogs
from coordinator.config import CoordinatorConfig
from coordinator.exceptions import InvalidArgumentError
from coordinator.lakehouse import Lakehouse, init_lakehouse
from coordinator.ops.resolve import resolve_transaction
from coordinator.protocol import LocalTransactionState
from coordinator.tables import DISCARDED

__all__ = ["Checker", "LOOK_EVERY_S", "Maintenance", "Operator", "Producer", "make_plan", "plan_producer_kills", "prepare", "table_rows"]

#: How often the operator looks for new discards (and the run, in the end, for a settled lakehouse).
LOOK_EVERY_S = 3.0
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




class Checker:
    """The real checker job (:class:`support.CheckerJob`), started, SIGKILLed and restarted; each run
    logs to its own file, ``<name>-<run>.log``."""

    def __init__(self, root: Path, config_path: Path, lakehouse: Lakehouse, name: str = "checker") -> None:
        self.root, self.config_path, self.lakehouse, self.name = root, config_path, lakehouse, name
        self.job: Optional[support.CheckerJob] = None  # the current run
        self.starts = 0
        self.failures: list[str] = []

    def start(self) -> None:
        self.starts += 1
        self.job = support.CheckerJob(str(self.config_path), self.lakehouse, str(self.root / f"{self.name}-{self.starts}.log"),
                                      cwd=self.root)

    @property
    def active(self) -> bool:
        """Whether this run holds the lease (it then starts its streaming query at once)."""
        return self.job.holds_lease()

    @property
    def standing_by(self) -> bool:
        """Whether this run stands by for the lease, its Spark session up."""
        return self.job.stands_by()

    def kill(self, batches: list[dict]) -> dict:
        """SIGKILL this run's process group; what it had done: ``batches`` are those ``system/metrics`` recorded
        since it took the lease."""
        now, wall = time.monotonic(), time.time()
        self.job.kill()
        return {"after_start_s": round(now - self.job.started_at, 1), "batches_finished": len(batches),
                "since_last_batch_s": round(wall - batches[-1]["finished_at"], 1) if batches else None}


class Producer:
    """One producer process: its plan, its SQLite store, and its successive runs.

    ``kill_after`` are the attempted-send counts after which the harness kills it (ascending): each run
    holds its sends at the next one (``--hold-after``) until the kill comes, so every planned kill finds
    the process with sends left, whatever the machine's load."""

    def __init__(self, root: Path, index: int, config_path: Path, start_at: float, send_seconds: float,
                 kill_after: Sequence[int] = ()) -> None:
        self.index = index
        self.db = root / f"producer-{index}.db"
        self.store = Store(str(self.db))
        self.store.create()  # before the first run: a kill may look for sends in flight at once
        self.done_file = root / f"producer-{index}.done"
        self.plan_file = root / f"plan-{index}.json"
        self.kill_after = sorted(kill_after)
        self._argv = [sys.executable, "-m", "bench.chaos.producer", "--config", str(config_path), "--index", str(index),
                      "--plan", str(self.plan_file), "--db", str(self.db), "--start-at", repr(start_at),
                      "--send-seconds", repr(send_seconds), "--done-file", str(self.done_file)]
        self.child = support.Job(self._argv, root / f"producer-{index}.log", env=support.child_environment(os.environ))
        self.restarts = 0
        self.failures: list[str] = []

    def start(self) -> None:
        """Start a run, held at the next planned kill if one is left."""
        self.child.argv = self._argv + (["--hold-after", str(self.kill_after[0])] if self.kill_after else [])
        self.child.start()

    @property
    def kill_near(self) -> bool:
        """Whether the run's next send is the last before its planned kill (or it has made that one)."""
        return bool(self.kill_after) and self.store.attempts() >= self.kill_after[0] - 1

    @property
    def done(self) -> bool:
        return self.done_file.exists()


def plan_producer_kills(plans: list[list[tuple[str, str]]], kills: int, rng: random.Random) -> list[list[int]]:
    """For each producer, the attempted-send counts after which it is killed: ``kills`` in all, each after
    one of its sends but the last (its next run still has sends to make), none twice at the same count."""
    points = [(index, after) for index, plan in enumerate(plans) for after in range(1, len(plan))]
    chosen = rng.sample(points, min(kills, len(points)))
    return [sorted(after for index, after in chosen if index == producer) for producer in range(len(plans))]



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
    lines = ["# Written by bench/chaos.", f"lakehouse = {json.dumps(lakehouse or str(root))}"]
    lines += [f"{key} = {value}" for key, value in SETTINGS.items()]
    if storage:
        lines += ["", "[storage]", *(f"{key} = {json.dumps(value)}" for key, value in storage.items())]
    lines += ["", "[topic_grants]", *(f'{group_of(index)} = ["CHAOS_*"]' for index in range(producers)),
              f"{FORGED_GROUP} = [{json.dumps(ORDER_TOPIC)}]", f"{POISON_GROUP} = [\"CHAOS_*\"]"]
    config_path.write_text("\n".join(lines) + "\n")
    init_lakehouse(Lakehouse.of(CoordinatorConfig.load(config_path, environ={})))
    return config_path


class Maintenance:
    """Runs ``coordinator.ops.maintenance.maintain`` over the commit log and the topics, over and over, in a thread.
    A table it cannot maintain is an error, unless ``poisoned`` names it."""

    def __init__(self, config_path: Path, every_s: float, retention_hours: int, poisoned: frozenset[str] = frozenset()) -> None:
        self.config_path, self.every_s, self.retention_hours = config_path, every_s, retention_hours
        self.poisoned = poisoned  # tables whose failure is expected: a poisoning tenant's log
        self.runs = 0
        self.files_compacted = 0
        self.files_vacuumed = 0
        self.skipped: Counter = Counter()
        self.errors: list[str] = []
        self.poisoned_failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="maintenance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop; run once now if it never ran (a run shorter than ``every_s``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.runs == 0:
            self._maintain()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._maintain()

    def _maintain(self) -> None:
        tables = [*(ref.key for ref in CommitLogs(Lakehouse.of(CoordinatorConfig.load(self.config_path, environ={})))
                    .discover()), f"topics/{ORDER_TOPIC}", f"topics/{AUDIT_TOPIC}"]
        result = subprocess.run([sys.executable, "-c", _MAINTAIN, str(self.config_path), json.dumps(tables),
                                 str(self.retention_hours)],
                                capture_output=True, text=True, env=support.child_environment(os.environ))
        self.runs += 1
        if result.returncode != 0:
            self.errors.append(f"exit {result.returncode}: {result.stderr.strip()[-1500:]}")
            return
        for table in json.loads(result.stdout.strip().splitlines()[-1]):
            if table["failed"]:
                if table["table"] in self.poisoned:
                    self.poisoned_failures += 1
                else:
                    self.errors.append(f"{table['table']}: {table['failed']}")
                continue
            self.files_compacted += table["files_compacted"]
            self.files_vacuumed += table["files_vacuumed"]
            # The first line names the step; what follows (versions, error details) varies run to run.
            self.skipped.update(f"{table['table']}: {reason.split(':')[0]}" for reason in table["skipped"])


class Operator:
    """Commits by hand, as ``txcoord resolve --commit`` does, the first transaction the checker discards
    (twice at once, as two operators racing would) and about half of the others.

    Of the racing two, the second may be refused ("resolved for good") if the checker has applied the
    first already: ``sent`` counts the commits accepted, ``refused`` those refused so."""

    def __init__(self, config: CoordinatorConfig, groups: set[str], rng: random.Random) -> None:
        self.config, self.groups, self.rng = config, groups, rng
        self.recovered: set[str] = set()
        self.sent = 0
        self.refused = 0
        self._looked_at: set[str] = set()
        self._next_at = 0.0

    def act(self, now: bool = False) -> int:
        """Look for new discards (every few seconds, or ``now``) and recover some of them; return how many."""
        if not now and time.monotonic() < self._next_at:
            return 0
        self._next_at = time.monotonic() + LOOK_EVERY_S
        try:
            rows = table_rows(Lakehouse.of(self.config), DISCARDED, ["transaction_id", "producer_group"])
        except (OSError, DeltaError):  # a file vacuumed between snapshot and read: look again next time
            return 0
        discarded = {row["transaction_id"]: row["producer_group"] for row in rows}
        recovered_before = len(self.recovered)
        for transaction_id in sorted(set(discarded) - self._looked_at):
            self._looked_at.add(transaction_id)
            if discarded[transaction_id] not in self.groups or (self.recovered and self.rng.random() < 0.5):
                continue
            operators = 1 if self.recovered else 2
            with ThreadPoolExecutor(operators) as racing:
                accepted = list(racing.map(self._commit, [transaction_id] * operators))
            if not any(accepted):
                raise AssertionError(f"every operator's commit of {transaction_id} was refused")
            self.sent += sum(accepted)
            self.refused += operators - sum(accepted)
            self.recovered.add(transaction_id)
        return len(self.recovered) - recovered_before

    def _commit(self, transaction_id: str) -> bool:
        """Commit ``transaction_id`` by hand; ``False`` if refused as resolved for good already."""
        try:
            resolve_transaction(self.config, transaction_id, LocalTransactionState.COMMIT_MESSAGE,
                                "chaos: recovered by hand", operator="chaos-operator")
        except InvalidArgumentError:
            return False
        return True


def table_rows(lakehouse: Lakehouse, table, columns: list[str]) -> list[dict]:
    """``columns`` of every row of ``table`` (none before it exists)."""
    if not lakehouse.exists(table):
        return []
    return lakehouse.read(table, columns).to_pylist()
