"""Reading the checker's memory back from its tables (:class:`~.memory.CheckerMemory`), and the other
reads of earlier batches' rows a batch's *gather* step makes.

The rebuild computes ``half ⋈̸ op`` (:mod:`.unresolved`) over only the unresolved part of the half queue
(``queue_offset >= pending_from``; the files' statistics leave out the rest), so it costs what the
pending set holds, whatever the history's size: with delta-rs on the driver, or by Spark where that
pays (a large range, a cluster). Every read takes only what batches before the one being prepared
wrote, so a replayed batch sees what its first run saw.

Example::

    memory = rebuild_memory(config, batch_id=7, pending_from=0)
    memory.pending_halves()
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Optional
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.checker.context import grouped, shaped
from coordinator.checker.memory import CheckerMemory, Known, tracked_transactions
from coordinator.checker.unresolved import rebuild_in_spark, spark_unresolved_halves, unresolved_halves
from coordinator.commit_logs import CommitLogs
from coordinator.config import CoordinatorConfig
from coordinator.exceptions import CheckerStateError
from coordinator.lakehouse import Lakehouse, table_dataset, transaction_ids_in
from coordinator.protocol import Outcome
from coordinator.tables import CHECK_REQUESTS, HALF, OP, UNDELIVERED

__all__ = ["CheckHistory", "check_history", "lookup_in_tables", "outstanding_deliveries", "rebuild_memory"]

log = logging.getLogger("coordinator.checker")


def rebuild_memory(config: CoordinatorConfig, batch_id: int, pending_from: int, spark=None) -> CheckerMemory:
    """The checker's memory as batches before ``batch_id`` left the tables, ready for that batch.
    ``spark``, if given, runs the anti-join where that pays (:func:`.unresolved.rebuild_in_spark`).

    Example::

        rebuild_memory(config, batch_id=7, pending_from=0).pending_half_count
    """
    lakehouse = Lakehouse.of(config)
    in_spark = spark is not None and rebuild_in_spark(config, spark, lakehouse, pending_from)
    pending_rows = spark_unresolved_halves(spark, lakehouse, pending_from, batch_id) if in_spark \
        else unresolved_halves(lakehouse, pending_from, batch_id)
    pending_rows = shaped(HALF, {name: pending_rows.column(name) for name in pending_rows.column_names},
                          pending_rows.num_rows, batch_id=None).sort_by("queue_offset")
    history = check_history(lakehouse, (pc.field("half_offset") >= pending_from) & (pc.field("batch_id") < batch_id))

    memory = CheckerMemory(next_batch_id=batch_id, layout=CommitLogs(lakehouse).layout(),
                           id_floor=_highest_transaction_id(lakehouse))
    transactions = tracked_transactions(pending_rows)
    for pending in transactions:
        checked = history.get(pending.transaction_id)
        if checked is not None:
            pending.checks, pending.last_check_us = checked.checks, checked.last_check_us
    memory.add_pending(transactions, pending_rows, config)
    memory.withhold(outstanding_deliveries(lakehouse, batch_id, pending_rows.column("queue_offset")))
    log.info("checker state rebuilt for batch %d: %d pending transactions (%d halves) from queue offset %d, "
             "the anti-join run by %s", batch_id, len(memory.pending), len(memory.rows), pending_from,
             "Spark" if in_spark else "the driver")
    return memory


def _read(lakehouse: Lakehouse, table, columns: Optional[list[str]] = None,
          filter: Optional[pc.Expression] = None) -> pa.Table:
    return table_dataset(lakehouse.path(table), lakehouse.storage)[1].to_table(columns=columns, filter=filter)


class CheckHistory(NamedTuple):
    """A transaction's check requests so far."""

    checks: int
    #: When the last one became visible (its file's ``modificationTime``, as the batch that wrote it
    #: recorded), in microseconds: what :mod:`coordinator.schedule` times the next check from.
    last_check_us: int
    #: The producer instance the last one went to (``None``: any instance of the group).
    addressed_to: Optional[str]


