"""Refusing records: the first failed rule gives the reason, recorded in ``system/rejected``."""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from coordinator.tables import REJECTED

# Long hostile values are kept, shortened, so a refusal row stays readable and small.
_MAX_ECHOED_CHARS = 256


def first_failure(rules: Sequence[tuple[Column, str | Column]]) -> Column:
    """The reason of the first rule whose condition holds, or null when every rule passes.

    A null condition (from a null input) counts as a failure: bad input never slips through.

    Example::

        df.withColumn("reason", first_failure([(F.col("topic").isNull(), "missing topic")]))
    """
    reason = None
    for condition, why in reversed(rules):
        why = why if isinstance(why, Column) else F.lit(why)
        fails = F.coalesce(condition, F.lit(True))
        reason = F.when(fails, why) if reason is None else F.when(fails, why).otherwise(reason)
    return reason


def as_rejections(records: DataFrame) -> DataFrame:
    """Commit-log records with a ``reason`` column, shaped as ``system/rejected`` rows (minus ``batch_id``)."""
    columns = []
    for name, _ in REJECTED.columns:
        if name == "batch_id":
            continue
        column = F.col(name) if name in records.columns else F.lit(None)
        if name in ("record_id", "kind", "transaction_id", "producer_group", "msg_id", "topic", "state", "check_id"):
            column = F.substring(column.cast("string"), 1, _MAX_ECHOED_CHARS)
        columns.append(column.alias(name))
    return records.select(columns)
