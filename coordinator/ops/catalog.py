"""Every table of a lakehouse as a Spark SQL table, by one call.

:func:`register_tables` creates the database ``txn`` (by default) and one external
Delta table per lakehouse table, pointing at its directory: nothing is copied and
nothing is written to the tables. Topic tables are named ``topic_<topic in lower
case>``, any character other than a letter, digit or ``_`` becoming ``_``; system
tables keep their names. Being real Delta tables, they support time travel and
streaming reads::

    register_tables(spark, "lakehouse")
    spark.sql("SELECT keys, body FROM txn.topic_order_topic").show()
    spark.sql("SELECT count(*) FROM txn.topic_order_topic VERSION AS OF 1").show()
    spark.readStream.table("txn.topic_order_topic")
    spark.sql("SELECT reason, count(*) FROM txn.rejected GROUP BY reason").show()

Beside the tables, the view ``txn.pending``: the halves with no outcome yet, ``half ⋈̸ op`` on the
queue offset (:mod:`coordinator.checker.unresolved`, the rule the checker rebuilds its pending set
by)::

    spark.sql("SELECT producer_group, count(DISTINCT transaction_id) FROM txn.pending GROUP BY 1").show()

Call it again to pick up topics that appeared since; it replaces nothing.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Union

from coordinator.checker.unresolved import unresolved_halves_sql
from coordinator.exceptions import InvalidArgumentError
from coordinator.lakehouse import Lakehouse, topic_names
from coordinator.tables import SYSTEM_TABLES

__all__ = ["DEFAULT_DATABASE", "PENDING_VIEW", "lakehouse_tables", "register_tables", "topic_table_name"]

DEFAULT_DATABASE = "txn"
#: The view of the unresolved halves, beside the tables.
PENDING_VIEW = "pending"


def topic_table_name(topic: str) -> str:
    """The SQL name of ``topic``'s table.

    Example::

        topic_table_name("ORDER_TOPIC")  # 'topic_order_topic'
        topic_table_name("a%b|c-d")      # 'topic_a_b_c_d'
    """
    return "topic_" + re.sub(r"[^a-z0-9_]", "_", topic.lower())


def lakehouse_tables(lakehouse: Union[str, Lakehouse]) -> dict[str, str]:
    """The SQL name and path of every Delta table in ``lakehouse``: system tables, then topics.

    Raises ``ValueError`` if two topics map to the same name (``A-B`` and ``A_B``).

    Example::

        lakehouse_tables("lakehouse")["topic_order_topic"]  # '/…/lakehouse/topics/ORDER_TOPIC'
    """
    lakehouse = Lakehouse.at(lakehouse)
    tables = {table.name.split("/")[-1]: lakehouse.path(table) for table in SYSTEM_TABLES if lakehouse.exists(table)}
    for topic in topic_names(lakehouse):
        name = topic_table_name(topic)
        if name in tables:
            raise InvalidArgumentError(f"topics {topic!r} and {os.path.basename(tables[name])!r} both map to the SQL name {name}")
        tables[name] = lakehouse.topic(topic)
    return tables


def register_tables(spark, lakehouse: Union[str, Lakehouse], database: str = DEFAULT_DATABASE) -> dict[str, str]:
    """Register every table of ``lakehouse`` in ``database`` (created if needed), and the view
    ``pending`` (:data:`PENDING_VIEW`) over its half and op queues; return the tables' ``{name: path}``.

    The database lives in Spark's session catalog; its own directory is a fresh
    temporary one, so dropping it never touches the lakehouse.

    ``lakehouse`` is a location or a :class:`~coordinator.lakehouse.Lakehouse` (one on object storage:
    its Spark session needs :func:`~coordinator.spark.lakehouse_spark`'s settings).

    Example::

        register_tables(spark, "demo-lakehouse")
        spark.sql("SHOW TABLES IN txn").show()
        spark.table("txn.pending").count()
    """
    if not spark.catalog.databaseExists(database):
        spark.sql(f"CREATE DATABASE {database} LOCATION '{tempfile.mkdtemp(prefix=f'txcoord-{database}-')}'")
    tables = lakehouse_tables(lakehouse)
    for name, path in tables.items():
        spark.sql(f"CREATE TABLE IF NOT EXISTS {database}.{name} USING delta LOCATION '{_sql_string(path)}'")
    if {"half", "op"} <= set(tables):
        spark.sql(f"CREATE VIEW IF NOT EXISTS {database}.{PENDING_VIEW} AS "
                  + unresolved_halves_sql(f"{database}.half", f"{database}.op"))
    return tables


def _sql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")
