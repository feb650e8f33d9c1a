"""What every step of a checker batch shares: its id and clock, its records, their order, and row-to-table shaping.

**Sequence.** The commits a batch reads, from every commit log, are merged into one order
(:mod:`.segment`); a commit's *sequence* is ``batch_id * COMMITS_PER_BATCH + its rank`` in that
order, so sequences increase from batch to batch and a replayed batch gives the same ones. A half's
**queue offset** is ``sequence * OFFSETS_PER_COMMIT + its position in its commit``: unique,
increasing in the order the checker took the halves in, and the same on every replay. A batch
announced by a checker of the one shared commit log (before each group had its own) used that
log's version as the sequence, and is replayed so; ``txcoord upgrade`` starts the batch ids high
enough that every later sequence is higher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Union

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.config import CoordinatorConfig
from coordinator.exceptions import CheckerStateError
from coordinator.lakehouse import Lakehouse
from coordinator.tables import TableDef

__all__ = ["COMMITS_PER_BATCH", "OFFSETS_PER_COMMIT", "BatchContext", "BatchRecords", "by_topic", "grouped", "kept",
           "shaped"]

#: A batch reads fewer commits than this (``segment.MAX_VERSIONS_PER_BATCH``): see the module's docstring.
COMMITS_PER_BATCH = 1 << 11
#: A commit holds at most this many halves (the rest of a larger one is refused).
OFFSETS_PER_COMMIT = 1 << 20


@dataclass(frozen=True)
class BatchContext:
    """One micro-batch: its id, its clock, the configuration it runs with and the lakehouse
    that configuration names.

    ``now_us`` is read from the batch's own rows (heartbeat ticks and commit times),
    never from the wall clock, so a replayed batch decides exactly as the first run did.
    """

    config: CoordinatorConfig
    batch_id: int
    now_us: int
    lakehouse: Lakehouse


@dataclass(frozen=True)
class BatchRecords:
    """A batch's commit-log records (its clock tick set aside), as the steps read them.

    ``table`` holds every column; ``light`` the same records without the two heavy columns
    (``body``, ``born_timestamp``) and the commits' digests (``commit_sha256``, ``commit_bytes``),
    plus ``row`` (the index in ``table``), ``stored_us`` (``stored_timestamp`` in microseconds),
    ``body_size`` and ``sequence`` (the record's commit's place in the checker's order: see the
    module's docstring).
    """

    table: pa.Table
    light: pa.Table

    @classmethod
    def of(cls, collected: pa.Table, batch_id: int, shared_log: bool = False) -> "BatchRecords":
        """The records of a collected batch, ticks left out. ``shared_log``: the batch was announced by a
        checker of the one shared commit log, whose versions are its sequences.

        Example::

            BatchRecords.of(segment.records(lakehouse), batch_id=7).light.column("kind")  # ['HALF', ...]
        """
        ticks = pc.sum(collected.column("is_heartbeat")).as_py() or 0
        records = collected.num_rows - ticks
        # A segment's tick comes last (Segment.records): slicing it off copies nothing, where a filter copies
        # every column of thousands of chunks.
        table = (collected.slice(0, records) if pc.all(collected.column("is_heartbeat").slice(records)).as_py()
                 else collected.filter(pc.invert(collected.column("is_heartbeat"))))
        light = table.drop_columns(["body", "born_timestamp", "stored_timestamp", "is_heartbeat", "commit_sha256",
                                    "commit_bytes"])
        light = light.append_column("stored_us", table.column("stored_timestamp").cast(pa.int64()))
        light = light.append_column("body_size", pc.binary_length(table.column("body")))
        if (pc.max(table.column("commit_rank")).as_py() or 0) >= COMMITS_PER_BATCH:
            raise CheckerStateError(f"a batch reads fewer than {COMMITS_PER_BATCH} commits (segment.MAX_VERSIONS_PER_BATCH)")
        sequence = (table.column("commit_version") if shared_log else
                    pc.add(table.column("commit_rank"), batch_id * COMMITS_PER_BATCH))
        light = light.append_column("sequence", sequence)
        light = light.append_column("row", pa.array(range(table.num_rows), pa.int64()))
        return cls(table, light.combine_chunks())

    def without(self, refused: pa.Array) -> "BatchRecords":
        """The same records less those ``refused`` marks (a mask over ``light``)."""
        return BatchRecords(self.table, self.light.filter(pc.invert(refused)))


def shaped(table: TableDef, columns: Mapping[str, object], num_rows: int, batch_id: Optional[int]) -> pa.Table:
    """An Arrow table with exactly ``table``'s columns and types, stamped with ``batch_id``
    (``None``: ``columns`` holds it).

    ``columns`` maps names to Arrow arrays or Python lists (timestamps as epoch
    microseconds); a column it leaves out is null.

    Example::

        shaped(OP, {"half_offset": [3], "outcome": ["COMMIT"]}, 1, batch_id=7)
    """
    schema = table.arrow_schema()
    arrays = []
    for column in schema:
        value = columns.get(column.name)
        if column.name == "batch_id" and batch_id is not None:
            value = pa.repeat(pa.scalar(batch_id, column.type), num_rows)
        if value is None:
            arrays.append(pa.nulls(num_rows, column.type))
        elif isinstance(value, (pa.Array, pa.ChunkedArray)):
            arrays.append(value if value.type == column.type else value.cast(column.type))
        elif pa.types.is_timestamp(column.type):
            arrays.append(pa.array(value, pa.int64()).cast(column.type))
        else:
            arrays.append(pa.array(value, column.type))
    return pa.Table.from_arrays([_one_chunk(array) for array in arrays], schema=schema)


def _one_chunk(array: Union[pa.Array, pa.ChunkedArray]) -> pa.Array:
    """``array`` as one array: a chunked array of one chunk is that chunk, not a copy of it (combining copies
    even a single chunk: every message body of a backlog's batch, once per shaping)."""
    if isinstance(array, pa.Array):
        return array
    return array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()


def kept(table: pa.Table, mask: Union[pa.Array, pa.ChunkedArray]) -> pa.Table:
    """``table.filter(mask)``: the rows ``mask`` marks True (null: dropped); ``table`` itself, uncopied, when it
    keeps every row (a filter copies every row even then).

    Example::

        kept(halves, pc.is_null(reasons))
    """
    if mask.null_count == 0 and pc.all(mask).as_py():
        return table
    return table.filter(mask)


def by_topic(rows: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """``rows`` by their ``topic`` column: (topic, its rows) pairs, in topic order. Rows of one topic are
    given whole: filtering them would copy every row, message bodies and all.

    Example::

        {topic: rows.num_rows for topic, rows in by_topic(deliveries)}
    """
    topics = sorted(pc.unique(rows.column("topic")).to_pylist())
    if len(topics) == 1:
        yield topics[0], rows
        return
    for topic in topics:
        yield topic, rows.filter(pc.equal(rows.column("topic"), topic))


def grouped(table: pa.Table, keys) -> pa.TableGroupBy:
    """``table.group_by(keys)``, on one thread, which keeps the rows' order for ``first`` and ``last``.

    Acero's threads cost a fixed time per grouping, most of a small batch's (a dozen groupings), and gain
    nothing on two cores at a backlog batch's size (docs/performance-log.md#figures-quoted-elsewhere-before).

    Example::

        grouped(halves, "transaction_id").aggregate([("sequence", "min")])
    """
    return table.group_by(keys, use_threads=False)
