"""What the checker keeps in memory between batches, as RocketMQ keeps its op map.

A batch reads from Delta only the commit-log versions it covers (and what its *gather* step
looks up); everything else it needs is here:

* the **pending set**: every unresolved transaction, with its halves' full rows (the
  bodies its check requests, discards and deliveries carry), its check count and when
  its last check became visible;
* the **recently resolved** transactions' producer groups, so a late END is judged
  without a read;
* an **id floor**: every transaction id ever ingested that sorts above it is in one of
  the two. Producers' ids are time-ordered, so a new half's id is nearly always above
  it; only an id at or below it (an old transaction's late END, a replayed duplicate) is
  looked up in Delta;
* the messages **withheld** from a topic that could not be written (:mod:`.delivery`).

The memory is a pure function of the checker's tables as earlier batches left them: it is
rebuilt from them (:mod:`.rebuild`) at start, after a failed batch, and whenever a batch arrives
that is not the next one (a replay), so a replayed batch decides exactly as its first run.
Nothing here reads or writes storage: a batch's *decide* step reads the memory, its *apply* step
changes it once the batch's writes have landed (:mod:`.batch`).

Example::

    memory = CheckerMemory()
    memory.add_pending(tracked_transactions(halves), halves, config)
    memory.pending_halves()                                      # halves with no op row
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Collection, Iterable, Optional

import pyarrow as pa
import pyarrow.compute as pc

from coordinator import schedule
from coordinator.checker.context import OFFSETS_PER_COMMIT, grouped
from coordinator.commit_logs import Layout
from coordinator.config import CoordinatorConfig
from coordinator.tables import HALF, UNDELIVERED

__all__ = ["CheckerMemory", "HalfRows", "Known", "RESOLVED_REMEMBERED", "TrackedTransaction", "tracked_transactions",
           "transaction_bounds"]

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
class CheckerMemory:
    """The checker's memory between batches (see the module's docstring).

    ``next_batch_id`` is the batch it is ready for; ``None``: not built, or a batch's writes did not all
    land (a replay, a failure), and the next batch rebuilds it (:func:`.rebuild.rebuild_memory`).
    """

    next_batch_id: Optional[int] = None
    pending: dict[str, TrackedTransaction] = field(default_factory=dict)
    rows: HalfRows = field(default_factory=HalfRows)
    resolved: "OrderedDict[str, str]" = field(default_factory=OrderedDict)  # id -> producer group
    id_floor: Optional[str] = None
    _due: list = field(default_factory=list)  # heap of (next step's batch clock, transaction id)
    pending_by_topic: Counter = field(default_factory=Counter)  # pending halves per topic
    #: Committed messages whose topic has not taken them yet, ``system/undelivered``'s rows (:mod:`.delivery`).
    undelivered: pa.Table = field(default_factory=lambda: UNDELIVERED.arrow_schema().empty_table())
    #: The lakehouse's layout, read when the state is built: only ``txcoord upgrade`` changes it, and only
    #: while no checker runs.
    layout: Layout = field(default_factory=Layout)

    def invalidate(self) -> None:
        """Forget everything: the next batch rebuilds (after a failed batch, or a replayed write)."""
        self.next_batch_id = None

    # --- what a batch asks -------------------------------------------------------------------

    def lookup(self, transaction_ids: Iterable[str]) -> tuple[dict[str, Known], set[str]]:
        """What is known of ``transaction_ids``: ``(known, unsure)``, where ``unsure`` holds the ids
        at or below the id floor that memory cannot answer for (:func:`.rebuild.lookup_in_tables`).
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
        """The pending transactions whose next check or expiry has come by ``now_us``, in queue order.
        Reads only the heap's entries due by then (a parent is never later than its children), and changes
        nothing: :meth:`advance_due` does, once the batch that took them has written."""
        found, stack = {}, [0] if self._due else []
        while stack:
            at = stack.pop()
            event, transaction_id = self._due[at]
            if event > now_us:
                continue
            stack.extend(child for child in (2 * at + 1, 2 * at + 2) if child < len(self._due))
            pending = self.pending.get(transaction_id)
            if pending is not None and pending.withheld is None and pending.next_step_at(config) <= now_us:
                found[transaction_id] = pending  # withheld: committed, nothing is due but its delivery
        return sorted(found.values(), key=lambda p: p.offsets[0])

    def advance_due(self, now_us: int, config: CoordinatorConfig) -> None:
        """Drop the heap's entries due by ``now_us`` (the batch has taken them: :meth:`checked` times their next
        step), keeping those whose next step moved later."""
        later = []
        while self._due and self._due[0][0] <= now_us:
            _, transaction_id = heapq.heappop(self._due)
            pending = self.pending.get(transaction_id)
            if pending is not None and pending.withheld is None and pending.next_step_at(config) > now_us:
                later.append((pending.next_step_at(config), transaction_id))
        for entry in later:
            heapq.heappush(self._due, entry)

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

    def retire(self, transaction_ids: Iterable[str], withheld: Collection[int] = ()) -> None:
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
                self.retire([transaction_id], withheld=set(pending.offsets) - offsets)

    def remember_resolved(self, transactions: Iterable[tuple[str, str]]) -> None:
        """Remember the groups of these resolved transactions (id, group), to judge their late ENDs; only the
        latest :data:`RESOLVED_REMEMBERED` are kept, the id floor rising past those forgotten."""
        self.resolved.update(transactions)
        while len(self.resolved) > RESOLVED_REMEMBERED:
            forgotten, _ = self.resolved.popitem(last=False)
            if self.id_floor is None or forgotten > self.id_floor:
                self.id_floor = forgotten


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


def tracked_transactions(halves: pa.Table) -> list[TrackedTransaction]:
    """One :class:`TrackedTransaction` per transaction in ``halves`` (accepted half rows, all of
    each transaction's messages), in the order of their first rows.

    Example::

        tracked_transactions(new_halves)[0].offsets  # [queue offsets, first message first]
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
