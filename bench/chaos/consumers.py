"""The consumer group of a chaos run: its processes (:mod:`bench.chaos.consumer`), killed -9 while producers send
and restarted at once, and the verdict on what they did.

Each kill is planned after the group's n-th delivery (n drawn at random, counted over every process and run, no
two kills at the same n) and triggered by it, never by the clock: the process killed is the one whose deliveries
grew last, as soon as the harness sees the delivery (it looks every 0.2 s), so the kill lands while that process
handles or just after. A kill waits for a delivery since the last one. A kill still planned once the producers
are done and the group has caught up (fewer deliveries than planned) is made then.

The verdict, from the topics, the group's SQLite database and its dead letters (each count must be 0):

- ``consumer_missed``: a message in a topic neither applied (an ``effects`` row) nor, if of the failing kind, a
  dead letter: every committed message handled at least once;
- ``consumer_applied_twice``: a message with two ``effects`` rows: the exactly-once effect applied twice;
- ``consumer_out_of_order``: two effects of one key in one topic that committed in another order than the topic's
  (its versions, then ``queue_offset`` within one);
- ``consumer_leaked``: an effect of a message in no topic, or of one of the failing kind;
- ``dead_letter_unaccounted``: a dead letter of a message that is in no topic or is not of the failing kind, or a
  message with two open dead letters.
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import support
from bench.chaos.actors import table_rows
from bench.chaos.consumer import GROUP, SHARES, TOPICS, create_effects, fails_always
from coordinator.consumer.group import ConsumerGroup
from coordinator.lakehouse import Lakehouse

__all__ = ["CONSUMER_FINDINGS", "Consumers"]

CONSUMER_FINDINGS = ("consumer_missed", "consumer_applied_twice", "consumer_out_of_order", "consumer_leaked",
                     "dead_letter_unaccounted")
#: How often the group's progress is read while waiting for it to catch up.
_LOOK_S = 1.0


class Consumers:
    """``count`` processes of the chaos consumer group, sharing one SQLite database in ``root``; ``kills`` of them
    planned, after deliveries drawn from 1 to ``spread``."""

    def __init__(self, root: Path, config_path: Path, lakehouse: Lakehouse, count: int, kills: int, spread: int,
                 rng: random.Random) -> None:
        self.lakehouse = lakehouse
        ConsumerGroup(lakehouse, GROUP).write_grant(TOPICS, SHARES, "chaos-operator")
        self.db = root / "consumers.db"
        create_effects(str(self.db))
        self.deliveries = [root / f"consumer-{index}.deliveries" for index in range(count)]
        self.children = [support.Job([sys.executable, "-m", "bench.chaos.consumer", "--config", str(config_path),
                                      "--db", str(self.db), "--deliveries", str(path)], root / f"consumer-{index}.log",
                                     env=support.child_environment(os.environ))
                         for index, path in enumerate(self.deliveries)]
        spread = max(spread, kills)
        self.kill_after = sorted(rng.sample(range(1, spread + 1), kills)) if count else []
        self.kills: list[dict] = []
        self.restarts = 0
        self.failures: list[str] = []
        self._counts = [0] * count
        self._grew_at = [0.0] * count
        self._next_look = 0.0
        self._at_last_kill = 0  # the group's deliveries at the last kill: the next waits for one more

    def start(self) -> None:
        for child in self.children:
            child.start()

    def act(self, producers_done: bool) -> None:
        """Restart a process that exited on its own; kill -9 (and restart) one that handles once the group's
        deliveries reach the next planned kill, or at once when the producers are done and it has caught up."""
        for index, child in enumerate(self.children):
            if not child.running:
                self.failures.append(f"consumer-{index} exited with code {child.exit_code()}")
                child.start()
                self.restarts += 1
        if not self.kill_after:
            return
        counts = self._delivered()
        if sum(counts) <= self._at_last_kill:
            return  # nothing delivered since the last kill: the next kill waits for the group to handle again
        due = sum(counts) >= self.kill_after[0]
        if not due and producers_done and time.monotonic() >= self._next_look:
            self._next_look = time.monotonic() + _LOOK_S
            due = self.caught_up()  # fewer deliveries than planned: killed once it has handled everything
        if due:
            self._kill(max(range(len(self.children)), key=lambda index: self._grew_at[index]), sum(counts))

    @property
    def kills_left(self) -> int:
        return len(self.kill_after)

    def caught_up(self) -> bool:
        """Whether every message in the topics is applied or, of the failing kind, a dead letter."""
        try:
            return _account(self._read())["consumer_missed"] == 0
        except Exception as error:  # a read racing maintenance, or a storage fault: asked again next time
            print(f"  (reading the consumer group's work failed, retrying: {error})", flush=True)
            return False

    def wait_caught_up(self, deadline: float) -> bool:
        """Until the group has caught up (its planned kills made on the way); ``False`` if ``deadline`` came first."""
        while self.children and time.monotonic() < deadline:
            self.act(producers_done=True)
            if not self.kill_after and self.caught_up():
                return True
            time.sleep(_LOOK_S)
        return not self.children

    def stop(self) -> dict:
        """SIGTERM every process (each closes its consumer and exits 0); their exit codes by name."""
        running = {f"consumer-{index}": child for index, child in enumerate(self.children) if child.running}
        for child in running.values():
            child.terminate()
        return {name: child.wait(120) for name, child in running.items()}

    def verdict(self) -> tuple[dict, dict, dict]:
        """The counts of :data:`CONSUMER_FINDINGS`, their first examples, and what the group did (nothing to judge
        in a run without consumers)."""
        if not self.children:
            return {name: 0 for name in CONSUMER_FINDINGS}, {}, {"consumer_processes": 0}
        read = self._read()
        found, examples, did = _account(read, with_examples=True)
        failing = {row["msg_id"] for row in read["topics"] if fails_always(row["tags"])}
        delivered = Counter(line for path in self.deliveries if path.exists() for line in path.read_text().split())
        did |= {"consumer_processes": len(self.children), "consumer_kills": self.kills,
                "consumer_restarts": self.restarts, "consumer_failures": self.failures,
                "deliveries": sum(delivered.values()),
                # Of the messages the listener applies: delivered again after a kill (or a share handed over).
                "delivered_again": sum(times - 1 for msg_id, times in delivered.items() if msg_id not in failing),
                "deliveries_of_failing": sum(times for msg_id, times in delivered.items() if msg_id in failing)}
        return found, examples, did

    def _kill(self, index: int, delivered: int) -> None:
        child = self.children[index]
        child.kill()
        self.kills.append({"consumer": index, "after_deliveries": delivered,
                           "after_start_s": round(time.monotonic() - child.started_at, 1)})
        self.kill_after.pop(0)
        self._at_last_kill = delivered
        child.start()
        self.restarts += 1

    def _delivered(self) -> list[int]:
        now = time.monotonic()
        for index, path in enumerate(self.deliveries):
            count = path.read_bytes().count(b"\n") if path.exists() else 0
            if count > self._counts[index]:
                self._counts[index], self._grew_at[index] = count, now
        return self._counts

    def _read(self) -> dict:
        columns = ["msg_id", "topic", "keys", "tags"]
        topics = [row for topic in TOPICS for row in table_rows(self.lakehouse, f"topics/{topic}", columns)]
        dead = table_rows(self.lakehouse, f"{self.lakehouse.consumer_dir(GROUP)}/dead_letters", ["msg_id", "topic"])
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=60) as db:
            effects = db.execute("SELECT msg_id, topic, keys, topic_version, queue_offset FROM effects "
                                 "ORDER BY rowid").fetchall()
        return {"topics": topics, "dead": dead, "effects": effects}


def _account(read: dict, with_examples: bool = False):
    """The verdict's counts (and, ``with_examples``, the first examples of each and what was applied)."""
    found, examples = Counter({name: 0 for name in CONSUMER_FINDINGS}), defaultdict(list)

    def violation(name: str, example: str) -> None:
        found[name] += 1
        if len(examples[name]) < 5:
            examples[name].append(example)

    messages = {row["msg_id"]: row for row in read["topics"]}
    applied = Counter(msg_id for msg_id, *_ in read["effects"])
    dead = Counter(row["msg_id"] for row in read["dead"])
    for msg_id, row in messages.items():
        failing = fails_always(row["tags"])
        if not (dead[msg_id] if failing else applied[msg_id]):
            violation("consumer_missed", f"{row['topic']} {msg_id} ({row['tags']}): "
                                         f"{'no dead letter' if failing else 'never applied'}")
    for msg_id, times in applied.items():
        if times > 1:
            violation("consumer_applied_twice", f"{msg_id}: applied {times} times")
        if msg_id not in messages or fails_always(messages[msg_id]["tags"]):
            violation("consumer_leaked", f"{msg_id}: applied, but {'in no topic' if msg_id not in messages else 'of the failing kind'}")
    for msg_id, times in dead.items():
        if msg_id not in messages or not fails_always(messages[msg_id]["tags"]) or times > 1:
            violation("dead_letter_unaccounted", f"{msg_id}: {times} dead letter(s), "
                                                 f"{'in no topic' if msg_id not in messages else messages[msg_id]['tags']}")
    last: dict[tuple, tuple] = {}
    for msg_id, topic, keys, version, offset in read["effects"]:
        if keys is None:
            continue
        if (topic, keys) in last and last[topic, keys] >= (version, offset):
            violation("consumer_out_of_order", f"{topic} key {keys}: {msg_id} at version {version} offset {offset} "
                                               f"applied after version {last[topic, keys][0]} offset {last[topic, keys][1]}")
        last[topic, keys] = max(last.get((topic, keys), (version, offset)), (version, offset))
    if not with_examples:
        return found
    did = {"applied": sum(applied.values()), "dead_letters": sum(dead.values()),
           "keys_in_order": len(last)}
    return dict(found), dict(examples), did


def kills_spread(transactions: int) -> int:
    """The deliveries over which a run's consumer kills are drawn: about half the messages it will commit."""
    return max(2, transactions // 2)
