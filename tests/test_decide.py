"""A batch's *decide* and *apply* phases alone: no lakehouse, no JVM (docs/design.md#a-batchs-steps).

Random streams of commit-log records (new transactions on two topics, ENDs and check answers in any
order, operators' COMMITs, records no producer writes, a topic that stops taking writes and comes
back, hours passing) go through decide → a write that lands in memory → apply, batch after batch;
then every transaction is let run out. The invariants of docs/design.md#invariants must hold.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import end_record, half_record
from coordinator.checker.batch import Written, apply, decide
from coordinator.checker.context import BatchContext, BatchRecords, shaped
from coordinator.checker.delivery import deliver, op_rows
from coordinator.checker.gather import Gathered
from coordinator.checker.memory import CheckerMemory
from coordinator.checker.recover import RecoveryFacts, operator_commit_targets
from coordinator.checker.segment import RECORD_SCHEMA
from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse
from coordinator.protocol import OPERATOR_CHECK_PREFIX, Outcome
from coordinator.schedule import clock_us
from coordinator.tables import DISCARDED, OP

CONFIG = CoordinatorConfig(lakehouse="/nowhere", transaction_timeout_ms=6000, transaction_check_interval_ms=60_000,
                           transaction_check_max=2)
LAKEHOUSE = Lakehouse("/nowhere")  # never opened: decide and apply read nothing
START_US = 1_800_000_000_000_000


class TopicsInMemory:
    """The topics' side of the write phase, in memory: each topic records the batches appended to it, as a
    Delta table's application transactions do; a broken topic refuses every append."""

    app_id = "txcoord-checker"

    def __init__(self) -> None:
        self.rows: dict[str, list[dict]] = defaultdict(list)
        self.batches: dict[str, int] = defaultdict(lambda: -1)
        self.broken: set[str] = set()
        self.appends: list[list[int]] = []  # each append's queue offsets

    def recorded(self, path: str) -> int:
        return self.batches[path]

    def append(self, path: str, data: pa.Table, batch_id: int, create_as=None, created_with=None):
        if path.rsplit("/", 1)[-1] in self.broken:
            raise PermissionError(f"{path}: access denied")
        if self.batches[path] >= batch_id:
            return None
        self.rows[path].extend(data.to_pylist())
        self.appends.append(data.column("queue_offset").to_pylist())
        self.batches[path] = batch_id
        return 1

    def submit(self, path: str, data: pa.Table, batch_id: int, create_as=None, created_with=None) -> Future:
        """:meth:`append`, its outcome held in a future as :meth:`TableWriter.submit`'s is."""
        future: Future = Future()
        try:
            future.set_result(self.append(path, data, batch_id, create_as))
        except Exception as error:
            future.set_exception(error)
        return future

    def forget(self, path: str) -> None:
        pass


