"""One checker micro-batch, in four phases, numbered with their steps in docs/design.md#a-batchs-steps:
*gather* (:mod:`.gather`), every read the batch needs besides its records; *decide*, a function of the
records, the memory and the gathered facts, returning a :class:`BatchPlan` (the rows for each table, the
change to the memory, the side effects); *write*, the plan, one idempotent append per table
(:mod:`.writer`, :mod:`.delivery`); *apply*, the memory changed as the plan and the writes say, once they
have landed. Deciding apart from reading and writing keeps a replay's decisions the same, and lets the
decisions be tested with no lakehouse and no JVM.

A crash between two writes is repaired by Spark replaying the batch: the memory is rebuilt as
earlier batches left the tables (:mod:`.rebuild`), the decisions come out the same, and the writes
already made are skipped.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, fields, replace
from typing import Mapping, Optional

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker import CHECKER_NAME
from coordinator.checker.check import Due, find_due
from coordinator.checker.context import (COMMITS_PER_BATCH, OFFSETS_PER_COMMIT, BatchContext, BatchRecords, by_topic,
                                         grouped, kept, shaped)
from coordinator.checker.delivery import Delivered, as_undelivered, deliver, op_rows
from coordinator.checker.gather import Gathered, gather
from coordinator.checker.ingest import ingest_halves, refuse_unknown_kinds
from coordinator.checker.memory import CheckerMemory, TrackedTransaction, tracked_transactions
from coordinator.checker.provenance import refuse_misattributed
from coordinator.checker.rebuild import rebuild_memory
from coordinator.checker.recover import recover_discarded
from coordinator.checker.refusals import rejection
from coordinator.checker.ends import promote, resolve_ends
from coordinator.checker.segment import commits_read
from coordinator.checker.writer import TableWriter, all_done, files_written_at_us
from coordinator.config import CoordinatorConfig
from coordinator.control.instances import ProducerInstances, RefusedRecord
from coordinator.lakehouse import Lakehouse
from coordinator.protocol import Outcome
from coordinator.tables import (CHECK_REQUESTS, COMMITS_READ, DISCARDED, GROUP_CHECK_REQUESTS, HALF, MESSAGE_CONTENT,
                               OP, REJECTED, UNDELIVERED)

__all__ = ["BatchPlan", "BatchRunner", "BatchSummary", "Written", "apply", "batch_clock", "decide", "run_batch", "write"]

log = logging.getLogger("coordinator.checker")


@dataclass(frozen=True)
class BatchSummary:
    """What one batch did, for logs, tests and metrics."""

    batch_id: int
    records: int = 0
    halves: int = 0
    commits: int = 0
    rollbacks: int = 0
    resolved: int = 0  # op rows written: halves committed, rolled back or discarded
    delivered: int = 0
    withheld: int = 0  # committed messages whose topic has not taken them yet (:mod:`.delivery`), after this batch
    checks: int = 0
    discarded: int = 0
    rejected: int = 0
    pending: int = 0  # halves still unresolved after this batch
    pending_from: int = 0  # the next batch's ``pending_from``: no unresolved half lies below it
    duration_ms: int = 0
    oldest_pending_stored_us: Optional[int] = None  # when the oldest unresolved half was stored
    check_answers: Mapping[str, int] = field(default_factory=dict)  # valid check-back answers, by state
    # Latencies in seconds, as Arrow arrays of floats: per transaction committed or rolled back, half stored to
    # END stored; per topic, per message, commit to visible.
    half_to_end_s: pa.ChunkedArray = field(default_factory=lambda: pa.chunked_array([], pa.float64()))
    commit_to_visible_s: Mapping[str, pa.ChunkedArray] = field(default_factory=dict)
    pending_by_topic: Mapping[str, int] = field(default_factory=dict)  # halves still unresolved, per topic
    withheld_by_topic: Mapping[str, int] = field(default_factory=dict)  # of those, committed ones withheld, per topic
    ended_by_topic: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (outcome, topic) -> halves


#: What a batch's log line says: its counts (the per-topic and per-message details are for the metrics).
_LOGGED = tuple(f.name for f in fields(BatchSummary) if f.type == "int" and f.name != "batch_id")


@dataclass(frozen=True)
class BatchPlan:
    """What a batch decided (:func:`decide`): the rows for each table, the change to the memory, the side
    effects. Rows lack ``batch_id`` where the table has one, unless shaped already."""

    halves: pa.Table  # system/half rows: the halves accepted
    arriving: list[TrackedTransaction]  # the transactions this batch leaves unresolved, to add to the memory
    arriving_rows: pa.Table  # their halves' system/half rows
    topics: list[str]  # the topics of the halves accepted (counted from now on)
    decided_ops: pa.Table  # system/op rows of the COMMITs and ROLLBACKs decided (a COMMIT's waits for its delivery)
    deliveries: pa.Table  # the messages committed, in system/undelivered's shape (:mod:`.delivery`)
    due: Due  # the checks and discards, and the instances' records to forget
    rejected: list[dict]  # system/rejected rows
    commits_read: pa.Table  # system/commits_read rows
    resolved_earlier: list[str]  # pending transactions resolved
    resolved_here: list[tuple[str, str]]  # transactions resolved in the batch that brought their halves: (id, group)
    commits: int
    rollbacks: int
    check_answers: Mapping[str, int]
    half_to_end_s: pa.ChunkedArray
    ended_by_topic: Mapping[tuple[str, str], int]


@dataclass(frozen=True)
class Written:
    """What the write phase did."""

    delivered: Delivered
    ops: pa.Table  # the system/op rows written
    check_visible_at_us: Optional[int]  # when the checks written became visible (None: none, or written before)
    all_landed: bool  # no append found this batch's write made already (a replay)


@dataclass
class BatchRunner:
    """What the checker keeps from one batch to the next: its memory (:mod:`.memory`), the writer of its
    tables, and the Spark session a rebuild may use (:func:`.unresolved.rebuild_in_spark`).

    Example::

        runner = BatchRunner()
        run_batch(config, segment.records(lakehouse), batch_id=7, runner=runner)
        runner.memory.pending_halves()
    """

    spark: Optional[object] = field(default=None, repr=False)
    memory: Optional[CheckerMemory] = None
    writer: Optional[TableWriter] = None

    def prepare(self, config: CoordinatorConfig, batch_id: int, pending_from: int, app_id: str) -> CheckerMemory:
        """The memory ready for batch ``batch_id``, rebuilt from the tables unless it already is."""
        if (self.memory is not None and self.memory.next_batch_id == batch_id and self.writer is not None
                and self.writer.app_id == app_id):
            return self.memory
        self.memory = rebuild_memory(config, batch_id, pending_from, self.spark)
        if self.writer is not None:
            self.writer.close()
        self.writer = TableWriter(app_id, Lakehouse.of(config).storage)
        return self.memory

    def invalidate(self) -> None:
        """Make the next batch rebuild the memory (after a failed batch)."""
        if self.memory is not None:
            self.memory.invalidate()


def batch_clock(records: pa.Table) -> Optional[int]:
    """The clock of a collected batch (``None`` for an empty batch): the latest commit or tick time
    among its own rows, never the wall clock, so a replayed batch decides exactly as the first run did.

    Example::

        batch_clock(segment.records(lakehouse))  # microseconds since the epoch
    """
    return pc.max(records.column("stored_timestamp").cast(pa.int64())).as_py()


def run_batch(
    config: CoordinatorConfig,
    records: pa.Table,
    batch_id: int,
    app_id: str = CHECKER_NAME,
    pending_from: int = 0,
    runner: Optional[BatchRunner] = None,
    shared_log: bool = False,
) -> Optional[BatchSummary]:
    """Process one micro-batch of commit-log records (plus heartbeat ticks): gather, decide, write, apply.

    ``records`` are the batch's rows (:meth:`coordinator.checker.segment.Segment.records`).
    ``pending_from`` is the previous batch's ``BatchSummary.pending_from`` (0 looks through the
    whole half queue); ``runner`` what the checker keeps between calls (a fresh one, the
    default, rebuilds the memory from the tables); ``shared_log`` replays a batch a checker of the one
    shared commit log announced (:mod:`.context`). Returns ``None`` for an empty batch.

    Example::

        runner = BatchRunner()
        run_batch(config, segment.records(lakehouse), batch_id=7, runner=runner)
    """
    started = time.monotonic()
    now_us = batch_clock(records)
    if now_us is None:
        return None
    runner = runner if runner is not None else BatchRunner()
    memory = runner.prepare(config, batch_id, pending_from, app_id)
    ctx = BatchContext(config, batch_id, now_us, Lakehouse.of(config))
    batch = BatchRecords.of(records, batch_id, shared_log)
    plan = decide(ctx, batch, memory, gather(ctx, batch, memory))
    memory.invalidate()  # until the writes have all landed: a batch that fails leaves the next one to rebuild
    written = write(ctx, runner.writer, plan, memory.undelivered)
    apply(ctx, memory, plan, written)
    summary = _summary(ctx, batch, plan, written, memory, pending_from, shared_log)
    summary = replace(summary, duration_ms=int((time.monotonic() - started) * 1000))
    log.info("batch %d: %s", batch_id, ", ".join(f"{name}={getattr(summary, name)}" for name in _LOGGED))
    return summary


def decide(ctx: BatchContext, all_records: BatchRecords, memory: CheckerMemory, facts: Gathered) -> BatchPlan:
    """Everything batch ``ctx`` does, decided from its records, the ``memory`` of earlier batches and the
    ``facts`` gathered: a function of these alone (it reads and changes nothing), so a replay decides
    the same. The steps are docs/design.md#a-batchs-steps.

    Example::

        plan = decide(ctx, records, memory, gather(ctx, records, memory))
        plan.decided_ops.num_rows, plan.due.checked
    """
    records, misattributed = refuse_misattributed(all_records, memory.layout)
    ingested = ingest_halves(ctx, records, facts.known)
    resolved = resolve_ends(records, ingested.halves, memory, facts.known)
    resolved_here = resolved.ids(in_batch=True)
    arriving_rows = ingested.halves.filter(pc.invert(pc.is_in(
        ingested.halves.column("transaction_id"), value_set=pa.array(resolved_here, pa.string()))))
    arriving = tracked_transactions(arriving_rows)
    resolved_earlier = resolved.ids(in_batch=False)
    recovered = recover_discarded(resolved.to_recover, facts.recovery)
    decided_ops = pa.concat_tables([_table(OP, resolved.ops, ctx.batch_id), _rows_table(OP, recovered.ops, ctx.batch_id)])
    deliveries = as_undelivered(pa.concat_tables([promote(resolved, ingested.halves, memory), recovered.deliveries]),
                                decided_ops, ctx.batch_id)
    # A message withheld already (an operator's second COMMIT of a discarded transaction while the first
    # waits for its topic) is delivered once, as withheld.
    deliveries = kept(deliveries, pc.invert(pc.is_in(deliveries.column("half_offset"),
                                                     value_set=memory.undelivered.column("half_offset"))))
    due = find_due(ctx, memory, arriving, arriving_rows, set(resolved_earlier), facts.surveys)
    rejected = (misattributed + refuse_unknown_kinds(records) + ingested.rejections + resolved.rejections
                + recovered.rejections + _instance_rejections(due.refused_instances, ctx.now_us))
    return BatchPlan(
        halves=ingested.halves, arriving=arriving, arriving_rows=arriving_rows,
        topics=pc.unique(ingested.halves.column("topic")).to_pylist(), decided_ops=decided_ops,
        deliveries=deliveries, due=due, rejected=rejected, commits_read=commits_read(all_records.table),
        resolved_earlier=resolved_earlier, resolved_here=list(zip(resolved_here, resolved.groups(in_batch=True))),
        commits=resolved.count(Outcome.COMMIT) + len(recovered.transaction_ids),
        rollbacks=resolved.count(Outcome.ROLLBACK), check_answers=dict(resolved.check_answers),
        half_to_end_s=resolved.half_to_end_s,
        ended_by_topic=_ended_by_topic(resolved.ops, due.discarded, recovered.deliveries))


def write(ctx: BatchContext, writer: TableWriter, plan: BatchPlan, outstanding: pa.Table) -> Written:
    """Write ``plan``: one append per table, each carrying ``(app id, batch id)`` so that a replay skips it.

    Appends run at once where no order is owed, in three rounds: first the halves, the topics, the group
    tables of check requests, the commits read and the rejections; then the withheld messages, the
    discarded ones and the checker's record of the checks (after its groups' own: a check counts as
    visible when the record is, never before its group's); last the op rows. A committed message's op row
    so comes after its topic row has landed, and after the record of its withholding if it has not: a
    replay, a restart or a topic that cannot be written never leaves a message resolved and undelivered
    (:mod:`.delivery`). A half precedes its op for readers' convenience, and a discarded message's content
    precedes the op that discards it.
    """
    lakehouse, batch_id, due = ctx.lakehouse, ctx.batch_id, plan.due

    def started(table, data: pa.Table, path: Optional[str] = None) -> Future:
        return writer.submit(path or lakehouse.path(table), data, batch_id,
                             create_as=table if table is GROUP_CHECK_REQUESTS else None)

    first = []
    if plan.halves.num_rows:
        first.append(started(HALF, plan.halves))
    requests = _table(CHECK_REQUESTS, due.requests, batch_id) if due.checked else None
    if requests is not None:
        for group in sorted(set(requests.column("producer_group").to_pylist())):
            first.append(started(GROUP_CHECK_REQUESTS, requests.filter(pc.equal(requests.column("producer_group"), group)),
                                 lakehouse.check_requests(group)))
    if plan.commits_read.num_rows:  # every commit this batch read, with its digest (replayed: written once)
        first.append(started(COMMITS_READ, _table(COMMITS_READ, plan.commits_read, batch_id)))
    if plan.rejected:
        first.append(started(REJECTED, _rows_table(REJECTED, plan.rejected, batch_id)))
    delivered = deliver(writer, lakehouse, batch_id, plan.deliveries, outstanding)
    versions = all_done(first)

    second, checks = [], None
    if delivered.withheld_now.num_rows:
        second.append(started(UNDELIVERED, delivered.withheld_now))
    if due.discarded.num_rows:
        second.append(started(DISCARDED, _table(DISCARDED, due.discarded, batch_id)))
    if requests is not None:
        for name in MESSAGE_CONTENT:  # the checker's record, without the messages' content
            requests = requests.set_column(requests.schema.get_field_index(name), name,
                                           pa.nulls(requests.num_rows, requests.schema.field(name).type))
        checks = started(CHECK_REQUESTS, requests)
        second.append(checks)
    versions += all_done(second)

    withheld = delivered.withheld_now.column("half_offset").combine_chunks()
    decided = plan.decided_ops
    ops = pa.concat_tables([kept(decided, pc.invert(pc.is_in(decided.column("half_offset"), value_set=withheld))),
                            _table(OP, op_rows(delivered.settled), batch_id),
                            _rows_table(OP, due.discard_ops, batch_id)])
    if ops.num_rows:
        versions += all_done([started(OP, ops)])
    visible_at_us = None
    if checks is not None and checks.result() is not None:
        visible_at_us = files_written_at_us(lakehouse.path(CHECK_REQUESTS), checks.result(), lakehouse.storage)
    if due.stale_instances or due.refused_instances:  # only now, and explicitly: deciding deleted nothing
        instances = ProducerInstances(lakehouse)
        for group in sorted(set(due.stale_instances) | set(due.refused_instances)):
            instances.forget(group, due.stale_instances.get(group, []), due.refused_instances.get(group, []))
    return Written(delivered, ops, visible_at_us, not delivered.replayed and all(v is not None for v in versions))


def apply(ctx: BatchContext, memory: CheckerMemory, plan: BatchPlan, written: Written) -> None:
    """Change ``memory`` as ``plan`` decided and ``written`` says landed. A batch some of whose writes a
    replay found made already leaves the memory for the next batch to rebuild."""
    config, delivered = ctx.config, written.delivered
    withheld = delivered.withheld_now.column("half_offset").combine_chunks()
    memory.add_pending(plan.arriving, plan.arriving_rows, config)
    memory.count_topics(plan.topics)
    withheld_here = plan.halves.filter(pc.is_in(plan.halves.column("queue_offset"), value_set=withheld))
    memory.add_pending(tracked_transactions(withheld_here), withheld_here, config)
    memory.retire([*plan.resolved_earlier, *plan.due.given_up], withheld=set(withheld.to_pylist()))
    memory.settle(delivered.settled)
    memory.remember_resolved(plan.resolved_here)
    memory.withhold(delivered.withheld)
    memory.advance_due(ctx.now_us, config)
    if written.check_visible_at_us is not None:
        memory.checked([p.transaction_id for p in plan.due.checked], written.check_visible_at_us, config)
    if written.all_landed:
        memory.next_batch_id = ctx.batch_id + 1


def _summary(ctx: BatchContext, records: BatchRecords, plan: BatchPlan, written: Written, memory: CheckerMemory,
             pending_from: int, shared_log: bool) -> BatchSummary:
    delivered, lowest = written.delivered, memory.lowest_pending_offset()
    return BatchSummary(
        batch_id=ctx.batch_id,
        records=records.light.num_rows,
        halves=plan.halves.num_rows,
        commits=plan.commits,
        rollbacks=plan.rollbacks,
        resolved=written.ops.num_rows,
        delivered=delivered.written_now.num_rows,
        withheld=delivered.withheld.num_rows,
        checks=len(plan.due.checked),
        discarded=plan.due.discarded.num_rows,
        rejected=len(plan.rejected),
        pending=memory.pending_half_count,
        oldest_pending_stored_us=memory.oldest_pending_stored_us(),
        check_answers=plan.check_answers,
        half_to_end_s=plan.half_to_end_s,
        commit_to_visible_s={topic: _seconds_since(rows.column("commit_timestamp"))
                             for topic, rows in by_topic(delivered.written_now)},
        pending_by_topic=dict(memory.pending_by_topic),
        withheld_by_topic={topic: rows.num_rows for topic, rows in by_topic(delivered.withheld)},
        ended_by_topic=plan.ended_by_topic,
        pending_from=lowest if lowest is not None else max(pending_from, _next_offset(records, ctx.batch_id, shared_log)),
    )


def _ended_by_topic(ops: pa.Table, discarded: pa.Table, recovered: pa.Table) -> dict[tuple[str, str], int]:
    """Half messages this batch ended, by outcome and topic: committed or rolled back (their ``ops``, with
    each half's topic), discarded, and committed by an operator after their discard."""
    ended = pa.concat_tables([
        ops.select(["outcome", "topic"]),
        pa.table({"outcome": pa.repeat(Outcome.DISCARD.value, discarded.num_rows), "topic": discarded.column("topic")}),
        pa.table({"outcome": pa.repeat(Outcome.COMMIT.value, recovered.num_rows), "topic": recovered.column("topic")}),
    ], promote_options="permissive")
    counts = grouped(ended, ["outcome", "topic"]).aggregate([([], "count_all")])
    return dict(zip(zip(counts.column("outcome").to_pylist(), counts.column("topic").to_pylist()),
                    counts.column("count_all").to_pylist()))


def _instance_rejections(refused: Mapping[str, list[RefusedRecord]], now_us: int) -> list[dict]:
    """The ``system/rejected`` rows of the files refused as producer instances' records: where each was."""
    return [rejection({"producer_group": group, "commit_log": refusal.key, "stored_us": now_us}, refusal.reason)
            for group, refusals in sorted(refused.items()) for refusal in refusals]


def _seconds_since(times: pa.ChunkedArray) -> pa.ChunkedArray:
    """For each of ``times``, the seconds from it to now (the moment its rows became visible)."""
    now_us = time.time_ns() // 1000
    return pc.divide(pc.subtract(now_us, times.cast(pa.int64())), 1e6)


def _next_offset(records: BatchRecords, batch_id: int, shared_log: bool) -> int:
    """A queue offset no half of a later batch can be below (see :mod:`.context`)."""
    if not shared_log:
        return (batch_id + 1) * COMMITS_PER_BATCH * OFFSETS_PER_COMMIT
    # A batch of the shared log: its sequences are versions, the next batch's are higher.
    highest = pc.max(records.light.column("sequence")).as_py()
    return ((-1 if highest is None else highest) + 1) * OFFSETS_PER_COMMIT


def _table(table, data: pa.Table, batch_id: int) -> pa.Table:
    return shaped(table, {name: data.column(name) for name in data.column_names}, data.num_rows, batch_id)


def _rows_table(table, rows: list[dict], batch_id: int) -> pa.Table:
    columns = {name: [row.get(name) for row in rows] for name in table.column_names if name != "batch_id"}
    return shaped(table, columns, len(rows), batch_id)