def check_history(lakehouse: Lakehouse, filter: pc.Expression) -> dict[str, CheckHistory]:
    """Per transaction, its :class:`CheckHistory`. ``filter`` selects ``system/check_requests`` rows.

    Example::

        check_history(lakehouse, pc.field("half_offset") >= 0)["txn-1"].checks  # 2
    """
    columns = ["transaction_id", "check_times", "producer_instance"]
    delta, dataset = table_dataset(lakehouse.path(CHECK_REQUESTS), lakehouse.storage, columns=columns)
    actions = pa.table(delta.get_add_actions(flatten=True))
    written_ms = dict(zip((unquote(p) for p in actions.column("path").to_pylist()),
                          actions.column("modification_time").cast(pa.int64()).to_pylist()))
    requests = []
    for fragment in dataset.get_fragments(filter=filter):
        rows = fragment.to_table(columns=columns, filter=filter)
        visible_us = pa.scalar(written_ms[unquote(fragment.path)] * 1000, pa.int64())
        requests.append(rows.append_column("visible_us", pa.repeat(visible_us, rows.num_rows)))
    if not requests:
        return {}
    # In order of check_times: each transaction's last request is the one its group's "last" picks.
    history = grouped(pa.concat_tables(requests).sort_by("check_times"), "transaction_id").aggregate(
        [("visible_us", "count"), ("visible_us", "max"),
         ("producer_instance", "last", pc.ScalarAggregateOptions(skip_nulls=False))])
    return dict(zip(history.column("transaction_id").to_pylist(),
                    map(CheckHistory._make, zip(history.column("visible_us_count").to_pylist(),
                                                history.column("visible_us_max").to_pylist(),
                                                history.column("producer_instance_last").to_pylist()))))


def outstanding_deliveries(lakehouse: Lakehouse, before_batch: int, pending_offsets: pa.ChunkedArray) -> pa.Table:
    """The messages withheld from their topics (``system/undelivered`` rows, :mod:`.delivery`) by batches
    before ``before_batch`` and not delivered since: those of halves still pending (``pending_offsets``),
    and those of discarded transactions an operator committed that have no COMMIT op row yet.

    Example::

        outstanding_deliveries(lakehouse, 12, pending_rows.column("queue_offset")).column("topic")
    """
    if not lakehouse.exists(UNDELIVERED):  # a lakehouse made before the table was: the first withholding makes it
        return UNDELIVERED.arrow_schema().empty_table()
    rows = _read(lakehouse, UNDELIVERED, filter=pc.field("batch_id") < before_batch)
    pending = pc.is_in(rows.column("half_offset"), value_set=pending_offsets)
    others = rows.filter(pc.invert(pending))
    if others.num_rows:
        committed = _read(lakehouse, OP, ["half_offset"], pc.field("half_offset").isin(others.column("half_offset"))
                          & (pc.field("outcome") == Outcome.COMMIT.value) & (pc.field("batch_id") < before_batch))
        others = others.filter(pc.invert(pc.is_in(others.column("half_offset"), value_set=committed.column(0))))
    return pa.concat_tables([rows.filter(pending), others]).cast(UNDELIVERED.arrow_schema())


def _highest_transaction_id(lakehouse: Lakehouse) -> Optional[str]:
    """An upper bound of every transaction id in the half queue, from its files' statistics (a
    truncated maximum is rounded up); a file without one is read."""
    delta, dataset = table_dataset(lakehouse.path(HALF), lakehouse.storage)
    actions = pa.table(delta.get_add_actions(flatten=True))
    if not actions.num_rows:
        return None
    bounds = actions.column("max.transaction_id").to_pylist() if "max.transaction_id" in actions.column_names \
        else [None] * actions.num_rows
    unknown = {unquote(p) for p, bound in zip(actions.column("path").to_pylist(), bounds) if bound is None}
    for fragment in dataset.get_fragments():
        if unquote(fragment.path) in unknown:
            bounds.append(pc.max(fragment.to_table(columns=["transaction_id"]).column(0)).as_py())
    return max((bound for bound in bounds if bound is not None), default=None)


def lookup_in_tables(config: CoordinatorConfig, batch_id: int, transaction_ids: set[str]) -> dict[str, Known]:
    """Ids the memory could not answer for, looked up in ``system/half`` and ``system/op`` as earlier
    batches left them. Every one found is resolved (the pending set is complete).

    Filters on the ids' range first: ids are time-ordered, so the files' statistics leave out
    every file of other times.
    """
    if not transaction_ids:
        return {}
    wanted = transaction_ids_in(transaction_ids) & (pc.field("batch_id") < batch_id)
    lakehouse = Lakehouse.of(config)
    halves = _read(lakehouse, HALF, ["transaction_id", "producer_group"], wanted)
    resolved = set(_read(lakehouse, OP, ["transaction_id"], wanted).column(0).to_pylist())
    groups = dict(zip(halves.column(0).to_pylist(), halves.column(1).to_pylist()))
    missing = set(groups) - resolved
    if missing:
        raise CheckerStateError(f"checker state is inconsistent: unresolved transactions {sorted(missing)[:5]} are not in "
                           "the pending set; the batch fails and the state is rebuilt")
    return {transaction_id: Known(group, None) for transaction_id, group in groups.items()}
