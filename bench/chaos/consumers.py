"""The consumer group of a chaos run: its processes (:mod:`bench.chaos.consumer`), killed -9, paused and restarted
while producers send; an operator resetting the group and acting on its dead letters; and what the verdict
(:func:`bench.chaos.verify.account_consumers`) reads of it all.

The harness's *events* on the group, one after another, each planned after the group's n-th delivery (n drawn at
random, counted over every process and run, no two events at the same n) and triggered by it, never by the clock
(the harness looks every 0.2 s); a kill or a pause also waits for a delivery since the last event. Nothing is done while a
process is stopped; a pause asked inside a call waits for the group's next call, the other events but pauses going
on meanwhile:

- **a kill**: SIGKILL of the process whose deliveries grew last (so while it handles, or just after), restarted at
  once;
- **a pause**: SIGSTOP of a process, SIGCONT after 2 or 5 times the liveness window (an instance is live while
  its record is at most ``LIVE_FOR_HEARTBEATS`` heartbeats old): long enough for the other instances to take its
  shares and deliver its messages again. In turn, the process that makes the group's next listener call stops
  itself inside it (asked through the ``--pause-request`` file every process looks at), before the call inserts
  its record, or while it holds its transaction; or the harness stops the process whose deliveries grew last from
  outside, wherever it is. A call already running then may
  overlap its successor's calls of that key, and only such a call (the verdict's ``consumer_overlap``);
- **a reset**: the operator stops every process (SIGTERM: a reset is refused while an instance is live), resets
  each topic that has a table with ``reset_consumer_group``, to ``earliest`` or to an ISO time a few seconds back
  (drawn, unless ``--reset-to`` says which), and starts them again;
- **a dead-letter round**: the operator redrives some of the open dead letters and discards others
  (``redrive_dead_letters``, ``discard_dead_letters``), while the group runs; a round that finds none open looks
  again a second later, the events after it going on meanwhile.

Once every half is resolved (no message is to come) and the group has caught up, the events still planned (its
deliveries did not reach them) are made at once, one after another; a dead-letter round with nothing open then is
recorded as such.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import sqlite3
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, TypeVar

from deltalake.exceptions import DeltaError

import support
from bench.chaos.actors import table_rows
from bench.chaos.consumer import (BEFORE_RECORD, GROUP, HOLDING_TRANSACTION, SETTINGS, SHARES, TOPICS, create_effects,
                                  fails_from_topic, write_atomically)
from bench.chaos.options import RESET_BACK_S, Options
from bench.chaos.verify import CONSUMER_FINDINGS, ConsumerWork, account_consumers, before_reset
from coordinator.config import CoordinatorConfig
from coordinator.consumer.group import ConsumerGroup, share_of
from coordinator.consumer.instances import LIVE_FOR_HEARTBEATS
from coordinator.consumer.topic_log import TopicLog
from coordinator.exceptions import CoordinatorError, InvalidArgumentError
from coordinator.lakehouse import Lakehouse
from coordinator.ops.consumer_groups import (discard_dead_letters, open_dead_letters, redrive_dead_letters,
                                             reset_consumer_group)

__all__ = ["Consumers", "LIVENESS_WINDOW_S", "PAUSES", "events_spread"]

T = TypeVar("T")

KILL, PAUSE, RESET, DEAD_LETTERS = "kill", "pause", "reset", "dead-letter round"
FROM_OUTSIDE = "from outside"
#: An instance is taken for dead once its record is this old: what a pause is measured in.
LIVENESS_WINDOW_S = LIVE_FOR_HEARTBEATS * SETTINGS["consumer_heartbeat_ms"] / 1000
#: The pauses, in turn: where each stops its process, and for how many liveness windows.
PAUSES = ((BEFORE_RECORD, 5), (HOLDING_TRANSACTION, 2), (FROM_OUTSIDE, 2), (BEFORE_RECORD, 2),
          (HOLDING_TRANSACTION, 5), (FROM_OUTSIDE, 5))
#: The actions of a dead-letter round on its open dead letters' messages (shuffled), in turn from the round's number.
_ROUND_ACTIONS = ("redrive", "discard", "redrive", "leave open")
#: How often the group's progress (and, for a postponed round, its dead letters) is read while waiting.
_LOOK_S = 1.0
_OPERATOR = "chaos-operator"
_STOP_TIMEOUT_S = 120.0
#: ``sqlite3.OperationalError``: the consumers' database locked by a consumer paused inside its transaction (and a
#: hot journal a killed one left, which a read-write connection rolls back).
_RETRIED = (DeltaError, OSError, sqlite3.OperationalError)


@dataclass
class _Event:
    after: int  # the group's deliveries after which it is made
    kind: str
    number: int  # its place among the events of its kind


@dataclass
class _Pause:
    """A pause under way: asked inside a call (``requested``, wall time) or made by the harness (``sent``), seen
    stopped (its process, ``consumer``, known from then on), resumed."""

    consumer: int
    aim: str
    windows: int
    planned_s: float
    pid: int = 0
    requested: Optional[float] = None
    sent: Optional[float] = None
    stopped_seen: Optional[float] = None
    resumed: Optional[float] = None
    resume_at: float = 0.0  # time.monotonic()


@dataclass
class _Incarnation:
    """One run of a consumer process: its pid, when it started and ended (wall times), and how it ended."""

    consumer: int
    pid: int
    started: float
    ended: Optional[float] = None
    how: str = ""


@dataclass
class _Calls:
    """What the processes' calls logs say so far, read on from where the last read stopped."""

    calls: dict[tuple[int, int], dict] = field(default_factory=dict)
    pause_marks: dict[int, list[dict]] = field(default_factory=dict)  # pid -> its ``pause`` lines
    gaps: list[dict] = field(default_factory=list)  # every ``gap`` line
    starts: list[int] = field(default_factory=list)  # per consumer: calls started
    read_to: list[int] = field(default_factory=list)  # per consumer: bytes of its log read