@dataclass
class Run:
    """The checker's memory and what its writes would have left in the tables."""

    memory: CheckerMemory = field(default_factory=lambda: CheckerMemory(next_batch_id=0))
    topics: TopicsInMemory = field(default_factory=TopicsInMemory)
    now_us: int = START_US
    batch_id: int = 0
    versions: Counter = field(default_factory=Counter)
    ops: list[dict] = field(default_factory=list)
    discarded: list[pa.Table] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    halves: dict[str, dict] = field(default_factory=dict)  # msg_id -> system/half row
    rejected_msg_ids: set[str] = field(default_factory=set)
    sent_msg_ids: set[str] = field(default_factory=set)
    decided_in: dict[str, int] = field(default_factory=dict)  # transaction -> the batch its COMMIT or ROLLBACK came in
    discarded_in: dict[str, int] = field(default_factory=dict)  # transaction -> the batch that discarded it

    def batch(self, commits: list[list[dict]]) -> None:
        """One batch over ``commits`` (each a list of records of one group's log), at the run's clock."""
        records = BatchRecords.of(self._collected(commits), self.batch_id)
        ctx = BatchContext(CONFIG, self.batch_id, self.now_us, LAKEHOUSE)
        known, unsure = self.memory.lookup(pc.unique(records.light.column("transaction_id")).drop_null().to_pylist())
        assert not unsure  # every id is remembered here: nothing to look up in the tables
        plan = decide(ctx, records, self.memory, Gathered(known, self._recovery_facts(records), {}))
        delivered = deliver(self.topics, LAKEHOUSE, self.batch_id, plan.deliveries, self.memory.undelivered)
        withheld = delivered.withheld_now.column("half_offset").combine_chunks()
        decided = plan.decided_ops.filter(pc.invert(pc.is_in(plan.decided_ops.column("half_offset"), value_set=withheld)))
        ops = [*decided.select(["half_offset", "transaction_id", "outcome"]).to_pylist(),
               *op_rows(delivered.settled).select(["half_offset", "transaction_id", "outcome"]).to_pylist(),
               *({"half_offset": r["half_offset"], "transaction_id": r["transaction_id"], "outcome": Outcome(r["outcome"]).value}
                 for r in plan.due.discard_ops)]
        self.ops.extend(ops)
        for transaction_id in plan.decided_ops.column("transaction_id").to_pylist():
            if transaction_id not in self.discarded_in:  # else an operator's commit of a discarded one
                self.decided_in.setdefault(transaction_id, self.batch_id)
        self.discarded_in.update(dict.fromkeys(plan.due.given_up, self.batch_id))
        self.discarded.append(plan.due.discarded)
        self.checks.extend(dict(r, batch=self.batch_id)
                           for r in plan.due.requests.select(["check_id", "transaction_id", "requested_at"]).to_pylist())
        self.halves.update({row["msg_id"]: row for row in plan.halves.to_pylist()})
        self.rejected_msg_ids.update(row.get("msg_id") for row in plan.rejected if row.get("kind") == "HALF")
        apply(ctx, self.memory, plan, Written(delivered, shaped(OP, {}, len(ops), self.batch_id),
                                              self.now_us if plan.due.checked else None, True))
        self.batch_id += 1

    def _collected(self, commits: list[list[dict]]) -> pa.Table:
        rows = []
        for rank, records in enumerate(commits):
            log = f"groups/{records[0]['producer_group'] or 'g'}/commit_log"
            version, self.versions[log] = self.versions[log], self.versions[log] + 1
            for record in records:
                if record.get("kind") == "HALF":
                    self.sent_msg_ids.add(record["msg_id"])
                rows.append({**{name: record.get(name) for name in RECORD_SCHEMA.names},
                             "properties": list((record.get("properties") or {}).items()),
                             "commit_log": log, "commit_version": version, "commit_rank": rank,
                             "stored_timestamp": self.now_us, "is_heartbeat": False})
        rows.append({"stored_timestamp": self.now_us, "is_heartbeat": True})  # the clock tick
        return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)

    def _recovery_facts(self, records: BatchRecords) -> RecoveryFacts:
        named = set(operator_commit_targets(records.light))
        outcomes: dict[str, set[str]] = defaultdict(set)
        for op in self.ops:
            if op["transaction_id"] in named:
                outcomes[op["transaction_id"]].add(op["outcome"])
        discarded = pa.concat_tables([DISCARDED.arrow_schema().empty_table(),
                                      *(shaped(DISCARDED, {n: t.column(n) for n in t.column_names}, t.num_rows, 0)
                                        for t in self.discarded)])
        discarded = discarded.filter(pc.is_in(discarded.column("transaction_id"), value_set=pa.array(sorted(named), pa.string())))
        return RecoveryFacts(dict(outcomes), discarded.sort_by("half_offset"))


# A step: (new transactions: message counts per transaction, ends: (which, state, how), an operator's commit of
# one, a record no producer writes, seconds passing, whether topic B stops taking writes).
ends = st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"]),
                          st.sampled_from(["own", "answer"])), max_size=3)
