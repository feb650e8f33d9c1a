"""One chaos run, from an empty lakehouse to the verdict: start everything, kill and inject at random
(seeded), let the lakehouse settle, stop everything and verify."""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from deltalake.exceptions import DeltaError

from bench import harness

import support
from bench.chaos.actors import (LOOK_EVERY_S, Checker, Maintenance, Operator, Producer, make_plan, plan_producer_kills,
                                prepare)
from bench.chaos.consumers import Consumers
from bench.chaos.hostile import HostileWriter
from bench.chaos.poison import Poisoner
from bench.chaos.options import (OBJECT_STORE_BUCKET, POISON_EVERY_S, SETTINGS, STORAGE_FAULT_DELAY_S,
                                 STORAGE_FAULT_RATES, Options, parse_options)
from bench.chaos.producer import group_of
from bench.chaos.report import print_report
from bench.chaos.verify import EXAMPLES, verify
from coordinator.conformance.faults import FaultProxyProcess
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse
from coordinator.conformance.versitygw import S3Server

__all__ = ["Activity", "Run", "main"]

#: A checker run is killed once it has finished 0 to this many batches, then up to _MAX_KILL_DELAY_S later:
#: during its first batch, a later one, or between two (a batch takes seconds here, and the next starts at once).
_MAX_BATCHES_BEFORE_KILL = 2
_MAX_KILL_DELAY_S = 10.0
_POLL_S = 0.2
#: ``system/metrics`` is read at most this often (a Delta table's snapshot, not a file).
_BATCHES_READ_S = 1.0
#: A producer kill waits up to this long for its last send before the kill to be in flight (then kills anyway).
_AIM_AT_SEND_S = 30.0
_STOP_TIMEOUT_S = 120.0


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
    #: --poison: each poison written (where, the refusal expected, the reason found), its rounds, and the runs of
    #: maintenance that reported the poisoned log as one it could not maintain (and went on).
    poisonings: list[dict] = field(default_factory=list)
    poison_rounds: int = 0
    maintenance_poisoned_failures: int = 0
    operator_recoveries: int = 0
    operator_commits_sent: int = 0
    operator_commits_refused: int = 0
    settled: bool = False
    #: Seconds from the start until every half was resolved, and until the consumer group had caught up after that.
    halves_resolved_s: Optional[float] = None
    consumers_caught_up_s: Optional[float] = None
    duration_s: float = 0.0
    #: --storage-faults: the proxy's counts when the faults stopped (requests, forwarded, injected by kind).
    storage_faults: Optional[dict] = None
    #: The consumer group's processes and what was done to them: kills, pauses, resets, dead-letter rounds,
    #: restarts; its deliveries, effects applied, dead letters and their fates.
    consumers: dict = field(default_factory=dict)


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
        kill_after = plan_producer_kills(self.plans, options.producer_kills, rng)
        self.producers = [Producer(self.root, index, config_path, start_at, options.send_seconds, kill_after[index])
                          for index in range(options.producers)]
        for producer, plan in zip(self.producers, self.plans):
            producer.plan_file.write_text(json.dumps(plan))
        self.lakehouse = Lakehouse.of(self.config)
        # Its own random numbers: a run's plan and kills are those of the same seed without consumers.
        self.consumers = Consumers(self.root, config_path, self.config, self.lakehouse, options,
                                   random.Random(options.seed + 1))
        self.checkers = [Checker(self.root, config_path, self.lakehouse)]
        if options.standby:
            self.checkers.append(Checker(self.root, config_path, self.lakehouse, name="standby"))
        self.poisoner = Poisoner(self.lakehouse) if options.poison else None
        self.maintenance = Maintenance(config_path, options.maintenance_every, options.retention_hours,
                                       frozenset([self.poisoner.log_key] if self.poisoner else []))
        self.operator = Operator(self.config, {group_of(p.index) for p in self.producers}, random.Random(options.seed))
        self.hostile = HostileWriter(self.lakehouse, random.Random(options.seed))
        window_end = started + 2.0 + options.send_seconds
        checker_kill_after = sorted(rng.uniform(started, window_end) for _ in range(options.checker_kills))
        blind_injection_at = started + 2.0 + options.send_seconds * 0.3
        deadline = started + options.timeout
        try:
            for checker in self.checkers:
                checker.start()
            for producer in self.producers:
                producer.start()
            self.consumers.start()
            self.maintenance.start()
            self._chaos(checker_kill_after, blind_injection_at, deadline)
            if self.faults is not None:  # the storage heals: everything must go on, with no restart
                self.faults.disable()
                self.activity.storage_faults = self.faults.counts() | {"seen_in_logs": self._storage_log_lines()}
            if self._settle(deadline):
                self.activity.halves_resolved_s = round(time.monotonic() - started, 1)
                self.activity.settled = self.consumers.wait_caught_up(deadline)
                self.activity.consumers_caught_up_s = round(time.monotonic() - started, 1) if self.activity.settled \
                    else None
        finally:
            stop_codes = self._stop_all()
        self.activity.duration_s = round(time.monotonic() - started, 1)
        return self._report(stop_codes)

    def _chaos(self, checker_kill_after: list[float], blind_injection_at: float, deadline: float) -> None:
        """Kill, restart and inject until every planned checker and producer kill is done and every producer has
        sent its plan (the consumer group's events go on after, each when its deliveries reach it).

        What the checkers did is read where operators read it: who holds the lease (and who stands by) from
        the lease, the batches finished from ``system/metrics``. One checker holds the lease at a time, so the
        batches recorded since the last kill are the current holder's."""
        kill_after_batches: Optional[int] = None
        kill_checker_at: Optional[float] = None
        next_poison_at = 0.0
        blind_injected = targeted_injected = False
        killed_at: Optional[float] = None  # time.time() of the last checker kill whose failover is not measured yet
        holder_since = time.time()  # the current holder's batches are those recorded since then
        batches: list[dict] = []
        next_batches_read = 0.0
        next_target_search = 0.0
        while time.monotonic() < deadline:
            now = time.monotonic()
            self._restart_failed_producers()
            self.consumers.act()
            self.operator.act()
            for producer in self.producers:
                if producer.child.running and producer.kill_near:
                    self._kill_producer(producer)
            if self.poisoner is not None and now >= next_poison_at and not all(p.done for p in self.producers):
                self.poisoner.poison()
                next_poison_at = now + POISON_EVERY_S
            if not blind_injected and now >= blind_injection_at:
                self.hostile.inject_blind()
                blind_injected = True
            elif blind_injected and not targeted_injected and now >= next_target_search:
                targeted_injected = self.hostile.inject_targeted(self.plans, require_every_target=True)
                next_target_search = now + LOOK_EVERY_S
            self._supervise_checkers()
            checker = self._active_checker()
            if checker is not None and now >= next_batches_read:
                batches = self._batches_since(holder_since, batches)
                next_batches_read = now + _BATCHES_READ_S
            if killed_at is not None and checker is not None and batches:
                self.activity.failovers.append({"taken_over_by": checker.name,
                                                "failover_s": round(batches[0]["finished_at"] - killed_at, 1)})
                killed_at = None
            if checker is not None and killed_at is None:
                if checker_kill_after and kill_after_batches is None and now >= checker_kill_after[0]:
                    kill_after_batches = self.rng.randint(0, _MAX_BATCHES_BEFORE_KILL)
                if kill_after_batches is not None and kill_checker_at is None and len(batches) >= kill_after_batches:
                    kill_checker_at = now + self.rng.uniform(0, _MAX_KILL_DELAY_S)
                if kill_checker_at is not None and now >= kill_checker_at:
                    checker_kill_after.pop(0)
                    kill_after_batches = kill_checker_at = None
                    batches = self._batches_since(holder_since, batches)
                    self.activity.checker_kills.append({"at_s": round(now - self.started, 1), "checker": checker.name,
                                                        **checker.kill(batches)})
                    killed_at = holder_since = time.time()
                    batches = []
                    # Restarted at once, as a supervisor would: it takes the lease over as soon as it finds the
                    # killed run's process gone, or, with a standby already waiting, stands by in its turn.
                    checker.start()
            # Done once a checker is up again (it has finished a batch since it took the lease) and a standby, if
            # any, stands by: a checker still starting when stopped would die of the SIGTERM (exit 143).
            if (not any(p.kill_after for p in self.producers) and not checker_kill_after and blind_injected and checker is not None
                    and batches and killed_at is None and all(p.done for p in self.producers)
                    and all(self._is_up(c) for c in self.checkers)):
                if not targeted_injected:
                    self.hostile.inject_targeted(self.plans, require_every_target=False)
                return
            time.sleep(_POLL_S)

    def _batches_since(self, since: float, last_read: list[dict]) -> list[dict]:
        """The batches ``system/metrics`` recorded since ``since``; ``last_read`` if the table cannot be read now."""
        try:
            return support.recorded_batches(self.lakehouse, since)
        except Exception as error:  # under storage faults a read may fail after its retries: read again next time
            print(f"  (reading system/metrics failed, retrying: {error})", flush=True)
            return last_read

    def _supervise_checkers(self) -> None:
        """Start a checker again at once if it exited on its own (a failure)."""
        for checker in self.checkers:
            if not checker.job.running:
                checker.failures.append(f"run {checker.starts} exited with code {checker.job.exit_code()}:\n"
                                        f"{checker.job.tail()}")
                checker.start()

    @staticmethod
    def _is_up(checker: Checker) -> bool:
        """Whether ``checker`` holds the lease or stands by (``False`` if the lease cannot be read now)."""
        try:
            return checker.active or checker.standing_by
        except Exception:  # under storage faults a read may fail after its retries: asked again next time
            return False

    def _active_checker(self) -> Optional[Checker]:
        """The checker that holds the lease; ``None`` between two holders (or if the lease cannot be read now)."""
        try:
            return next((checker for checker in self.checkers if checker.active), None)
        except Exception:  # under storage faults a read may fail after its retries: asked again next time
            return None

    def _kill_producer(self, producer: Producer) -> None:
        """Kill ``producer`` at its planned point: during its last send before the kill (its half, local
        transaction or END not yet through), at a random moment of it; or, once it holds with no send in
        flight (that send was too quick to catch), at once."""
        store, last = producer.store, producer.kill_after[0]
        aim_until = time.monotonic() + _AIM_AT_SEND_S
        while (time.monotonic() < aim_until and producer.child.running and store.sends_in_flight() == 0
               and store.attempts() < last):
            time.sleep(0.005)
        if store.sends_in_flight():
            time.sleep(self.rng.uniform(0, 0.01))  # a send lasts tens of milliseconds
        in_flight = store.sends_in_flight()
        producer.child.kill()
        self.activity.producer_kills.append({"producer": producer.index, "after_attempts": store.attempts(),
                                            "sends_in_flight": in_flight,
                                            "after_start_s": round(time.monotonic() - producer.child.started_at, 1)})
        producer.kill_after.pop(0)
        producer.restarts += 1
        producer.start()

    def _restart_failed_producers(self) -> None:
        for producer in self.producers:
            if not producer.child.running:
                producer.failures.append(f"exited with code {producer.child.exit_code()}:\n{producer.child.tail()}")
                producer.restarts += 1
                producer.start()

    def _poisonings(self) -> list:
        return self.poisoner.written if self.poisoner is not None else []

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
                                  self.operator.recovered, self._poisonings())
            except (OSError, ValueError, DeltaError) as error:  # a file vacuumed between snapshot and read: read again
                print(f"  (reading the tables failed, retrying: {error})", flush=True)
                self._consumers_act_for(LOOK_EVERY_S)
                continue
            if findings["pending_halves"] == 0 and findings["found"]["lost"] == 0:
                if self.operator.act(now=True):  # discards it had not seen yet: their recoveries must land too
                    continue
                return True
            self._consumers_act_for(LOOK_EVERY_S)
        return False

    def _consumers_act_for(self, seconds: float) -> None:
        """Let the consumer group's events go on (a pause resumed on time) while waiting ``seconds``."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.consumers.act()
            time.sleep(_POLL_S)

    def _stop_all(self) -> dict:
        """SIGTERM whatever runs; return the exit codes (a process that was down already was reported then)."""
        self.maintenance.stop()
        codes = self.consumers.stop()
        children = {f"producer-{p.index}": p.child for p in self.producers}
        children.update({checker.name: checker.job for checker in self.checkers})
        running = {name: child for name, child in children.items() if child is not None and child.running}
        for child in running.values():
            child.terminate()
        return codes | {name: child.wait(_STOP_TIMEOUT_S) for name, child in running.items()}

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
                          self.operator.recovered, self._poisonings())
        consumer_found, consumer_examples, activity.consumers = self.consumers.verdict()
        findings["found"] |= consumer_found
        findings["examples"] |= consumer_examples
        activity.operator_recoveries = len(self.operator.recovered)
        activity.operator_commits_sent = self.operator.sent
        activity.operator_commits_refused = self.operator.refused
        activity.bad_inputs = [asdict(bad) for bad in self.hostile.injected]
        activity.poisonings = [asdict(poisoning) for poisoning in self._poisonings()]
        activity.poison_rounds = self.poisoner.rounds if self.poisoner else 0
        activity.maintenance_poisoned_failures = self.maintenance.poisoned_failures
        failures = [f"{checker.name}: {f}" for checker in self.checkers for f in checker.failures]
        failures += [f"producer-{p.index}: {f}" for p in self.producers for f in p.failures]
        failures += [f"{name} exited with code {code} on SIGTERM" for name, code in stop_codes.items() if code != 0]
        failures += [f"maintenance: {error}" for error in self.maintenance.errors]
        failures += self.consumers.failures
        found = findings["found"]
        found["process_failures"] = len(failures)
        found["not_settled"] = 0 if activity.settled else 1
        return {
            "run": {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": harness.machine(),
                    "options": asdict(self.options), "settings": SETTINGS},
            "did": asdict(activity),
            "outcomes_by_kind": findings["outcomes_by_kind"],
            "found": found,
            "violations": sum(found.values()),
            "examples": {**findings["examples"], "process_failures": failures[:EXAMPLES]},
            "rejected_reasons": findings["rejected_reasons"],
        }


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m bench.chaos``: one run; exit status 1 on any violation."""
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