class _Versions:
    """Every row of a table (a topic, the group's redrive table) with the version that added it, each version read
    once (they never change)."""

    def __init__(self, lakehouse: Lakehouse, key: str):
        self.log = TopicLog(lakehouse.files, key, lakehouse.storage)
        self.rows: list[dict] = []
        self.read_to = -1

    def update(self) -> list[dict]:
        for version in range(self.read_to + 1, self.log.latest() + 1):
            self.rows += [{name: row[name] for name in ("msg_id", "topic", "keys", "tags", "queue_offset")}
                          | {"version": version} for row in self.log.rows(version)]
            self.read_to = version
        return self.rows


class Consumers:
    """The run's ``options.consumers`` processes of the chaos consumer group, sharing one SQLite database in ``root``,
    and the events the harness makes on them (``options.consumer_kills``, ``consumer_pauses``, ``consumer_resets``,
    ``dead_letter_rounds``), planned after deliveries drawn from 1 to :func:`events_spread`."""

    def __init__(self, root: Path, config_path: Path, config: CoordinatorConfig, lakehouse: Lakehouse,
                 options: Options, rng: random.Random) -> None:
        self.config, self.lakehouse, self.rng = config, lakehouse, rng
        self.reset_to = options.reset_to
        count = options.consumers
        ConsumerGroup(lakehouse, GROUP).write_grant(TOPICS, SHARES, _OPERATOR)
        self.db = root / "consumers.db"
        create_effects(str(self.db))
        self.calls_logs = [root / f"consumer-{index}.calls" for index in range(count)]
        self.pause_request = root / "consumers.pause"
        self.children = [support.Job([sys.executable, "-m", "bench.chaos.consumer", "--config", str(config_path),
                                      "--db", str(self.db), "--calls", str(calls),
                                      "--pause-request", str(self.pause_request)],
                                     root / f"consumer-{index}.log", env=support.child_environment(os.environ))
                         for index, calls in enumerate(self.calls_logs)]
        self.events = _plan(count, options.consumer_kills, options.consumer_pauses, options.consumer_resets,
                            options.dead_letter_rounds, events_spread(options.transactions), rng)
        self.kills: list[dict] = []
        self.pauses: list[dict] = []
        self.resets: list[dict] = []
        self.dead_letter_rounds: list[dict] = []
        self.incarnations: list[_Incarnation] = []
        self.restarts = 0
        self.failures: list[str] = []
        self._pause: Optional[_Pause] = None
        self._log = _Calls(starts=[0] * count, read_to=[0] * count)
        self._grew_at = [0.0] * count
        self._next_look = 0.0
        self._rounds_not_before = 0.0  # a dead-letter round that found none open looks again then (time.monotonic())
        self._at_last_event = 0  # the group's deliveries when the last event ended: the next waits for one more
        self._topics = {topic: _Versions(lakehouse, f"topics/{topic}") for topic in TOPICS}
        self._redrive = _Versions(lakehouse, f"{lakehouse.consumer_dir(GROUP)}/redrive")
        self._epochs: dict[str, int] = {}

    def start(self) -> None:
        for index in range(len(self.children)):
            self._start(index)

    def act(self, settled: bool = False) -> None:
        """Restart a process that exited on its own; go on with the pause under way, or make the next event once
        the group's deliveries reach it, or, once the lakehouse has ``settled`` (every half resolved: no message
        is to come) and the group has caught up, at once."""
        for index, child in enumerate(self.children):
            if not child.running:
                self._ended(index, "exited")
                self.failures.append(f"consumer-{index} exited with code {child.exit_code()}")
                self._start(index)
                self.restarts += 1
        delivered = sum(self._read_calls())
        if self._pause is not None and self._go_on_pausing(settled):
            return  # a process stopped: nothing else meanwhile
        # One pause at a time (while one asked inside a call waits for it, the next event but a pause); a dead-letter
        # round that found none open is looked at again a second later, the events after it going on meanwhile.
        now = time.monotonic()
        event = next((event for event in self.events if not (event.kind == PAUSE and self._pause is not None)
                      and not (event.kind == DEAD_LETTERS and now < self._rounds_not_before)), None)
        if event is None:
            return
        # A kill or a pause lands while the group handles: after a delivery since the last event.
        due = delivered >= event.after and (delivered > self._at_last_event or event.kind in (RESET, DEAD_LETTERS))
        idle = settled and self._idle()  # a dead-letter round due, with none open, is then recorded as such
        if due or idle:
            self._make(event, idle)

    @property
    def events_left(self) -> int:
        return len(self.events) + (self._pause is not None)

    def caught_up(self) -> bool:
        """Whether every message is handled as the verdict wants it: applied, a dead letter, or reset past; every
        redrive handled again; after a reset, every message from where it went delivered again."""
        try:
            found = account_consumers(self._work(final=False))
        except (CoordinatorError, *_RETRIED) as error:  # a read racing maintenance, or a storage fault: asked again
            print(f"  (reading the consumer group's work failed, retrying: {error})", flush=True)
            return False
        return found["consumer_missed"] == 0 and found["reset_not_honoured"] == 0

    def wait_caught_up(self, deadline: float) -> bool:
        """Once the lakehouse has settled: until the group has caught up, its planned events made on the way (those
        its deliveries did not reach, at once); ``False`` if ``deadline`` came first."""
        while self.children and time.monotonic() < deadline:
            self.act(settled=True)
            if not self.events_left and self.caught_up():
                return True
            time.sleep(_LOOK_S)
        return not self.children

    def stop(self) -> dict:
        """SIGTERM every process (each closes its consumer and exits 0), a paused one resumed first; their exit
        codes by name."""
        pause = self._pause
        if pause is not None and pause.stopped_seen is None and not _withdraw(self.pause_request):
            # A call took the request as the run ended: it stops its process at once.
            support.wait_until(lambda: self._seen_stopped(pause), 30, "the process asked to pause stopped",
                               poll_s=0.001)
        if pause is not None and pause.stopped_seen is not None:
            self._resume()
        codes = self._stop_all()
        return {f"consumer-{index}": code for index, code in codes.items()}

    def verdict(self) -> tuple[dict, dict, dict]:
        """The counts of :data:`CONSUMER_FINDINGS`, their first examples, and what the group and the harness did
        (nothing to judge in a run without consumers)."""
        if not self.children:
            return {name: 0 for name in CONSUMER_FINDINGS}, {}, {"consumer_processes": 0}
        self._read_calls()
        work = self._work(final=True)
        found, examples, did = account_consumers(work, with_examples=True)
        messages = {row["msg_id"]: row for row in work.messages}
        delivered = Counter(call["msg_id"] for call in work.calls)
        failing = {msg_id for msg_id, row in messages.items() if fails_from_topic(row["tags"])}
        did |= {"consumer_processes": len(self.children), "consumer_kills": self.kills,
                "consumer_restarts": self.restarts, "consumer_failures": self.failures,
                "consumer_pauses": self.pauses, "consumer_resets": self.resets,
                "dead_letter_rounds": self.dead_letter_rounds,
                # Gaps the instances reported in the proof of their hold, the harness's pauses among them.
                "instance_gaps": [round(gap["seconds"], 1) for gap in self._log.gaps],
                "deliveries": sum(delivered.values()),
                # Of the messages the listener applies: delivered again after a kill, a pause, a reset.
                "delivered_again": sum(times - 1 for msg_id, times in delivered.items() if msg_id not in failing),
                "deliveries_of_failing": sum(times for msg_id, times in delivered.items() if msg_id in failing)}
        for pause, window in zip(self.pauses, work.pauses):  # what the group did while it lasted
            pause |= _during(window, work.calls)
        return found, examples, did

    # Events.

    def _make(self, event: _Event, idle: bool) -> None:
        if event.kind == DEAD_LETTERS and not self._dead_letter_round(event, idle):
            return  # none open yet
        # A kill or a reset while a pause asked inside a call waits: the request is withdrawn for the time of it (a
        # process killed or stopped just after taking it would never pause), or, already taken, the event waits.
        asked = self._pause is not None and event.kind in (KILL, RESET)
        if asked and not _withdraw(self.pause_request):
            return  # its process stops: seen at the next look, then this event is made
        self.events.remove(event)
        if event.kind == KILL:
            self._kill(self._busiest(), sum(self._log.starts))
        elif event.kind == PAUSE:
            self._begin_pause(event)
        elif event.kind == RESET:
            self._reset()
        if asked:
            write_atomically(self.pause_request, self._pause.aim)
        self._at_last_event = sum(self._read_calls())

    def _kill(self, index: int, delivered: int) -> None:
        """Kill -9 process ``index`` and start it again."""
        child = self.children[index]
        at = time.time()
        child.kill()
        self._ended(index, "killed", at)
        self.kills.append({"consumer": index, "after_deliveries": delivered,
                           "after_start_s": round(time.monotonic() - child.started_at, 1)})
        self._start(index)
        self.restarts += 1

    def _begin_pause(self, event: _Event) -> None:
        aim, windows = PAUSES[event.number % len(PAUSES)]
        pause = self._pause = _Pause(-1, aim, windows, windows * LIVENESS_WINDOW_S)
        print(f"  pause {aim} for {pause.planned_s:g} s, after {sum(self._log.starts)} deliveries", flush=True)
        if aim == FROM_OUTSIDE:
            self._stop_from_outside(pause)
        else:
            pause.requested = time.time()
            write_atomically(self.pause_request, aim)

    def _go_on_pausing(self, settled: bool) -> bool:
        """The pause under way: once its process is seen stopped, resumed when its time is up; whether its process
        is stopped now. While a pause asked inside a call waits for the group's next call, the other events but
        pauses go on (a reset brings calls); once only pauses are left and the group has caught up, no call comes:
        it is made from outside."""
        pause = self._pause
        if pause.stopped_seen is None:
            if self._seen_stopped(pause):
                return True
            if (settled and all(event.kind == PAUSE for event in self.events) and self._idle()
                    and _withdraw(self.pause_request)):
                pause.aim = f"{FROM_OUTSIDE} (asked {pause.aim}, no call came)"
                self._stop_from_outside(pause)
                return True
            return False
        if time.monotonic() >= pause.resume_at:
            self._resume()
            return False
        return True

    def _seen_stopped(self, pause: _Pause) -> bool:
        """Whether a process stopped itself as ``pause`` asked (then it is the pause's)."""
        index = next((index for index, child in enumerate(self.children) if _stopped(child.pid)), None)
        if index is None:
            return False
        pause.consumer, pause.pid, pause.stopped_seen = index, self.children[index].pid, time.time()
        pause.resume_at = time.monotonic() + pause.planned_s
        return True

    def _stop_from_outside(self, pause: _Pause) -> None:
        pause.consumer = self._busiest()
        child = self.children[pause.consumer]
        pause.pid, pause.sent = child.pid, time.time()
        os.killpg(child.pid, signal.SIGSTOP)
        support.wait_until(lambda: _stopped(child.pid), 30, f"consumer-{pause.consumer} stopped", poll_s=0.001)
        pause.stopped_seen = time.time()
        pause.resume_at = time.monotonic() + pause.planned_s

    def _resume(self) -> None:
        pause, self._pause = self._pause, None
        os.killpg(pause.pid, signal.SIGCONT)
        pause.resumed = time.time()
        self.pauses.append({"consumer": pause.consumer, "pid": pause.pid, "aim": pause.aim, "windows": pause.windows,
                            "planned_s": pause.planned_s, "requested": pause.requested, "sent": pause.sent,
                            "stopped_seen": pause.stopped_seen, "resumed": pause.resumed,
                            "stopped_s": round(pause.resumed - pause.stopped_seen, 1)})
        self._at_last_event = sum(self._read_calls())

    def _reset(self) -> None:
        """The operator's reset: every process stopped, each topic with a table reset, every process started again."""
        began = time.monotonic()
        codes = self._stop_all()
        self.failures += [f"consumer-{index} exited with code {code} on SIGTERM (stopped for a reset)"
                          for index, code in codes.items() if code != 0]
        messages, effects, dead = self._handled_before_reset()
        progress = _retrying(self._progress, "reading the shares' progress")
        since = {topic["topic"]: topic["version"] for topic in self.resets[-1]["topics"]} if self.resets else {}
        lost = before_reset(messages, set(effects) | set(dead), progress,
                            lambda keys, msg_id: share_of(keys, msg_id, SHARES), since)
        topics = []
        for topic in TOPICS:
            if self._topics[topic].read_to < 0:
                continue  # no table yet (read just now): nothing to reset
            back = round(self.rng.uniform(0, RESET_BACK_S), 1)
            drawn = "earliest" if self.rng.random() < 0.5 else "back"
            to = "earliest" if (self.reset_to if self.reset_to != "drawn" else drawn) == "earliest" else \
                dt.datetime.fromtimestamp(time.time() - back, dt.timezone.utc).isoformat(timespec="milliseconds")
            version = _retrying(lambda: reset_consumer_group(self.config, GROUP, topic, to, operator=_OPERATOR),
                                f"resetting {topic}")
            self._epochs[topic] = _retrying(lambda: ConsumerGroup(self.lakehouse, GROUP).start(topic, lambda: 0).epoch,
                                            "reading the reset's epoch")
            topics.append({"topic": topic, "to": to, "version": version, "epoch": self._epochs[topic]})
        at = time.time()
        for index in range(len(self.children)):
            self._start(index)
        self.resets.append({"at": at, "after_deliveries": sum(self._log.starts), "topics": topics,
                            "applied_before": len(effects), "dead_letters_before": len(dead), "counted_handled": lost,
                            "stopped_s": round(time.monotonic() - began, 1)})
        said = ", ".join(f"{reset['topic']} --to {reset['to']} (version {reset['version']})" for reset in topics)
        print(f"  consumer group reset: {said or 'no topic has a table yet'}", flush=True)

    def _dead_letter_round(self, event: _Event, idle: bool) -> bool:
        """Redrive some open dead letters and discard others; ``False`` (and nothing done) if none is open and the
        group may still make some."""
        found = _retrying(lambda: open_dead_letters(self.config, GROUP), "listing the open dead letters")
        messages = sorted({row["msg_id"] for row in found})
        if not messages and not idle:
            self._rounds_not_before = time.monotonic() + _LOOK_S
            return False
        self.rng.shuffle(messages)
        chosen: dict[str, list[str]] = {"redrive": [], "discard": [], "leave open": []}
        for place, msg_id in enumerate(messages):
            chosen[_ROUND_ACTIONS[(place + event.number) % len(_ROUND_ACTIONS)]].append(msg_id)
        redriven = self._close(redrive_dead_letters, chosen["redrive"])
        discarded = self._close(discard_dead_letters, chosen["discard"])
        self.dead_letter_rounds.append({"at": time.time(), "after_deliveries": sum(self._log.starts),
                                        "open": len(found), "redriven": redriven, "discarded": discarded,
                                        "left_open": len(found) - len(redriven) - len(discarded)})
        print(f"  dead letters: {len(redriven)} redriven, {len(discarded)} discarded of {len(found)} open", flush=True)
        return True

    def _close(self, action: Callable, msg_ids: list[str]) -> list[str]:
        """``action`` (a redrive or a discard) on the open dead letters of ``msg_ids``, made again as an operator
        would after a storage error, on those still open (a redrive made again with none completes its appends)."""
        closed: list[str] = []
        wanted = list(msg_ids)
        while True:
            try:
                closed += [row["dead_letter_id"] for row in action(self.config, GROUP, msg_ids=wanted,
                                                                    operator=_OPERATOR, reason="chaos")]
                return closed
            except (CoordinatorError, *_RETRIED) as error:
                if isinstance(error, InvalidArgumentError):
                    raise
                print(f"  ({action.__name__} failed, made again: {error})", flush=True)
            still = {row["msg_id"] for row in _retrying(lambda: open_dead_letters(self.config, GROUP),
                                                        "listing the open dead letters")}
            closed_meanwhile = [msg_id for msg_id in wanted if msg_id not in still]
            wanted = [msg_id for msg_id in wanted if msg_id in still]
            closed += [f"{msg_id} (closed by the failed attempt)" for msg_id in closed_meanwhile]

    # Processes.

    def _start(self, index: int) -> None:
        child = self.children[index]
        child.start()
        self.incarnations.append(_Incarnation(index, child.pid, child.started_wall))

    def _ended(self, index: int, how: str, at: Optional[float] = None) -> None:
        incarnation = next(i for i in reversed(self.incarnations) if i.consumer == index)
        incarnation.ended, incarnation.how = at if at is not None else time.time(), how

    def _stop_all(self) -> dict[int, int]:
        running = {index: child for index, child in enumerate(self.children) if child.running}
        for child in running.values():
            child.terminate()
        codes = {index: child.wait(_STOP_TIMEOUT_S) for index, child in running.items()}
        for index in running:
            self._ended(index, "stopped")
        return codes

    def _busiest(self) -> int:
        """The process whose deliveries grew last."""
        return max(range(len(self.children)), key=lambda index: self._grew_at[index])

    def _idle(self) -> bool:
        """Whether the group has caught up, looked at at most every :data:`_LOOK_S` (``False`` in between)."""
        if time.monotonic() < self._next_look:
            return False
        self._next_look = time.monotonic() + _LOOK_S
        return self.caught_up()

    # Reading.

    def _read_calls(self) -> list[int]:
        """Read the calls logs on; each process's calls started so far."""
        log, now = self._log, time.monotonic()
        for index, path in enumerate(self.calls_logs):
            if not path.exists():
                continue
            with open(path, "rb") as file:
                file.seek(log.read_to[index])
                data = file.read()
            complete = data[:data.rfind(b"\n") + 1]
            log.read_to[index] += len(complete)
            started = 0
            for line in complete.splitlines():
                record = json.loads(line)
                key = (record["pid"], record.get("call"))
                if "start" in record:
                    log.calls[key] = record | {"end": None, "outcome": None}
                    started += 1
                elif "end" in record:
                    log.calls[key].update(end=record["end"], outcome=record["outcome"])
                elif "pause" in record:
                    log.pause_marks.setdefault(record["pid"], []).append(record)
                elif "gap" in record:
                    log.gaps.append(record)
            if started:
                log.starts[index] += started
                self._grew_at[index] = now
        return log.starts

    def _work(self, final: bool) -> ConsumerWork:
        """What the group did, read now (``final``: every process has ended; a call never finished ends with its
        process)."""
        messages = [row for versions in self._topics.values() for row in versions.update()]
        redriven = [{"msg_id": row["msg_id"], "version": row["version"]} for row in self._redrive.update()]
        directory = self.lakehouse.consumer_dir(GROUP)
        dead = table_rows(self.lakehouse, f"{directory}/dead_letters", ["dead_letter_id", "msg_id"])
        actions = table_rows(self.lakehouse, f"{directory}/operator_actions", ["action", "dead_letter_id", "msg_id"])
        # While the group runs, a consumer the harness paused inside its transaction holds the database's lock until
        # this loop resumes it: a read waits a second, not a minute, and is asked again at the next look.
        with sqlite3.connect(self.db, timeout=60 if final else 1) as db:
            effects = db.execute("SELECT msg_id, topic, keys, topic_version, queue_offset, pid FROM effects "
                                 "ORDER BY rowid").fetchall()
        ended = {incarnation.pid: incarnation.ended for incarnation in self.incarnations}
        calls = [call | {"end": call["end"] if call["end"] is not None else ended.get(call["pid"]) if final else None}
                 for call in self._log.calls.values()]
        resets = [{"versions": {topic["topic"]: topic["version"] for topic in reset["topics"]},
                   "pids": self._pids_since(reset["at"]), "counted_handled": reset["counted_handled"]}
                  for reset in self.resets]
        return ConsumerWork(messages, effects, dead, actions, redriven, calls, self._pause_windows() + self._gaps(),
                            resets, dict(self._epochs))

    def _pause_windows(self) -> list[dict]:
        """Each pause made, with when it began: at its process's own ``pause`` line (asked of it) or when the harness
        sent SIGSTOP, at the latest when the harness saw it stopped."""
        windows = []
        for pause in self.pauses:
            marks = [mark["pause"] for mark in self._log.pause_marks.get(pause["pid"], ())
                     if pause["requested"] is not None and pause["requested"] <= mark["pause"] <= pause["stopped_seen"]]
            begin = marks[-1] if marks else pause["sent"] if pause["sent"] is not None else pause["requested"]
            windows.append({"pid": pause["pid"], "begin_lo": begin, "begin_hi": pause["stopped_seen"],
                            "resumed": pause["resumed"]})
        return windows

    def _gaps(self) -> list[dict]:
        """Each gap an instance reported in its proof of holding its shares, as a pause: it began when the instance
        last proved its hold; from a liveness window after that (another instance may hold its shares by then)
        until the renewal that reported it, the instance was fenced (the window's last half heartbeat absorbs a
        worker's delay between its check of the fence and its call)."""
        return [{"pid": gap["pid"], "begin_lo": gap["gap"] - gap["seconds"],
                 "begin_hi": min(gap["gap"], gap["gap"] - gap["seconds"] + LIVENESS_WINDOW_S), "resumed": gap["gap"],
                 "fenced": (gap["gap"] - gap["seconds"] + LIVENESS_WINDOW_S, gap["gap"])} for gap in self._log.gaps]

    def _pids_since(self, wall: float) -> list[int]:
        return [incarnation.pid for incarnation in self.incarnations if incarnation.started >= wall]

    def _handled_before_reset(self) -> tuple[list[dict], list[str], list[str]]:
        """Every message of the topics, and the ids of those applied and of those with a dead letter, read with the
        group stopped."""
        messages = _retrying(lambda: [row for versions in self._topics.values() for row in versions.update()],
                             "reading the topics")
        with sqlite3.connect(self.db, timeout=60) as db:
            effects = [msg_id for msg_id, in db.execute("SELECT msg_id FROM effects")]
        dead = _retrying(lambda: [row["msg_id"] for row in table_rows(
            self.lakehouse, f"{self.lakehouse.consumer_dir(GROUP)}/dead_letters", ["msg_id"])], "reading the dead letters")
        return messages, effects, dead

    def _progress(self) -> dict[tuple[str, int], Optional[dict]]:
        """Each share's progress record, as the verdict reads it (:func:`bench.chaos.verify.counted_handled`)."""
        group, found = ConsumerGroup(self.lakehouse, GROUP), {}
        for topic in TOPICS:
            for number in range(SHARES):
                progress, _ = group.progress(topic, number)
                found[topic, number] = None if progress is None else {
                    "version": progress.version, "offset": progress.offset, "floor": progress.floor,
                    "unhandled": progress.unhandled, "skip": progress.skip}
        return found


