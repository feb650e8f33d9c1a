"""What the checker keeps in memory between batches, as RocketMQ keeps its op map.

A batch reads from Delta only the commit-log versions it covers; everything else it
needs is here:

* the **pending set**: every unresolved transaction, with its halves' full rows (the
  bodies its check requests, discards and deliveries carry), its check count and when
  its last check became visible;
* the **recently resolved** transactions' producer groups, so a late END is judged
  without a read;
* an **id floor**: every transaction id ever ingested that sorts above it is in one of
  the two. Producers' ids are time-ordered, so a new half's id is nearly always above
  it; only an id at or below it (an old transaction's late END, a replayed duplicate) is
  looked up in Delta.

The state is a pure function of the checker's tables as earlier batches left them: it
is rebuilt from them at start, after a failed batch, and whenever a batch arrives that
is not the next one (a replay), so a replayed batch decides exactly as its first run.
The rebuild computes ``half ⋈̸ op`` (:mod:`.unresolved`) over only the unresolved part of
the half queue (``queue_offset >= pending_from``; the files' statistics leave out the rest),
so it costs what the pending set holds, whatever the history's size: with delta-rs on the
driver, or by Spark where that pays (a large range, a cluster).

Example::

    state = CheckerState()
    state.prepare(config, batch_id=7, pending_from=0, app_id="txcoord-checker")  # a fresh state: rebuilds
    state.pending_halves()                                      # halves with no op row
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Collection, Iterable, NamedTuple, Optional
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from coordinator import schedule
from coordinator.checker.context import OFFSETS_PER_COMMIT, grouped, shaped
from coordinator.checker.unresolved import rebuild_in_spark, spark_unresolved_halves, unresolved_halves
from coordinator.checker.writer import TableWriter
from coordinator.commit_logs import CommitLogs, Layout
from coordinator.config import CoordinatorConfig
from coordinator.exceptions import CheckerStateError
from coordinator.lakehouse import Lakehouse, table_dataset, transaction_ids_in
from coordinator.protocol import Outcome
from coordinator.tables import CHECK_REQUESTS, HALF, OP, UNDELIVERED

log = logging.getLogger("coordinator.checker")

#: Resolved transactions remembered for judging late ENDs; older ones are looked up in Delta.
RESOLVED_REMEMBERED = 200_000


@dataclass
class TrackedTransaction:
    """An unresolved transaction as the checker tracks it in memory: what judging its END and deciding its checks
    needs (the operators' view of a pending transaction is :class:`coordinator.ops.pending.PendingTransaction`)."""

    transaction_id: str
    producer_group: str
    offsets: list[int]  # its halves' queue offsets, first message first
    half_sequence: int  # the sequence of the commit its halves entered with (:mod:`.context`)
    stored_us: int  # when that version was committed
    immunity_ms: int  # its first message's: no check before stored_us + immunity
    own_end_until_us: int  # its producer's own COMMIT/ROLLBACK is accepted until then (latest immunity)
    topics: tuple[str, ...] = ()  # its halves' topics, in the order of ``offsets``
    checks: int = 0
    last_check_us: Optional[int] = None  # when its last check request became visible
    #: Why its delivery is withheld (:mod:`.delivery`): it is committed, its topic cannot be written yet, so it
    #: is never checked or discarded and takes no END. ``None``: not decided yet.
    withheld: Optional[str] = None

    def next_step_at(self, config: CoordinatorConfig) -> int:
        """The earliest batch clock at which this transaction needs a check or a discard (:mod:`coordinator.schedule`)."""
        return schedule.next_step_at(config, self.stored_us, self.immunity_ms, self.last_check_us)


@dataclass(frozen=True)
class Known:
    """What an earlier batch ingested under one transaction id."""

    producer_group: str
    pending: Optional[TrackedTransaction]  # ``None``: resolved


class HalfRows:
    """Full rows (``system/half``'s) of the pending halves, as Arrow tables in the order they were ingested.

    A table is dropped once none of its rows is pending, and compacted when most are resolved.
    """

    def __init__(self) -> None:
        self._tables: dict[int, pa.Table] = {}
        self._where: dict[int, tuple[int, int]] = {}  # queue offset -> (table key, row)
        self._live: dict[int, int] = {}  # table key -> pending rows in it
        self._next_key = 0

    def add(self, halves: pa.Table) -> None:
        if not halves.num_rows:
            return
        key, self._next_key = self._next_key, self._next_key + 1
        self._tables[key] = halves
        self._live[key] = halves.num_rows
        for row, offset in enumerate(halves.column("queue_offset").to_pylist()):
            self._where[offset] = (key, row)

    def take(self, offsets: Iterable[int]) -> pa.Table:
        """The rows of ``offsets`` (every one pending), grouped by the table that holds them."""
        by_table: dict[int, list[int]] = {}
        for offset in sorted(offsets):
            key, row = self._where[offset]
            by_table.setdefault(key, []).append(row)
        parts = [self._tables[key].take(pa.array(rows, pa.int64())) for key, rows in sorted(by_table.items())]
        return pa.concat_tables(parts) if parts else HALF.arrow_schema().empty_table()

    def remove(self, offsets: Iterable[int]) -> None:
        touched = set()
        for offset in offsets:
            key, _ = self._where.pop(offset)
            self._live[key] -= 1
            touched.add(key)
        for key in touched:
            live, table = self._live[key], self._tables[key]
            if live == 0:
                del self._tables[key], self._live[key]
            elif live * 2 < table.num_rows and table.num_rows > 64:
                self._compact(key)

    def _compact(self, key: int) -> None:
        table = self._tables.pop(key)
        del self._live[key]
        offsets = table.column("queue_offset").to_pylist()
        self.add(table.take([row for row, offset in enumerate(offsets) if self._where.get(offset) == (key, row)]))

    def __len__(self) -> int:
        return len(self._where)


@dataclass
class CheckerState:
    """The checker's memory between batches (see the module's docstring).

    ``next_batch_id`` is the batch it is ready for; ``None`` until built.
    """

    next_batch_id: Optional[int] = None
    pending: dict[str, TrackedTransaction] = field(default_factory=dict)
    rows: HalfRows = field(default_factory=HalfRows)
    resolved: "OrderedDict[str, str]" = field(default_factory=OrderedDict)  # id -> producer group
    id_floor: Optional[str] = None
    writer: Optional[TableWriter] = None  # the batch's writes; what it knows of them is state too
    _due: list = field(default_factory=list)  # heap of (next step's batch clock, transaction id)
    pending_by_topic: Counter = field(default_factory=Counter)  # pending halves per topic
    #: Committed messages whose topic has not taken them yet, ``system/undelivered``'s rows (:mod:`.delivery`).
    undelivered: pa.Table = field(default_factory=lambda: UNDELIVERED.arrow_schema().empty_table())
    #: The lakehouse's layout, read when the state is built: only ``txcoord upgrade`` changes it, and only
    #: while no checker runs.
    layout: Layout = field(default_factory=Layout)
    #: The checker's Spark session: a rebuild runs its anti-join there where that pays
    #: (:func:`.unresolved.rebuild_in_spark`); without one, always on the driver.
    spark: Optional[object] = field(default=None, repr=False)

    def prepare(self, config: CoordinatorConfig, batch_id: int, pending_from: int, app_id: str) -> bool:
        """Make the state ready for batch ``batch_id``, rebuilding it from the tables unless it
        already is; return whether it was rebuilt."""
        if self.next_batch_id == batch_id and self.writer is not None and self.writer.app_id == app_id:
            return False
        self._rebuild(config, batch_id, pending_from)
        if self.writer is not None:
            self.writer.close()
        self.writer = TableWriter(app_id, Lakehouse.of(config).storage)
        return True

    def invalidate(self) -> None:
        """Forget everything: the next batch rebuilds (after a failed batch, or a replayed write)."""
        self.next_batch_id = None

    # --- what a batch asks -------------------------------------------------------------------

    def lookup(self, transaction_ids: Iterable[str]) -> tuple[dict[str, Known], set[str]]:
        """What is known of ``transaction_ids``: ``(known, unsure)``, where ``unsure`` holds the ids
        at or below the id floor that memory cannot answer for (see :func:`lookup_in_tables`).
        An id in neither was never ingested."""
        known, unsure = {}, set()
        for transaction_id in transaction_ids:
            if transaction_id in self.pending:
                pending = self.pending[transaction_id]
                known[transaction_id] = Known(pending.producer_group, pending)
            elif transaction_id in self.resolved:
                known[transaction_id] = Known(self.resolved[transaction_id], None)
            elif self.id_floor is not None and transaction_id <= self.id_floor:
                unsure.add(transaction_id)
        return known, unsure

    def due(self, now_us: int, config: CoordinatorConfig) -> list[TrackedTransaction]:
        """The pending transactions whose next check or expiry has come by ``now_us``."""
        found = {}
        later = []
        while self._due and self._due[0][0] <= now_us:
            _, transaction_id = heapq.heappop(self._due)
            pending = self.pending.get(transaction_id)
            if pending is None or pending.withheld is not None or transaction_id in found:
                continue  # withheld: committed, nothing is due but its delivery
            event = pending.next_step_at(config)
            if event <= now_us:
                found[transaction_id] = pending
            else:
                later.append((event, transaction_id))
        for entry in later:
            heapq.heappush(self._due, entry)
        return list(found.values())

    @property
    def pending_half_count(self) -> int:
        return len(self.rows)

    def pending_halves(self) -> pa.Table:
        """The full ``system/half`` rows of every pending half, by queue offset: what the view
        ``txn.pending`` shows, as this memory holds it."""
        offsets = (offset for pending in self.pending.values() for offset in pending.offsets)
        return self.rows.take(offsets).sort_by("queue_offset")  # take groups them by the table holding them

    def oldest_pending_stored_us(self) -> Optional[int]:
        """When the oldest pending transaction's half was stored."""
        first = self._first_pending()
        return None if first is None else first.stored_us

    def lowest_pending_offset(self) -> Optional[int]:
        first = self._first_pending()
        return None if first is None else min(first.offsets)

    def _first_pending(self) -> Optional[TrackedTransaction]:
        # ``pending`` is filled in queue-offset order: its first transaction holds the lowest, and is the oldest.
        return next(iter(self.pending.values()), None)

    # --- what a batch changes (only once all its writes have landed) ------------------------

    def add_pending(self, transactions: Iterable[TrackedTransaction], rows: pa.Table, config: CoordinatorConfig) -> None:
        self.rows.add(rows)
        for pending in transactions:
            self.pending[pending.transaction_id] = pending
            self.pending_by_topic.update(pending.topics)
            heapq.heappush(self._due, (pending.next_step_at(config), pending.transaction_id))

    def count_topics(self, topics: Iterable[str]) -> None:
        """Report these topics' pending halves from now on, as 0 once none is (a topic whose transactions
        were all resolved in the batch that brought them still has its count)."""
        self.pending_by_topic.update(dict.fromkeys(topics, 0))

    def checked(self, transaction_ids: Iterable[str], visible_at_us: int, config: CoordinatorConfig) -> None:
        for transaction_id in transaction_ids:
            pending = self.pending[transaction_id]
            pending.checks += 1
            pending.last_check_us = visible_at_us
            heapq.heappush(self._due, (pending.next_step_at(config), transaction_id))

    def resolve(self, transaction_ids: Iterable[str], withheld: Collection[int] = ()) -> None:
        """Forget these pending transactions, resolved now, but for their groups (:meth:`remember_resolved`)
        and for their halves in ``withheld`` (queue offsets), which stay until delivered (:meth:`settle`)."""
        resolved = []
        for transaction_id in transaction_ids:
            pending = self.pending[transaction_id]
            kept = [(offset, topic) for offset, topic in zip(pending.offsets, pending.topics) if offset in withheld]
            done = [(offset, topic) for offset, topic in zip(pending.offsets, pending.topics) if offset not in withheld]
            self.rows.remove(offset for offset, _ in done)
            self.pending_by_topic.subtract(topic for _, topic in done)
            if kept:
                pending.offsets, pending.topics = [offset for offset, _ in kept], tuple(topic for _, topic in kept)
            else:
                del self.pending[transaction_id]
            resolved.append((transaction_id, pending.producer_group))
        self.remember_resolved(resolved)

    def withhold(self, undelivered: pa.Table) -> None:
        """Take ``undelivered`` (``system/undelivered`` rows) as every message withheld now: their pending
        transactions are marked with the reason; the rest of the withheld messages are settled."""
        self.undelivered = undelivered
        reasons = dict(zip(undelivered.column("transaction_id").to_pylist(), undelivered.column("reason").to_pylist()))
        for transaction_id, reason in reasons.items():
            pending = self.pending.get(transaction_id)
            if pending is not None:
                pending.withheld = reason or "withheld"

    def settle(self, delivered: pa.Table) -> None:
        """Withheld halves delivered at last (``system/undelivered`` rows): each transaction is resolved once
        none of its halves is left."""
        by_transaction: dict[str, set[int]] = {}
        for transaction_id, offset in zip(delivered.column("transaction_id").to_pylist(),
                                          delivered.column("half_offset").to_pylist()):
            by_transaction.setdefault(transaction_id, set()).add(offset)
        for transaction_id, offsets in by_transaction.items():
            pending = self.pending.get(transaction_id)
            if pending is not None:  # else a discarded transaction an operator committed: never pending again
                self.resolve([transaction_id], withheld=set(pending.offsets) - offsets)

    def remember_resolved(self, transactions: Iterable[tuple[str, str]]) -> None:
        """Remember the groups of these resolved transactions (id, group), to judge their late ENDs; only the
        latest :data:`RESOLVED_REMEMBERED` are kept, the id floor rising past those forgotten."""
        self.resolved.update(transactions)
        while len(self.resolved) > RESOLVED_REMEMBERED:
            forgotten, _ = self.resolved.popitem(last=False)
            if self.id_floor is None or forgotten > self.id_floor:
                self.id_floor = forgotten

    # --- rebuilding from the tables ----------------------------------------------------------

    def _rebuild(self, config: CoordinatorConfig, batch_id: int, pending_from: int) -> None:
        lakehouse = Lakehouse.of(config)
        in_spark = self.spark is not None and rebuild_in_spark(config, self.spark, lakehouse, pending_from)
        pending_rows = spark_unresolved_halves(self.spark, lakehouse, pending_from, batch_id) if in_spark \
            else unresolved_halves(lakehouse, pending_from, batch_id)
        pending_rows = shaped(HALF, {name: pending_rows.column(name) for name in pending_rows.column_names},
                              pending_rows.num_rows, batch_id=None).sort_by("queue_offset")
        history = check_history(lakehouse, (pc.field("half_offset") >= pending_from) & (pc.field("batch_id") < batch_id))

        self.next_batch_id = batch_id
        self.pending, self.rows, self.resolved, self._due = {}, HalfRows(), OrderedDict(), []
        self.pending_by_topic = Counter()
        self.layout = CommitLogs(lakehouse).layout()
        self.id_floor = _highest_transaction_id(lakehouse)
        transactions = pending_from_rows(pending_rows)
        for pending in transactions:
            checked = history.get(pending.transaction_id)
            if checked is not None:
                pending.checks, pending.last_check_us = checked.checks, checked.last_check_us
        self.add_pending(transactions, pending_rows, config)
        self.withhold(outstanding_deliveries(lakehouse, batch_id, pending_rows.column("queue_offset")))
        log.info("checker state rebuilt for batch %d: %d pending transactions (%d halves) from queue offset %d, "
                 "the anti-join run by %s", batch_id, len(self.pending), len(self.rows), pending_from,
                 "Spark" if in_spark else "the driver")


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


def transaction_bounds(halves: pa.Table) -> pa.Table:
    """Per transaction in ``halves`` (accepted half rows, all of each transaction's messages): its
    ``producer_group``, the ``half_sequence`` of the commit its halves entered with (:mod:`.context`),
    when they were stored (``stored_us``), and until when its producer's own COMMIT/ROLLBACK is accepted
    (``own_end_until_us``: stored time + its messages' latest immunity). What judging its END needs, in
    one place for the pending set and for the transactions a batch resolves as it ingests them.

    Example::

        transaction_bounds(new_halves).column("own_end_until_us")
    """
    columns = pa.table({"transaction_id": halves.column("transaction_id"),
                        "producer_group": halves.column("producer_group"), "queue_offset": halves.column("queue_offset"),
                        "stored_us": halves.column("stored_timestamp").cast(pa.int64()),
                        "immunity_ms": halves.column("immunity_ms").cast(pa.int64())})
    bounds = grouped(columns, "transaction_id").aggregate(
        [("producer_group", "min"), ("queue_offset", "max"), ("stored_us", "min"), ("immunity_ms", "max")])
    return pa.table({
        "transaction_id": bounds.column("transaction_id"),
        "producer_group": bounds.column("producer_group_min"),
        "half_sequence": pc.divide(bounds.column("queue_offset_max"), OFFSETS_PER_COMMIT),
        "stored_us": bounds.column("stored_us_min"),
        "own_end_until_us": pc.add(bounds.column("stored_us_min"), pc.multiply(bounds.column("immunity_ms_max"), 1000)),
    })


def pending_from_rows(halves: pa.Table) -> list[TrackedTransaction]:
    """One :class:`TrackedTransaction` per transaction in ``halves`` (accepted half rows, all of
    each transaction's messages), in the order of their first rows.

    Example::

        pending_from_rows(new_halves)[0].offsets  # [queue offsets, first message first]
    """
    columns = halves.select(["transaction_id", "queue_offset", "message_index", "immunity_ms", "topic"]).to_pydict()
    bounds = {row["transaction_id"]: row for row in transaction_bounds(halves).to_pylist()}
    messages: dict[str, list[tuple]] = {}
    for i, transaction_id in enumerate(columns["transaction_id"]):
        messages.setdefault(transaction_id, []).append(
            (columns["message_index"][i], columns["queue_offset"][i], i))
    result = []
    for transaction_id, parts in messages.items():
        parts.sort()
        first, bound = parts[0][2], bounds[transaction_id]
        result.append(TrackedTransaction(
            transaction_id=transaction_id,
            producer_group=bound["producer_group"],
            offsets=[offset for _, offset, _ in parts],
            half_sequence=bound["half_sequence"],
            stored_us=bound["stored_us"],
            immunity_ms=columns["immunity_ms"][first],
            own_end_until_us=bound["own_end_until_us"],
            topics=tuple(columns["topic"][i] for _, _, i in parts),
        ))
    return result


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
