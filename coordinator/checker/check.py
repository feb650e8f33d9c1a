"""Check, a step of a batch's *decide* phase (docs/design.md#a-batchs-steps): find unresolved halves
that are due, ask their producer group, or give up.

The pending set is the half queue less the op queue, kept in memory (:mod:`.memory`), plus the
halves this batch leaves unresolved: nothing is joined here; only the transactions due by the batch's
clock are read from the memory's heap (without popping it: the *apply* phase does). When to check a transaction and when to give up is
:mod:`coordinator.schedule`'s rule; a discard counts as resolved (an op row with
outcome ``DISCARD``). Each check is addressed to one
live instance of the group (:mod:`coordinator.control.instances`), or to any of them
when none is known, from the instances' records the batch's gather step read; the stale ones
among them, and the files refused as records, are returned (``Due.stale_instances``,
``Due.refused_instances``) for the batch to record and remove once its tables are written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker.context import BatchContext
from coordinator.checker.memory import CheckerMemory, TrackedTransaction
from coordinator.control.instances import GroupSurvey, ProducerInstance, ProducerInstances, RefusedRecord
from coordinator.protocol import Outcome
from coordinator.schedule import DISCARD, check_or_discard
from coordinator.tables import MESSAGE_FIELDS

@dataclass(frozen=True)
class Due:
    """What the check step decided."""

    checked: list[TrackedTransaction]  # one check request each
    given_up: dict[str, str]  # transaction id -> why it is discarded
    requests: pa.Table  # check_requests rows (less batch_id)
    discarded: pa.Table  # discarded rows (less batch_id), one per message
    discard_ops: list[dict]  # the op rows of the discarded halves
    stale_instances: dict[str, list[ProducerInstance]]  # producer group -> records to forget (none live)
    refused_instances: dict[str, list[RefusedRecord]]  # producer group -> files that are no records: to reject, forget


def find_due(ctx: BatchContext, memory: CheckerMemory, arriving: list[TrackedTransaction], arriving_rows: pa.Table,
             resolved_now: set[str], surveys: Mapping[str, GroupSurvey]) -> Due:
    """Decide, for every pending transaction whose time has come, whether to check it or discard it.

    Only transactions whose next check or expiry is due are looked at (a heap keyed by
    that time, so a batch where every pending transaction waits costs nothing), with the
    transactions this batch leaves unresolved (``arriving``, their halves' rows ``arriving_rows``).
    ``resolved_now`` are the transactions this batch's ENDs resolved; ``surveys`` each group's
    instances, as gathered.

    Example::

        due = find_due(ctx, memory, arriving, arriving_rows, set(resolved.outcomes), gathered.surveys)
        len(due.checked), due.given_up
    """
    config, now = ctx.config, ctx.now_us
    checked, given_up = [], {}
    candidates = memory.due(now, config) + [t for t in arriving if t.next_step_at(config) <= now]
    for pending in sorted(candidates, key=lambda p: p.offsets[0]):
        if pending.transaction_id in resolved_now:
            continue
        step = check_or_discard(config, now, pending.stored_us, pending.checks)
        if step.action == DISCARD:
            given_up[pending.transaction_id] = step.reason
        else:
            checked.append(pending)
    firsts = _rows(memory, arriving_rows, [p.offsets[0] for p in checked])
    requests = firsts.select(list(MESSAGE_FIELDS))
    live = {group: survey.live for group, survey in surveys.items()}
    for name, values in (
        ("check_id", [f"{p.transaction_id}-{p.checks + 1}" for p in checked]),
        ("transaction_id", [p.transaction_id for p in checked]),
        ("producer_group", [p.producer_group for p in checked]),
        ("check_times", pa.array([p.checks + 1 for p in checked], pa.int32())),
        ("requested_at", [now] * len(checked)),
        ("half_offset", [p.offsets[0] for p in checked]),
        ("producer_instance", pa.array([ProducerInstances.address(p.producer_group, live.get(p.producer_group, []),
                                                                  p.transaction_id, p.checks + 1) for p in checked],
                                       pa.string())),
    ):
        requests = requests.append_column(name, pa.array(values) if isinstance(values, list) else values)
    gone = [candidate for candidate in candidates if candidate.transaction_id in given_up]
    halves = _rows(memory, arriving_rows, [offset for p in gone for offset in p.offsets])
    by_id = {p.transaction_id: p for p in gone}
    ids = halves.column("transaction_id").to_pylist()
    discarded = halves.select(["transaction_id", "producer_group", *MESSAGE_FIELDS, "stored_timestamp"])
    for name, values in (
        ("half_offset", halves.column("queue_offset")),
        ("check_times", pa.array([by_id[i].checks for i in ids], pa.int32())),
        ("reason", pa.array([given_up[i] for i in ids], pa.string())),
        ("discarded_at", pa.array([now] * len(ids), pa.int64())),
    ):
        discarded = discarded.append_column(name, values)
    discard_ops = [dict(half_offset=offset, transaction_id=p.transaction_id, producer_group=p.producer_group,
                        outcome=Outcome.DISCARD, resolved_at=now, end_record_id=None, check_id=None)
                   for p in gone for offset in p.offsets]
    stale = {group: survey.stale for group, survey in surveys.items() if survey.stale}
    refused = {group: survey.refused for group, survey in surveys.items() if survey.refused}
    return Due(checked, given_up, requests, discarded, discard_ops, stale, refused)


def _rows(memory: CheckerMemory, arriving_rows: pa.Table, offsets: list[int]) -> pa.Table:
    """The half rows of ``offsets``, in queue order: from memory, or among this batch's arriving halves."""
    arriving = pc.is_in(pa.array(offsets, pa.int64()), value_set=arriving_rows.column("queue_offset"))
    here = {offset for offset, new in zip(offsets, arriving.to_pylist()) if new}
    if not here:
        return memory.rows.take(offsets)
    earlier = memory.rows.take(offset for offset in offsets if offset not in here)
    taken = arriving_rows.filter(pc.is_in(arriving_rows.column("queue_offset"), value_set=pa.array(sorted(here), pa.int64())))
    return pa.concat_tables([earlier, taken]).sort_by("queue_offset")