def _plan(count: int, kills: int, pauses: int, resets: int, rounds: int, spread: int,
          rng: random.Random) -> list[_Event]:
    """The events, each after a distinct number of deliveries from 1 to ``spread``, in that order. The kills are
    drawn first: a seed's kills are those of a run without the other events. The pauses made inside a call come
    first among the others, while keys flow (once the group has caught up, no call comes to make them in); the
    order of the rest is drawn."""
    if not count:
        return []
    kill_after = rng.sample(range(1, max(spread, kills) + 1), kills)
    spread = max(spread, kills + pauses + resets + rounds)
    others = sorted(rng.sample(sorted(set(range(1, spread + 1)) - set(kill_after)), pauses + resets + rounds))
    inside = [number for number in range(pauses) if PAUSES[number % len(PAUSES)][0] != FROM_OUTSIDE]
    rest = [(PAUSE, number) for number in range(pauses) if number not in inside]
    rest += [(RESET, number) for number in range(resets)] + [(DEAD_LETTERS, number) for number in range(rounds)]
    rng.shuffle(rest)
    events = [_Event(after, KILL, 0) for after in kill_after]
    events += [_Event(after, kind, number) for after, (kind, number) in zip(others, [(PAUSE, n) for n in inside] + rest)]
    events.sort(key=lambda event: event.after)
    numbers: Counter = Counter()
    for event in events:  # a pause's number says its kind (PAUSES); the others are numbered in their order
        if event.kind != PAUSE:
            event.number = numbers[event.kind]
            numbers[event.kind] += 1
    return events


