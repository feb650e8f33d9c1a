"""The unresolved halves: ``half ⋈̸ op`` on the queue offset, the one rule of what is pending.

A half is unresolved while no op row names its queue offset (``op.half_offset``). The rule has
three forms, all here:

* :func:`unresolved_halves`, with delta-rs on the caller (no JVM): ``txcoord pending``, and a
  checker rebuilding a small pending set;
* :func:`spark_unresolved_halves`, the same anti-join run by Spark: a checker rebuilding a large
  pending set (at start, after a failed batch, after a replay) uses its cluster, not its driver;
* :func:`unresolved_halves_sql`, its SQL, which :func:`coordinator.ops.catalog.register_tables`
  registers for analysts as the view ``txn.pending``.

Each reads only from ``from_offset`` up (the files' statistics leave out everything below), and,
for a checker rebuilding before batch ``before_batch``, only what earlier batches wrote. The checker
keeps the set current between rebuilds itself, batch by batch, in memory (:mod:`.memory`).

Example::

    unresolved_halves(Lakehouse("lakehouse"), from_offset=0).num_rows
    spark.sql(unresolved_halves_sql("txn.half", "txn.op")).count()
"""

from __future__ import annotations

from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.config import CoordinatorConfig
from coordinator.lakehouse import Lakehouse
from coordinator.tables import HALF, OP

__all__ = ["SPARK_REBUILD_MIN_ROWS", "rebuild_in_spark", "spark_unresolved_halves", "unresolved_halves",
           "unresolved_halves_sql", "unresolved_range_rows"]

#: From how many half rows in the unresolved range a checker on a cluster rebuilds in Spark (``auto``).
#: Below it Spark's fixed cost dominates: on one machine the driver was faster than Spark, warm or cold, at
#: every size measured (docs/performance-log.md#figures-quoted-elsewhere-before). Spark pays where executors add
#: cores the driver does not have, on a range large enough to spread.
SPARK_REBUILD_MIN_ROWS = 1_000_000


def unresolved_halves(lakehouse: Lakehouse, from_offset: int = 0, before_batch: Optional[int] = None,
                      columns: Optional[list[str]] = None) -> pa.Table:
    """``columns`` (default: all) of the halves at or above queue offset ``from_offset`` with no op row,
    as batches before ``before_batch`` (if given) left the tables; read with delta-rs, in no set order.

    Example::

        unresolved_halves(Lakehouse("lakehouse"), 0, columns=["transaction_id"]).num_rows
    """
    columns = columns or HALF.column_names
    halves = lakehouse.read(HALF, list(dict.fromkeys([*columns, "queue_offset"])),
                            _written_before(pc.field("queue_offset") >= from_offset, before_batch),
                            files=f"queue_offset >= {int(from_offset)}")
    resolved = lakehouse.read(OP, ["half_offset"], _written_before(pc.field("half_offset") >= from_offset, before_batch),
                              files=f"half_offset >= {int(from_offset)}")
    unresolved = pc.invert(pc.is_in(halves.column("queue_offset"), value_set=resolved.column("half_offset")))
    return halves.filter(unresolved).select(columns)


def unresolved_halves_sql(half: str, op: str, from_offset: Optional[int] = None,
                          before_batch: Optional[int] = None) -> str:
    """The SQL of the anti-join over the tables named ``half`` and ``op`` (``txn.half``, or
    ``delta.`/path```): every column of the unresolved halves, from ``from_offset`` and before batch
    ``before_batch`` if given.

    Example::

        unresolved_halves_sql("txn.half", "txn.op")
        # 'SELECT half.* FROM txn.half AS half LEFT ANTI JOIN (SELECT half_offset FROM txn.op) AS op ...'
    """
    def where(offset_column: str) -> str:
        conditions = ([f"{offset_column} >= {int(from_offset)}"] if from_offset is not None else []) + \
                     ([f"batch_id < {int(before_batch)}"] if before_batch is not None else [])
        return f" WHERE {' AND '.join(conditions)}" if conditions else ""

    return (f"SELECT half.* FROM (SELECT * FROM {half}{where('queue_offset')}) AS half "
            f"LEFT ANTI JOIN (SELECT half_offset FROM {op}{where('half_offset')}) AS op "
            "ON half.queue_offset = op.half_offset")


def spark_unresolved_halves(spark, lakehouse: Lakehouse, from_offset: int = 0,
                            before_batch: Optional[int] = None) -> pa.Table:
    """:func:`unresolved_halves` (every column), computed by ``spark`` (a session that reaches the
    lakehouse: :func:`coordinator.spark.lakehouse_spark`) and collected as Arrow.

    Example::

        spark_unresolved_halves(spark, Lakehouse("lakehouse"), from_offset=1_000).num_rows
    """
    def table(path: str) -> str:
        return "delta.`" + path.replace("`", "``") + "`"

    query = unresolved_halves_sql(table(lakehouse.path(HALF)), table(lakehouse.path(OP)), from_offset, before_batch)
    return spark.sql(query).toArrow()


def unresolved_range_rows(lakehouse: Lakehouse, from_offset: int) -> int:
    """How many half rows lie at or above ``from_offset`` (from the files' statistics, without reading
    them: an upper bound of what a rebuild reads). What decides where the anti-join runs.

    Example::

        unresolved_range_rows(Lakehouse("lakehouse"), 0)  # every half row
    """
    actions = pa.table(lakehouse.table(HALF).get_add_actions(flatten=True))
    if not actions.num_rows:
        return 0
    highest = actions.column("max.queue_offset") if "max.queue_offset" in actions.column_names else None
    counts = actions.column("num_records")
    if highest is None:
        return pc.sum(counts).as_py() or 0
    in_range = pc.fill_null(pc.greater_equal(highest, from_offset), True)  # a file without statistics counts
    return pc.sum(pc.filter(counts, in_range)).as_py() or 0


def rebuild_in_spark(config: CoordinatorConfig, spark, lakehouse: Lakehouse, from_offset: int) -> bool:
    """Whether a checker rebuilding its pending set from ``from_offset`` runs the anti-join in ``spark``:
    ``config.rebuild_in_spark`` is ``always``, ``never``, or ``auto`` (the default): when Spark runs on a
    cluster (its master is not ``local``) and the range holds at least :data:`SPARK_REBUILD_MIN_ROWS`
    half rows.

    Example::

        rebuild_in_spark(config.replace(rebuild_in_spark="always"), spark, lakehouse, 0)  # True
    """
    if config.rebuild_in_spark != "auto":
        return config.rebuild_in_spark == "always"
    on_cluster = not spark.sparkContext.master.startswith("local")
    return on_cluster and unresolved_range_rows(lakehouse, from_offset) >= SPARK_REBUILD_MIN_ROWS


def _written_before(condition: pc.Expression, before_batch: Optional[int]) -> pc.Expression:
    return condition if before_batch is None else condition & (pc.field("batch_id") < before_batch)
