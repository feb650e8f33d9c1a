"""Gather: every read a batch needs beyond its records, made before anything is decided
(docs/design.md#a-batchs-steps).

What earlier batches ingested of the batch's transaction ids that memory cannot answer for, what
they wrote of the transactions an operator's COMMIT names, and the producer instances of the
groups whose checks may fall due. The records themselves were read by the segment, each commit-log
version by itself (:mod:`.segment`: a log's hostile bytes cost that log alone). With these facts,
deciding is a function of the records, the memory and nothing else (:mod:`.batch`).

Example::

    facts = gather(ctx, records, memory)
    facts.known["txn-1"].producer_group
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker.context import BatchContext, BatchRecords
from coordinator.checker.memory import CheckerMemory, Known
from coordinator.checker.rebuild import lookup_in_tables
from coordinator.checker.recover import RecoveryFacts, operator_commit_targets, read_for_recovery
from coordinator.control.instances import GroupSurvey, ProducerInstances
from coordinator.protocol import RecordKind
from coordinator.validation import immunity_values

__all__ = ["Gathered", "gather"]


@dataclass(frozen=True)
class Gathered:
    """The facts a batch decides on, besides its records and the memory."""

    known: Mapping[str, Known]  # what earlier batches ingested under the batch's transaction ids
    recovery: RecoveryFacts  # what they wrote of the transactions operators' COMMITs name
    surveys: Mapping[str, GroupSurvey]  # producer group -> its instances' records, for the groups with checks due


def gather(ctx: BatchContext, records: BatchRecords, memory: CheckerMemory) -> Gathered:
    """Read what deciding batch ``ctx`` over ``records`` needs, against ``memory``.

    Example::

        gather(ctx, records, memory).surveys.keys()  # the groups that may be checked now
    """
    light = records.light
    known, unsure = memory.lookup(pc.unique(light.column("transaction_id")).drop_null().to_pylist())
    known.update(lookup_in_tables(ctx.config, ctx.batch_id, unsure))
    instances = ProducerInstances(ctx.lakehouse)
    surveys = {group: instances.survey(group) for group in sorted(_groups_with_checks_due(ctx, light, memory))}
    return Gathered(known, read_for_recovery(ctx, operator_commit_targets(light)), surveys)


def _groups_with_checks_due(ctx: BatchContext, light: pa.Table, memory: CheckerMemory) -> set[str]:
    """The groups a check may go to in this batch: of the pending transactions due by its clock, and of its
    own halves whose immunity has passed by then (some of which the batch may resolve or refuse)."""
    groups = {pending.producer_group for pending in memory.due(ctx.now_us, ctx.config)}
    halves = light.select(["properties", "stored_us", "producer_group"]).filter(
        pc.equal(light.column("kind"), RecordKind.HALF.value))  # only the columns judged: a filter copies each
    if halves.num_rows:
        written = immunity_values(halves.column("properties").combine_chunks())
        # Untrusted until ingest judges it: a value that is no small number counts as absent here.
        immunity_s = pc.if_else(pc.fill_null(pc.match_substring_regex(written, r"^[0-9]{1,9}$"), False),
                                written, pa.scalar(None, pa.string())).cast(pa.int64())
        immunity_us = pc.fill_null(pc.multiply(immunity_s, 1_000_000), ctx.config.transaction_timeout_ms * 1000)
        due = pc.less_equal(pc.add(halves.column("stored_us"), immunity_us), ctx.now_us)
        groups.update(halves.column("producer_group").filter(due).drop_null().to_pylist())
    return groups