def _during(pause: dict, calls: list[dict]) -> dict:
    """What a pause (its window, as the verdict takes it) came to: the calls of its process running when it began,
    and the messages it had called that another process called while it was stopped (its shares taken over)."""
    begin, end = pause["begin_lo"], pause["resumed"]
    own = [call for call in calls if call["pid"] == pause["pid"] and call["start"] <= pause["begin_hi"]]
    others = {call["msg_id"] for call in calls if call["pid"] != pause["pid"] and begin <= call["start"] <= end}
    return {"calls_running": [call["msg_id"] for call in own if call["end"] is None or call["end"] >= begin],
            "taken_over": sorted({call["msg_id"] for call in own} & others),
            "others_calls_meanwhile": sum(1 for call in calls if call["pid"] != pause["pid"]
                                          and begin <= call["start"] <= end)}


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP), as ``/proc`` says."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _withdraw(request: Path) -> bool:
    """Take back a pause asked inside the group's next call; ``False`` if a call took it first."""
    try:
        request.unlink()
        return True
    except FileNotFoundError:
        return False


def _retrying(action: Callable[[], T], what: str, deadline_s: float = _STOP_TIMEOUT_S) -> T:
    """``action()``, made again after a storage error (an operator's command run again) until ``deadline_s``."""
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            return action()
        except (CoordinatorError, *_RETRIED) as error:
            if isinstance(error, InvalidArgumentError) or time.monotonic() >= give_up:
                raise
            print(f"  ({what} failed, made again: {error})", flush=True)
            time.sleep(_LOOK_S)


def events_spread(transactions: int) -> int:
    """The deliveries over which a run's consumer events are drawn: about half the messages it will commit."""
    return max(2, transactions // 2)