steps = st.lists(st.tuples(st.lists(st.integers(1, 3), max_size=3), ends, st.one_of(st.none(), st.integers(0, 50)),
                           st.booleans(), st.sampled_from([1, 3, 7, 61, 200]), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_random_record_streams_keep_the_invariants(steps):
    run, sent = Run(), []
    for new, answers, operator, garbage, seconds, break_b in steps:
        run.topics.broken = {"B"} if break_b else set()
        commits = []
        for count in new:
            transaction_id = f"t{len(sent):03d}-{uuid.uuid4().hex[:6]}"
            group = "g" if len(sent) % 2 else "h"
            sent.append((transaction_id, group))
            commits.append([half_record(transaction_id, group=group, topic="AB"[i % 2], message_index=i,
                                        message_count=count, body=f"{transaction_id}/{i}".encode()) for i in range(count)])
        for which, state, how in answers:
            if sent:
                transaction_id, group = sent[which % len(sent)]
                check_id = f"{transaction_id}-1" if how == "answer" else None
                commits.append([end_record(transaction_id, state, group=group, check_id=check_id)])
        if operator is not None and sent:
            transaction_id, group = sent[operator % len(sent)]
            commits.append([end_record(transaction_id, group=group, check_id=f"{OPERATOR_CHECK_PREFIX}{uuid.uuid4().hex}",
                                       producer_group=group)])
        if garbage:
            commits.append([half_record(None, group="g"), end_record("nobody", "MAYBE", group="g")])
        run.batch([c for c in commits if not (c[0].get("check_id") or "").startswith(OPERATOR_CHECK_PREFIX)])
        operators = [c for c in commits if (c[0].get("check_id") or "").startswith(OPERATOR_CHECK_PREFIX)]
        if operators:
            run.batch(operators)
        run.now_us += seconds * 1_000_000
    run.topics.broken = set()
    for _ in range(2 * CONFIG.transaction_check_max + 2):  # every check, then the discard, comes due
        run.now_us += (CONFIG.transaction_check_interval_ms + 1000) * 1000
        run.batch([])

    assert_invariants(run)


def assert_invariants(run: Run) -> None:
    # 3. No half is lost: each is accepted or refused, and each accepted one is resolved in the end.
    assert run.sent_msg_ids <= set(run.halves) | run.rejected_msg_ids
    assert not run.memory.pending and not run.memory.undelivered.num_rows
    outcomes: dict[int, list[str]] = defaultdict(list)
    for op in run.ops:
        outcomes[op["half_offset"]].append(op["outcome"])
    offsets = {row["queue_offset"]: row for row in run.halves.values()}
    assert set(outcomes) == set(offsets)
    assert all(found in (["COMMIT"], ["ROLLBACK"], ["DISCARD"], ["DISCARD", "COMMIT"]) for found in outcomes.values())
    # 1, 2 and 8. A committed message is delivered exactly once, whole; nothing else ever is.
    delivered = Counter(row["queue_offset"] for rows in run.topics.rows.values() for row in rows)
    assert all(count == 1 for count in delivered.values())
    assert set(delivered) == {offset for offset, found in outcomes.items() if found[-1] == "COMMIT"}
    for path, rows in run.topics.rows.items():
        assert all(path.endswith("/" + offsets[row["queue_offset"]]["topic"]) for row in rows)
    assert all(append == sorted(append) for append in run.topics.appends)  # each in queue order
    by_transaction: dict[str, set[str]] = defaultdict(set)
    for offset, found in outcomes.items():
        by_transaction[offsets[offset]["transaction_id"]].add(found[-1])
    assert all(len(final) == 1 for final in by_transaction.values())  # all of a transaction's messages, or none
    # 4. Checks keep to their times: never before the immunity, at most the maximum, never twice under one id.
    assert len({check["check_id"] for check in run.checks}) == len(run.checks)
    stored = {row["transaction_id"]: clock_us(row["stored_timestamp"]) for row in run.halves.values()}
    for transaction_id, count in Counter(check["transaction_id"] for check in run.checks).items():
        assert count <= CONFIG.transaction_check_max
    for check in run.checks:
        assert check["requested_at"] - stored[check["transaction_id"]] >= CONFIG.transaction_timeout_ms * 1000
        # A decided transaction, delivered or withheld from its topic, is never checked again, nor discarded.
        assert check["batch"] < run.decided_in.get(check["transaction_id"], check["batch"] + 1)
    assert all(run.discarded_in[t] < decided for t, decided in run.decided_in.items() if t in run.discarded_in)
