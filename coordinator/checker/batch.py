"""One checker micro-batch: ingest, resolve, check, then write everything once.

The batch's records are read on the driver; every decision is computed there,
against what the checker keeps in memory (:mod:`.state`), and only then are the
tables written, each in one idempotent delta-rs append. A crash between
two writes is repaired by Spark replaying the batch: the state is rebuilt as earlier
batches left the tables, the decisions come out the same, and the writes already
made are skipped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields, replace
from typing import Mapping, Optional

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker import CHECKER_NAME
from coordinator.checker.check import find_due
from coordinator.checker.context import (COMMITS_PER_BATCH, OFFSETS_PER_COMMIT, BatchContext, BatchRecords, grouped,
                                         shaped)
from coordinator.checker.delivery import as_undelivered, deliver, op_rows
from coordinator.checker.ingest import ingest_halves, refuse_unknown_kinds
from coordinator.checker.provenance import refuse_misattributed
from coordinator.checker.recover import recover_discarded
from coordinator.checker.refusals import rejection
from coordinator.checker.resolve import promote, resolve_ends
from coordinator.checker.segment import commits_read
from coordinator.checker.state import CheckerState, lookup_in_tables, pending_from_rows
from coordinator.checker.writer import files_written_at_us
from coordinator.config import CoordinatorConfig
from coordinator.control.instances import ProducerInstances, RefusedRecord
from coordinator.lakehouse import Lakehouse
from coordinator.protocol import Outcome
from coordinator.tables import (CHECK_REQUESTS, DISCARDED, GROUP_CHECK_REQUESTS, HALF, MESSAGE_CONTENT, OP, REJECTED,
                               UNDELIVERED)
from coordinator.tables import COMMITS_READ

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
    state: Optional[CheckerState] = None,
    shared_log: bool = False,
) -> Optional[BatchSummary]:
    """Process one micro-batch of commit-log records (plus heartbeat ticks).

    ``records`` are the batch's rows (:meth:`coordinator.checker.segment.Segment.records`).
    ``pending_from`` is the previous batch's ``BatchSummary.pending_from`` (0 looks through the
    whole half queue); ``state`` the checker's memory, kept between calls (a fresh one, the
    default, is built from the tables); ``shared_log`` replays a batch a checker of the one
    shared commit log announced (:mod:`.context`). Returns ``None`` for an empty batch.

    Example::

        state = CheckerState()
        run_batch(config, segment.records(lakehouse), batch_id=7, state=state)
    """
    started = time.monotonic()
    now_us = batch_clock(records)
    if now_us is None:
        return None
    state = state if state is not None else CheckerState()
    state.prepare(config, batch_id, pending_from, app_id)
    summary = _decide_and_write(BatchContext(config, batch_id, now_us, Lakehouse.of(config)),
                                BatchRecords.of(records, batch_id, shared_log), state, pending_from, shared_log)
    summary = replace(summary, duration_ms=int((time.monotonic() - started) * 1000))
    log.info("batch %d: %s", batch_id, ", ".join(f"{name}={getattr(summary, name)}" for name in _LOGGED))
    return summary


def _decide_and_write(ctx: BatchContext, all_records: BatchRecords, state: CheckerState,
                      pending_from: int, shared_log: bool) -> BatchSummary:
    state.invalidate()  # until every write below has landed: a batch that fails leaves the next one to rebuild
    records, misattributed = refuse_misattributed(all_records, state.layout)
    known, unsure = state.lookup(pc.unique(records.light.column("transaction_id")).drop_null().to_pylist())
    known.update(lookup_in_tables(ctx.config, ctx.batch_id, unsure))

    ingested = ingest_halves(ctx, records, known)
    resolved = resolve_ends(records, ingested.halves, state, known)
    resolved_in_batch = resolved.ids(in_batch=True)
    unresolved = ingested.halves.filter(pc.invert(pc.is_in(
        ingested.halves.column("transaction_id"), value_set=pa.array(resolved_in_batch, pa.string()))))
    state.add_pending(pending_from_rows(unresolved), unresolved, ctx.config)
    state.count_topics(pc.unique(ingested.halves.column("topic")).to_pylist())
    earlier_resolved = resolved.ids(in_batch=False)
    recovered = recover_discarded(ctx, resolved.to_recover)
    decided_ops = pa.concat_tables([_table(OP, resolved.ops, ctx.batch_id), _rows_table(OP, recovered.ops, ctx.batch_id)])
    deliveries = _deliveries(ctx, pa.concat_tables([promote(resolved, ingested.halves, state), recovered.deliveries]),
                             decided_ops, state)
    due = find_due(ctx, state, set(earlier_resolved))
    rejected = (misattributed + refuse_unknown_kinds(records) + ingested.rejections + resolved.rejections
                + recovered.rejections + _instance_rejections(due.refused_instances, ctx.now_us))

    lakehouse, writer, batch_id = ctx.lakehouse, state.writer, ctx.batch_id
    written = []

    def append(table, data: pa.Table, path: Optional[str] = None) -> Optional[int]:
        version = writer.append(path or lakehouse.path(table), data, batch_id,
                                create_as=table if table is GROUP_CHECK_REQUESTS else None)
        written.append(version is not None)
        return version

    # A committed message's op row comes after its topic row has landed, and after the record of its
    # withholding if it has not: a replay, a restart or a topic that cannot be written never leaves a
    # message resolved and undelivered (:mod:`.delivery`). A half precedes its op for readers' convenience.
    if ingested.halves.num_rows:
        append(HALF, ingested.halves)
    delivered = deliver(writer, lakehouse, batch_id, deliveries, state.undelivered)
    written.append(not delivered.replayed)
    if delivered.withheld_now.num_rows:
        append(UNDELIVERED, delivered.withheld_now)
    withheld = delivered.withheld_now.column("half_offset").combine_chunks()
    settled = delivered.landed.filter(pc.less(delivered.landed.column("batch_id"), batch_id))  # withheld till now
    ops = pa.concat_tables([decided_ops.filter(pc.invert(pc.is_in(decided_ops.column("half_offset"), value_set=withheld))),
                            _table(OP, op_rows(settled), batch_id), _rows_table(OP, due.discard_ops, batch_id)])
    if ops.num_rows:
        append(OP, ops)
    commit_to_visible_s = {topic: _seconds_since(rows.column("commit_timestamp"))
                           for topic, rows in _by_topic(delivered.written_now)}
    if due.discarded.num_rows:
        append(DISCARDED, _table(DISCARDED, due.discarded, batch_id))
    visible_at_us = None
    if due.checked:
        # Each group's requests to its own table first, then the checker's record of them without the
        # messages' content: a check counts as visible when the record is, never before its group's.
        requests = _table(CHECK_REQUESTS, due.requests, batch_id)
        for group in sorted(set(requests.column("producer_group").to_pylist())):
            append(GROUP_CHECK_REQUESTS, requests.filter(pc.equal(requests.column("producer_group"), group)),
                   lakehouse.check_requests(group))
        for name in MESSAGE_CONTENT:
            requests = requests.set_column(requests.schema.get_field_index(name), name,
                                           pa.nulls(requests.num_rows, requests.schema.field(name).type))
        version = append(CHECK_REQUESTS, requests)
        visible_at_us = None if version is None else files_written_at_us(lakehouse.path(CHECK_REQUESTS), version,
                                                                         lakehouse.storage)
    read = commits_read(all_records.table)  # every commit this batch read, with its digest (replayed: written once)
    if read.num_rows:
        append(COMMITS_READ, _table(COMMITS_READ, read, batch_id))
    if rejected:
        append(REJECTED, _rows_table(REJECTED, rejected, batch_id))
    if due.stale_instances or due.refused_instances:  # only now, and explicitly: deciding deleted nothing
        instances = ProducerInstances(lakehouse)
        for group in sorted(set(due.stale_instances) | set(due.refused_instances)):
            instances.forget(group, due.stale_instances.get(group, []), due.refused_instances.get(group, []))

    ended_by_topic = _ended_by_topic(resolved.ops, due.discarded, recovered.deliveries)
    withheld_here = ingested.halves.filter(pc.is_in(ingested.halves.column("queue_offset"), value_set=withheld))
    state.add_pending(pending_from_rows(withheld_here), withheld_here, ctx.config)
    state.resolve([*earlier_resolved, *due.given_up], withheld=set(withheld.to_pylist()))
    state.settle(settled)
    state.remember_resolved(zip(resolved_in_batch, resolved.groups(in_batch=True)))
    state.withhold(delivered.withheld)
    if visible_at_us is not None:
        state.checked([p.transaction_id for p in due.checked], visible_at_us, ctx.config)
    if all(written):
        state.next_batch_id = batch_id + 1
    # else: a replay found some of its writes made already; the next batch rebuilds from the tables.

    lowest = state.lowest_pending_offset()
    return BatchSummary(
        batch_id=batch_id,
        records=all_records.light.num_rows,
        halves=ingested.halves.num_rows,
        commits=resolved.count(Outcome.COMMIT) + len(recovered.transaction_ids),
        rollbacks=resolved.count(Outcome.ROLLBACK),
        resolved=ops.num_rows,
        delivered=delivered.written_now.num_rows,
        withheld=delivered.withheld.num_rows,
        checks=len(due.checked),
        discarded=due.discarded.num_rows,
        rejected=len(rejected),
        pending=state.pending_half_count,
        oldest_pending_stored_us=state.oldest_pending_stored_us(),
        check_answers=dict(resolved.check_answers),
        half_to_end_s=resolved.half_to_end_s,
        commit_to_visible_s=commit_to_visible_s,
        pending_by_topic=dict(state.pending_by_topic),
        withheld_by_topic={topic: rows.num_rows for topic, rows in _by_topic(delivered.withheld)},
        ended_by_topic=ended_by_topic,
        pending_from=lowest if lowest is not None else max(pending_from, _next_offset(all_records, batch_id, shared_log)),
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


def _deliveries(ctx: BatchContext, messages: pa.Table, ops: pa.Table, state: CheckerState) -> pa.Table:
    """The topic rows of the messages this batch commits (``messages``) with their op rows (``ops``), in
    ``system/undelivered``'s shape: what :func:`~.delivery.deliver` takes. A message withheld already (an
    operator's second COMMIT of a discarded transaction while the first waits for its topic) is left out:
    it is delivered once, as withheld."""
    new = as_undelivered(messages, ops, ctx.batch_id)
    return new.filter(pc.invert(pc.is_in(new.column("half_offset"), value_set=state.undelivered.column("half_offset"))))


def _by_topic(rows: pa.Table):
    """``rows`` by their ``topic`` column: (topic, rows) pairs, in topic order."""
    for topic in sorted(set(rows.column("topic").to_pylist())):
        yield topic, rows.filter(pc.equal(rows.column("topic"), topic))


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
