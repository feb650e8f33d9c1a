"""What every step of a checker batch shares: its id and clock, its records, and row-to-table shaping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse
from coordinator.tables import TableDef

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

    ``table`` holds every column; ``rows`` the same records as dicts without the two
    heavy columns (``body``, ``born_timestamp``), plus ``row`` (the index in ``table``),
    ``stored_us`` (``stored_timestamp`` in microseconds) and ``body_size``.
    """

    table: pa.Table
    rows: list[dict]

    @classmethod
    def of(cls, collected: pa.Table) -> "BatchRecords":
        """The records of a collected batch, ticks left out.

        Example::

            BatchRecords.of(segment.records(commit_log)).rows[0]["kind"]  # 'HALF'
        """
        table = collected.filter(pc.invert(collected.column("is_heartbeat")))
        light = table.drop_columns(["body", "born_timestamp", "stored_timestamp", "is_heartbeat"])
        light = light.append_column("stored_us", table.column("stored_timestamp").cast(pa.int64()))
        light = light.append_column("body_size", pc.binary_length(table.column("body")))
        rows = light.to_pylist()
        for index, row in enumerate(rows):
            row["row"] = index
        return cls(table, rows)


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
            value = [batch_id] * num_rows
        if value is None:
            arrays.append(pa.nulls(num_rows, column.type))
        elif isinstance(value, (pa.Array, pa.ChunkedArray)):
            arrays.append(value if value.type == column.type else value.cast(column.type))
        elif pa.types.is_timestamp(column.type):
            arrays.append(pa.array(value, pa.int64()).cast(column.type))
        else:
            arrays.append(pa.array(value, column.type))
    arrays = [array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array for array in arrays]
    return pa.Table.from_arrays(arrays, schema=schema)
